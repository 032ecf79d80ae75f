"""lmprog's foundations, imported by every other package and importing none of them: errors,
SamplingParams, the backend protocol, chat templates, models and tokenizers, limits, logs."""
