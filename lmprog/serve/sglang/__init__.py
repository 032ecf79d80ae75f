"""SGLang's native API (/generate, ...) and what its router calls (/get_load)."""
