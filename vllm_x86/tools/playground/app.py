"""The playground's back end: a FastAPI app (the page, its static files and /api/...).

Routes and their answers are the contract in the module's callers (cli.py, asgi.py) and
the page (static/app.js); every /api answer that is not a success is
``{"error": "<a sentence>"}`` with its HTTP status. With a key, every /api route needs
``Authorization: Bearer KEY`` (401 otherwise); the page and its static files are public.

Streaming chat is proxied chunk by chunk (:class:`ProxyStream`), watching the browser's
connection while it streams: when the browser goes away (the page's stop button aborts
its fetch) the upstream request is closed at once, and vLLM's server aborts the request
(it stops generating). Starlette's StreamingResponse does not do this under uvicorn's
ASGI 2.3 scope reliably (it leaves the upstream iterator to the garbage collector), hence
the small class of our own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.staticfiles import StaticFiles

from vllm_x86.tools import exposure
from vllm_x86.tools.playground import models as M
from vllm_x86.tools.playground import structured
from vllm_x86.tools.playground.backend import PullJobs
from vllm_x86.tools.playground.models import PlaygroundError

STATIC = Path(__file__).parent / "static"
DOCTOR_TTL_S = 60.0
UNAUTHORIZED = (
    "this playground has a key: enter it (it is sent as 'Authorization: Bearer KEY'; the "
    "key is the one given with --api-key or VLLM_API_KEY at start)"
)


@dataclass
class PlaygroundConfig:
    backend: Any  # backend.DaemonBackend | backend.AttachedBackend
    api_key: str | None = None
    models_dirs: list[str] = field(default_factory=list)  # --models-dir, beside the cache
    static_dir: Path = STATIC
    # seams for tests: the architecture list, the memory available, the upstream transport
    supported_archs: Any = None
    mem_available: Any = None
    transport: httpx.AsyncBaseTransport | None = None


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def check_origin(headers, key: str | None) -> None:
    """Requests a browser makes for another site are refused (403): a page elsewhere
    could otherwise make the user's browser load models or chat through a playground
    on loopback. A browser names the page's site in Origin: it must be this server (the
    Host the request came to). Without a key, the Host must also be a loopback name, so
    a site whose name was made to resolve to 127.0.0.1 (DNS rebinding) is refused too."""
    from urllib.parse import urlsplit

    host = headers.get("host") or ""
    origin = headers.get("origin")
    if origin is not None and (origin == "null" or urlsplit(origin).netloc != host):
        raise PlaygroundError(
            403, f"a request from another site ({origin}) is refused: open the playground's "
            "own page to use it",
        )  # fmt: skip
    if not key:
        name = urlsplit(f"//{host}").hostname or ""
        if name not in LOOPBACK_NAMES:
            raise PlaygroundError(
                403, f"this playground answers requests addressed to this machine only "
                f"(localhost or 127.0.0.1), not to '{host}'; without a key it serves "
                "loopback only",
            )  # fmt: skip


def _err(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _json_body(request: Request) -> dict:
    try:
        body = await request.json()
    except ValueError:
        raise PlaygroundError(400, "the request body is not JSON") from None
    if not isinstance(body, dict):
        raise PlaygroundError(400, "the request body must be a JSON object")
    return body


# ----------------------------------------------------------------------------- sampling


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def check_sampling(body: dict, max_len: int | None, chat: bool) -> None:
    """The page's sampling settings, checked again here; PlaygroundError(400) with a
    sentence naming the setting, its range and the value given."""
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
            raise PlaygroundError(400, "messages must be a non-empty list of {role, content}")
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise PlaygroundError(400, "prompt must be a non-empty string")
    v = body.get("temperature")
    if v is not None and not (_is_num(v) and 0 <= v <= 2):
        raise PlaygroundError(400, f"temperature must be between 0 and 2 (got {v})")
    v = body.get("top_p")
    if v is not None and not (_is_num(v) and 0 < v <= 1):
        raise PlaygroundError(400, f"top_p must be above 0 and at most 1 (got {v})")
    v = body.get("top_k")
    if v is not None and not (_is_int(v) and (v == -1 or v >= 1)):
        raise PlaygroundError(400, f"top_k must be -1 (off) or a whole number from 1 (got {v})")
    hi = max_len or M.MAX_LEN
    for name in ("max_tokens", "max_completion_tokens"):
        v = body.get(name)
        if v is not None and not (_is_int(v) and 1 <= v <= hi):
            raise PlaygroundError(400, f"{name} must be between 1 and {hi} (got {v})")
    v = body.get("seed")
    if v is not None and not _is_int(v):
        raise PlaygroundError(400, f"seed must be a whole number (got {v})")
    v = body.get("stop")
    if v is not None:
        stops = [v] if isinstance(v, str) else v
        if (
            not isinstance(stops, list)
            or len(stops) > 4
            or not all(isinstance(s, str) and s for s in stops)
        ):
            raise PlaygroundError(400, f"stop must be at most 4 non-empty strings (got {v!r})")


# ----------------------------------------------------------------------------- proxy


class ProxyStream(Response):
    """An upstream streaming response passed through to the browser; closed upstream as
    soon as the browser disconnects (or the stream ends)."""

    def __init__(self, resp: httpx.Response, client: httpx.AsyncClient):
        self.resp = resp
        self.client = client
        self.status_code = 200
        self.background = None
        self.body = b""
        self.raw_headers = []

    async def __call__(self, scope, receive, send) -> None:
        ctype = self.resp.headers.get("content-type", "text/event-stream")
        headers = [(b"content-type", ctype.encode()), (b"cache-control", b"no-cache"),
                   (b"x-accel-buffering", b"no")]  # fmt: skip

        async def pump() -> None:
            try:
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                async for chunk in self.resp.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except (OSError, httpx.HTTPError):
                pass  # the browser or the model server went away

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return

        try:
            async with anyio.create_task_group() as tg:

                async def first_done(fn) -> None:
                    await fn()
                    tg.cancel_scope.cancel()

                tg.start_soon(first_done, pump)
                tg.start_soon(first_done, watch)
        finally:
            with anyio.CancelScope(shield=True):
                await self.resp.aclose()  # closes the connection: vLLM aborts the request
                await self.client.aclose()


def _upstream_error(status: int, raw: bytes) -> JSONResponse:
    import json

    msg = None
    try:
        data = json.loads(raw)
        if isinstance(data, dict):
            e = data.get("error")
            msg = e.get("message") if isinstance(e, dict) else e or data.get("message")
            if msg is None and isinstance(data.get("detail"), str):
                msg = data["detail"]
    except ValueError:
        msg = raw.decode(errors="replace")[:500] or None
    return _err(status, f"the model server refused the request: {msg or f'HTTP {status}'}")


def _client(cfg: PlaygroundConfig) -> httpx.AsyncClient:
    timeout = httpx.Timeout(connect=10.0, read=None, write=30.0, pool=10.0)
    if cfg.transport is not None:
        return httpx.AsyncClient(transport=cfg.transport, timeout=timeout)
    return httpx.AsyncClient(timeout=timeout)


# ----------------------------------------------------------------------------- metrics


METRICS = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:prompt_tokens_total": "prompt_tokens_total",
    "vllm:generation_tokens_total": "generation_tokens_total",
}


def parse_metrics(text: str) -> dict:
    """The page's figures from vLLM's Prometheus text (summed over engines)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict = dict.fromkeys(METRICS.values())
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = METRICS.get(s.name)
            if key is not None:
                out[key] = (out[key] or 0.0) + float(s.value)
    return out


# ----------------------------------------------------------------------------- the app


def create_app(config: PlaygroundConfig) -> FastAPI:
    cfg = config
    backend = cfg.backend
    pulls = PullJobs()
    doctor_cache: dict = {}

    async def check_key(request: Request) -> None:
        check_origin(request.headers, cfg.api_key)
        if not exposure.authorized(request.headers.get("authorization"), cfg.api_key):
            raise PlaygroundError(401, UNAUTHORIZED)

    app = FastAPI(title="vllm-x86 playground", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.pulls = pulls
    api = APIRouter(prefix="/api", dependencies=[Depends(check_key)])

    @app.exception_handler(PlaygroundError)
    async def _pg_error(request: Request, e: PlaygroundError):
        return _err(e.status, e.message)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        msg = e.detail if isinstance(e.detail, str) else str(e.detail)
        if e.status_code == 404:
            msg = f"no such page or API route: {request.url.path}"
        elif e.status_code == 405:
            msg = f"{request.method} is not a method of {request.url.path}"
        return _err(e.status_code, msg)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        return _err(400, f"bad request: {first.get('msg', 'invalid body')}")

    # -------------------------------------------------------------- models

    def roots() -> list[Path]:
        return M.allowed_roots(cfg.models_dirs)

    @api.get("/health")
    async def health():
        return {"ok": True}

    @api.get("/models")
    async def models():
        from vllm_x86.tools.models.catalog import DEFAULT_MODEL

        listed = await run_in_threadpool(M.list_models, cfg.models_dirs)
        return {"models": listed, "roots": [str(r) for r in roots()], "default": DEFAULT_MODEL}

    @api.post("/models/inspect")
    async def inspect(request: Request):
        body = await _json_body(request)
        path = M.check_path(body.get("path"), roots())
        return await run_in_threadpool(M.describe, path, "local")

    @api.post("/pull", status_code=202)
    async def pull(request: Request):
        body = await _json_body(request)
        job = await run_in_threadpool(pulls.start, body.get("name"))
        return JSONResponse({"job": job["name"], "name": job["name"]}, status_code=202)

    @api.get("/pull/{name}")
    async def pull_state(name: str):
        return await run_in_threadpool(pulls.get, name)

    # -------------------------------------------------------------- load

    def _prechecks(body: dict) -> M.LoadPlan:
        plan = M.plan_load(body, roots())
        if cfg.supported_archs is not None:
            M.check_architecture(plan, cfg.supported_archs)
        else:
            M.check_architecture(plan)
        available = cfg.mem_available() if cfg.mem_available is not None else None
        M.check_memory(plan, freed_bytes=backend.current_rss(), available=available)
        return plan

    @api.post("/load")
    async def load(request: Request):
        body = await _json_body(request)
        if backend.mode == "attached":  # one model: say so before any other check
            await run_in_threadpool(backend.load, None)
        plan = await run_in_threadpool(_prechecks, body)
        out = await run_in_threadpool(backend.load, plan)
        return JSONResponse(out, status_code=202)

    @api.post("/unload")
    async def unload():
        return await run_in_threadpool(backend.unload)

    @api.get("/status")
    async def status():
        return await run_in_threadpool(backend.status)

    # -------------------------------------------------------------- chat

    async def proxy(request: Request, path: str, chat: bool):
        body = await _json_body(request)
        up = await run_in_threadpool(backend.upstream)
        if up is None:
            st = await run_in_threadpool(backend.status)
            if st["state"] == "starting":
                raise PlaygroundError(409, f"{st['model'] or 'the model'} is still loading; "
                                      "send again once the status says ready")  # fmt: skip
            raise PlaygroundError(409, "no model is loaded: load one in the Models view first")
        check_sampling(body, up.max_model_len, chat)
        body.setdefault("model", up.model)
        headers = {"Authorization": f"Bearer {up.key}"} if up.key else {}
        client = _client(cfg)
        try:
            req = client.build_request("POST", up.base + path, json=body, headers=headers)
            resp = await client.send(req, stream=True)
        except httpx.HTTPError as e:
            await client.aclose()
            raise PlaygroundError(502, f"the model server did not answer: {e}") from None
        if resp.status_code != 200:
            raw = await resp.aread()
            await resp.aclose()
            await client.aclose()
            return _upstream_error(resp.status_code, raw)
        if body.get("stream"):
            return ProxyStream(resp, client)
        try:
            raw = await resp.aread()
        finally:
            await resp.aclose()
            await client.aclose()
        return Response(raw, media_type="application/json")

    @api.post("/chat")
    async def chat(request: Request):
        return await proxy(request, "/v1/chat/completions", chat=True)

    @api.post("/completions")
    async def completions(request: Request):
        return await proxy(request, "/v1/completions", chat=False)

    # -------------------------------------------------------------- structured output

    @api.post("/validate")
    async def validate(request: Request):
        return structured.validate(await _json_body(request))

    @api.get("/examples")
    async def examples():
        return structured.examples()

    # -------------------------------------------------------------- server view

    def _doctor() -> dict:
        now = time.monotonic()
        if doctor_cache.get("t", -1e9) + DOCTOR_TTL_S < now:
            from vllm_x86.tools.cli.doctor import collect, render

            report = collect()
            report["doctor_text"] = render(report)
            doctor_cache.update(t=now, report=report)
        return doctor_cache["report"]

    @api.get("/server")
    async def server():
        doctor = await run_in_threadpool(_doctor)
        return {"doctor": doctor, "status": await run_in_threadpool(backend.status)}

    @api.get("/metrics")
    async def metrics():
        out: dict = {"ok": False, **dict.fromkeys(METRICS.values()), "time": time.time()}
        up = await run_in_threadpool(backend.upstream)
        if up is None:
            return out
        headers = {"Authorization": f"Bearer {up.key}"} if up.key else {}
        try:
            async with _client(cfg) as client:
                r = await client.get(up.base + "/metrics", headers=headers, timeout=10.0)
            if r.status_code == 200:
                out.update(parse_metrics(r.text), ok=True)
        except (httpx.HTTPError, ValueError):
            pass
        out["time"] = time.time()
        return out

    @api.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def unknown(rest: str):
        raise PlaygroundError(404, f"no such API route: /api/{rest}")

    app.include_router(api)

    # -------------------------------------------------------------- the page

    index = cfg.static_dir / "index.html"

    @app.get("/", include_in_schema=False)
    async def page():
        if index.is_file():
            return FileResponse(index, headers={"Cache-Control": "no-cache"})
        return HTMLResponse(
            "<!doctype html><title>vllm-x86 playground</title><p>The playground's page "
            "is not installed (no static/index.html); its API answers under api/.</p>"
        )

    app.mount("/static", StaticFiles(directory=cfg.static_dir, check_dir=False), name="static")
    return app
