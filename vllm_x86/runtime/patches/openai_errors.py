"""Patch ``openai_server_error_messages`` (a monkey-patch; ledger.py).

vLLM's OpenAI server answers a request it cannot parse with a 400, but two kinds of
answer are not ones a user can act on (found by tests/e2e/test_robustness.py and the
fuzzing of tests/e2e/test_fuzz.py; docs/reliability.md):

1. A body FastAPI cannot decode (bytes that are not UTF-8, for one) gets Starlette's
   own ``{"detail": "There was an error parsing the body"}``: not vLLM's error shape
   (``{"error": {"message", "type", "param", "code"}}``), so an OpenAI client shows no
   message, and the message does not say what is wrong. The same goes for a path the
   server does not have (``{"detail": "Not Found"}``) and a method a path does not take
   (405). FastAPI raises ``starlette.exceptions.HTTPException`` there
   (``fastapi/routing.py``), and vLLM registers its handler for FastAPI's subclass
   only (``init_exception_handler`` in
   ``vllm/entrypoints/serve/exception_handling/register.py``), so Starlette's default
   handler answers.
2. A body that does not fit the request model (``max_tokens: "ten"``, ``messages`` a
   string, JSON cut short) gets a dump of pydantic's error records, one per union
   branch: ``1 validation error:\\n  {'type': 'json_invalid', 'loc': 'body.28', 'msg':
   'JSON decode error', 'input': '<dict of 0 items>', 'ctx': {'error': 'Expecting
   value'}}``.

The patch wraps ``init_exception_handler`` where ``build_app``
(``vllm/entrypoints/launchers/app.py``) looks it up: vLLM's function runs as before,
then the app gets two more handlers. Starlette's ``HTTPException`` goes through vLLM's
own ``http_exception_handler`` (vLLM's error shape, its ``sanitize_message``) with a
sentence for the three cases above and the exception's headers (``Allow`` on a 405).
``RequestValidationError`` goes through vLLM's ``validation_exception_handler`` (its
status, ``type`` and ``param`` stay) with the message rewritten from the same error
records: the field as a client spells it (``messages[0].role``), pydantic's ``msg``,
and what was sent, bounded in size; of the records a union produces for one field, the
ones that got deepest into the value (then the most frequent), so ``{"content": "hi"}``
as a message reads "`messages[0].role` is required" rather than eleven records. Nothing
else changes: which requests are refused, with which status, is vLLM's.

The patch is installed only in a process that has already imported vLLM's
``launchers.app`` (the OpenAI server imports it at start, before vLLM loads the
plugins), so the engine and worker processes import no web framework for it. Where
vLLM's handlers move, the wrapper is not installed and vLLM's messages stay (a warning
says so); the ledger's check names the record to revisit.

Upstream change that removes it: vLLM registering its HTTP handler for Starlette's
``HTTPException`` and wording its validation errors for people. It can go when the
pinned vLLM does both.
"""

from __future__ import annotations

import json
import sys

from vllm_x86.runtime.log import get_logger
from vllm_x86.runtime.patches.ledger import MARK

logger = get_logger("patches")

APP_MODULE = "vllm.entrypoints.launchers.app"

# pydantic-core's wrappers and union-branch names in an error's `loc`: not fields a
# client sends (the OpenAI API's fields are lower-case snake_case)
_TYPE_NAMES = frozenset(
    {"str", "int", "float", "bool", "list", "dict", "tuple", "set", "bytes", "none", "json"}
)
_MAX_FIELDS = 3  # fields named in one message
_MAX_SHOWN = 60  # characters of a sent value quoted back


def _client_segment(segment) -> bool:
    if isinstance(segment, int):
        return True
    s = str(segment)
    return not (
        any(c in s for c in "[](){}-")
        or s.lower() in _TYPE_NAMES
        or any(c.isupper() for c in s)
        or not s
    )


def field_path(loc) -> tuple:
    """An error's ``loc`` as the client's field path: no leading ``body``, no
    pydantic wrapper or union-branch names."""
    parts = list(loc or ())
    if parts and parts[0] == "body":
        parts = parts[1:]
    return tuple(p for p in parts if _client_segment(p))


def spell(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def shown(value) -> str:
    """What was sent, bounded: a value is quoted back short, a container described."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return str(value) if value.bit_length() < 200 else "a very large integer"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return repr(value if len(value) <= _MAX_SHOWN else value[:_MAX_SHOWN] + "...")
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} item{'' if len(value) == 1 else 's'}"
    if isinstance(value, dict):
        return f"an object with {len(value)} field{'' if len(value) == 1 else 's'}"
    return f"a {type(value).__name__}"


def _join(msgs: list[str]) -> str:
    prefix = "Input should be "
    if len(msgs) > 1 and all(m.startswith(prefix) for m in msgs):
        return prefix + ", or ".join(m[len(prefix) :] for m in msgs)
    return "; ".join(msgs)


def validation_message(errors) -> str:
    """One sentence (or a few) for pydantic's error records of a request body."""
    errors = list(errors or ())
    for e in errors:
        if isinstance(e, dict) and e.get("type") == "json_invalid":
            loc = e.get("loc") or ()
            where = f" at character {loc[-1]}" if loc and isinstance(loc[-1], int) else ""
            why = (e.get("ctx") or {}).get("error") or "it cannot be parsed"
            return (
                f"The request body is not valid JSON: {why}{where}. Send one JSON object, "
                'such as {"model": ..., "messages": [...]}.'
            )
    texts = [str(e).strip() for e in errors if not isinstance(e, dict)]
    if texts:
        return "Invalid request: " + "; ".join(dict.fromkeys(texts)).rstrip(".") + "."
    # field path -> [first index, count, messages, first value sent, missing]
    groups: dict[tuple, list] = {}
    for i, e in enumerate(errors):
        path = field_path(e.get("loc"))
        g = groups.setdefault(path, [i, 0, [], e.get("input"), False])
        g[1] += 1
        if e.get("type") == "missing":
            g[4] = True
        else:
            msg = str(e.get("msg") or "invalid value")
            if msg not in g[2]:
                g[2].append(msg)
    # per top-level field, the records that reached deepest into the value, then the
    # most frequent: the union branch the client meant
    best: dict = {}
    for path, g in groups.items():
        top = path[0] if path else None
        rank = (len(path), g[1])
        if top not in best or rank > best[top][0]:
            best[top] = (rank, [(path, g)])
        elif rank == best[top][0]:
            best[top][1].append((path, g))
    chosen = sorted((pg for _, pgs in best.values() for pg in pgs), key=lambda pg: pg[1][0])
    parts = []
    for path, (_, _, msgs, value, missing) in chosen[:_MAX_FIELDS]:
        name = f"`{spell(path)}`" if path else "the request body"
        if missing and not msgs:
            parts.append(f"{name} is required")
        else:
            parts.append(f"{name}: {_join(msgs)} (got {shown(value)})")
    more = len(chosen) - len(parts)
    tail = f" (and {more} more)" if more > 0 else ""
    if not parts:
        return "Invalid request: the body does not match what this endpoint takes."
    return "Invalid request: " + "; ".join(parts) + tail + "."


def http_message(status: int, detail, method: str, path: str, cause, headers) -> str:
    """A sentence for the HTTP errors FastAPI and Starlette raise themselves."""
    path = path if len(path) <= 200 else path[:200] + "..."
    if status == 400 and detail == "There was an error parsing the body":
        if isinstance(cause, UnicodeDecodeError):
            bad = cause.object[cause.start : cause.start + 1].hex()
            return (
                f"The request body is not valid UTF-8 (byte 0x{bad} at position "
                f"{cause.start}): send the JSON text encoded as UTF-8."
            )
        return (
            "The request body could not be read as JSON"
            + (f" ({type(cause).__name__}: {cause})" if cause is not None else "")
            + ": send one JSON object encoded as UTF-8."
        )
    if status == 404 and detail == "Not Found":
        return f"This server has no {method} {path}: see /docs for the endpoints it serves."
    if status == 405 and detail == "Method Not Allowed":
        allow = (headers or {}).get("Allow") or (headers or {}).get("allow")
        return f"{method} is not allowed on {path}" + (f": use {allow}." if allow else ".")
    return str(detail)


def _reworded(response, message: str, headers=None):
    from starlette.responses import JSONResponse

    body = json.loads(bytes(response.body))
    body["error"]["message"] = message
    merged = dict(headers or {})
    return JSONResponse(body, status_code=response.status_code, headers=merged or None)


def apply() -> None:
    """Install the wrapper in an OpenAI server process (idempotent; see the docstring)."""
    app_module = sys.modules.get(APP_MODULE)
    if app_module is None:
        return  # not an OpenAI server: nothing to do, nothing imported
    original = getattr(app_module, "init_exception_handler", None)
    if original is None or getattr(original, MARK, False):
        return
    try:
        from fastapi.exceptions import RequestValidationError
        from starlette.exceptions import HTTPException as StarletteHTTPException
        from vllm.entrypoints.serve.exception_handling.handlers.http import (
            http_exception_handler,
        )
        from vllm.entrypoints.serve.exception_handling.handlers.validation import (
            validation_exception_handler,
        )
        from vllm.entrypoints.serve.exception_handling.utils import sanitize_message
    except ImportError as e:
        logger.warning(
            "vllm-x86: this vLLM's error handlers moved (%s); its own error messages stay", e
        )
        return

    async def http_handler(req, exc):
        response = await http_exception_handler(req, exc)
        message = http_message(
            exc.status_code, exc.detail, req.method, req.url.path, exc.__cause__, exc.headers
        )
        return _reworded(response, sanitize_message(message), exc.headers)

    async def validation_handler(req, exc):
        response = await validation_exception_handler(req, exc)
        return _reworded(response, sanitize_message(validation_message(exc.errors())))

    def init_exception_handler(app) -> None:
        original(app)
        app.exception_handler(StarletteHTTPException)(http_handler)
        app.exception_handler(RequestValidationError)(validation_handler)

    setattr(init_exception_handler, MARK, True)
    init_exception_handler.__wrapped__ = original
    app_module.init_exception_handler = init_exception_handler
