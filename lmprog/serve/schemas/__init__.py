"""The request bodies as pydantic models (the fields this server knows, strictly typed)."""
