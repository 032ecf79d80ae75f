"""Decoding shared by every backend that samples in lmprog (the runtime, llama.cpp): from one
step's next-token logits to the request's text, tokens and finish reason.

decode_state.py (DecodeState: one request's output side), batch_sampler.py (BatchSampler),
sampler.py (the batched sampler), arrays.py (numpy or torch), rng.py (seeded generators),
rejection.py (the speculative acceptance rule), detok.py, result.py (EngineResult).
Imports core and fsm only, never runtime or backends. Design: docs/design/sampling.md.
"""
