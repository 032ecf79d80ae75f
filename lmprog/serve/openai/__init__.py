"""OpenAI's API: /v1/completions, /v1/chat/completions (the chat pipeline) and /v1/responses."""
