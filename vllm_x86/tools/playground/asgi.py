"""The playground inside vLLM's own OpenAI server: `vllm-x86 serve --playground`.

vLLM's server takes ``--middleware IMPORT.PATH`` (an ASGI middleware class, added with
``app.add_middleware(cls)``, no arguments); `serve --playground` passes
``--middleware vllm_x86.tools.playground.asgi.PlaygroundMiddleware``, so no runtime
patch is needed. The middleware answers ``/playground`` (a redirect to
``/playground/``) and everything under ``/playground/`` with the playground app, and
hands every other request to vLLM unchanged.

The app is made on the first request: it proxies to the server it lives in (the port
the request came in on, over loopback) with the server's own key (``--api-key`` on the
server's command line, else ``VLLM_API_KEY``), which is also the playground's key. The
server serves one model, so load and unload answer 409 (backend.AttachedBackend).
"""

from __future__ import annotations

import sys

PREFIX = "/playground"
IMPORT_PATH = "vllm_x86.tools.playground.asgi.PlaygroundMiddleware"


class PlaygroundMiddleware:
    def __init__(self, app) -> None:
        self.app = app
        self._pg = None

    def _playground(self, scope):
        if self._pg is None:
            from starlette.routing import Mount, Router

            from vllm_x86.tools import exposure
            from vllm_x86.tools.playground.app import PlaygroundConfig, create_app
            from vllm_x86.tools.playground.backend import AttachedBackend

            host, port = scope.get("server") or ("127.0.0.1", 8000)
            host = str(host or "")
            if host in ("", "0.0.0.0"):
                host = "127.0.0.1"
            elif host == "::":
                host = "[::1]"
            elif ":" in host:
                host = f"[{host}]"
            key = exposure.api_key(sys.argv[1:])
            backend = AttachedBackend(f"http://{host}:{port}", key)
            app = create_app(PlaygroundConfig(backend=backend, api_key=key))
            self._pg = Router(routes=[Mount(PREFIX, app=app)], redirect_slashes=True)
        return self._pg

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            if path == PREFIX or path.startswith(PREFIX + "/"):
                await self._playground(scope)(scope, receive, send)
                return
        await self.app(scope, receive, send)
