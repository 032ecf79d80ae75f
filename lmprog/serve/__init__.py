"""lmprog's OpenAI-compatible server (needs the `serve` extra: fastapi, uvicorn,
prometheus-client).

    from lmprog.serve import Server
    with Server(lp.Runtime()).start() as srv:
        print(srv.url)                     # http://127.0.0.1:PORT; the API under /v1

    lmprog serve --model smollm2 --port 8000          # or: python -m lmprog.serve ...

Files: server.py (uvicorn thread), app.py (routes), gate.py (API key, body limit),
completions.py / chat_completions.py (the two endpoints), bridge.py (backend <-> event loop),
schemas.py / chat_schemas.py (request bodies), params.py, formats.py, tools.py, prompts.py,
echo.py, logprobs.py, streaming.py, metrics.py (prometheus-client), unknown.py (unknown
fields), errors.py, limits.py, cli.py.
"""

from .limits import ServerLimits
from .server import Server

__all__ = ["Server", "ServerLimits"]
