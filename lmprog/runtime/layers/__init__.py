"""Building blocks of the models: norms, rotary embedding, activations, attention backends."""
