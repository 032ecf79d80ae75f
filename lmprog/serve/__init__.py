"""lmprog's OpenAI-compatible server (needs the `serve` extra: fastapi, uvicorn,
prometheus-client).

    from lmprog.serve import Server
    with Server(lp.Runtime()).start() as srv:
        print(srv.url)                     # http://127.0.0.1:PORT; the API under /v1

    lmprog serve --model smollm2 --port 8000          # or: python -m lmprog.serve ...

Layout (docs/architecture.md has a line per module): server.py, app.py (routes), cli.py; the
shared plumbing (access.py, jsonbody.py, context.py, generations.py, respond.py, errors.py,
...) and a request's parts (sampling.py, constraints.py, compile.py, prompts.py,
reasoning.py, logprobs.py); schemas/ the request bodies; tools/ tool calls; the API
surfaces openai/ (completions, chat completions, responses), anthropic/ (messages) and
sglang/ (the native API, the router's /get_load).
"""

from .limits import ServerLimits
from .server import Server

__all__ = ["Server", "ServerLimits"]
