"""lmprog's OpenAI-, Anthropic- and SGLang-compatible HTTP server (needs the `serve` extra).

    from lmprog.serve import Server
    with Server(lp.Runtime()).start() as srv:
        print(srv.url)                     # http://127.0.0.1:PORT; the API under /v1

    lmprog serve --model smollm2 --port 8000          # or: python -m lmprog.serve ...

The extra: fastapi, uvicorn, prometheus-client. User guide: docs/serving.md; how a request
flows through the package and its layout: docs/design/server.md.
"""

from .limits import ServerLimits
from .server import Server

__all__ = ["Server", "ServerLimits"]
