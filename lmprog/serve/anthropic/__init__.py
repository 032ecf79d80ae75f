"""Anthropic's Messages API (/v1/messages) over the chat pipeline."""
