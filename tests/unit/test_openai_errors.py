"""The patch ``openai_server_error_messages`` (runtime/patches/openai_errors.py): the
sentences it writes, and, in process, a FastAPI app set up by vLLM's own
``init_exception_handler`` with the patch installed (tests/e2e/test_robustness.py
checks the running server)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from vllm_x86.runtime.patches import openai_errors as oe


class Body(BaseModel):
    """A request model for the in-process app (module level: FastAPI resolves the
    endpoint's annotations in the module's namespace)."""

    model: str
    max_tokens: int = 16


# ----------------------------------------------------------------------------- messages


def test_json_cut_short_says_so_and_where():
    msg = oe.validation_message(
        [
            {
                "type": "json_invalid",
                "loc": ("body", 28),
                "msg": "JSON decode error",
                "input": {},
                "ctx": {"error": "Expecting value"},
            }
        ]
    )
    assert msg.startswith("The request body is not valid JSON: Expecting value at character 28.")


def test_a_wrong_type_names_the_field_and_what_was_sent():
    msg = oe.validation_message(
        [
            {
                "type": "int_parsing",
                "loc": ("body", "max_tokens"),
                "msg": "Input should be a valid integer, unable to parse string as an integer",
                "input": "ten",
            },
            {
                "type": "float_type",
                "loc": ("body", "temperature"),
                "msg": "Input should be a valid number",
                "input": [1],
            },
        ]
    )
    assert msg == (
        "Invalid request: `max_tokens`: Input should be a valid integer, unable to parse "
        "string as an integer (got 'ten'); `temperature`: Input should be a valid number "
        "(got a list of 1 item)."
    )


def test_union_branches_read_as_the_branch_the_client_meant():
    role = [
        {
            "type": "missing",
            "loc": ("body", "messages", 0, f"{branch}MessageParam", "role"),
            "msg": "Field required",
            "input": {"content": "hi"},
        }
        for branch in ("ChatCompletionSystem", "ChatCompletionUser", "ChatCompletionAssistant")
    ]
    other = {
        "type": "missing",
        "loc": ("body", "messages", 0, "ChatCompletionToolMessageParam", "tool_call_id"),
        "msg": "Field required",
        "input": {"content": "hi"},
    }
    assert oe.validation_message([*role, other]) == (
        "Invalid request: `messages[0].role` is required."
    )
    schema = [
        {
            "type": "dict_type",
            "loc": ("body", "response_format", "json_schema", "schema"),
            "msg": "Input should be a valid dictionary",
            "input": "notaschema",
        },
        {
            "type": "literal_error",
            "loc": ("body", "response_format", "type"),
            "msg": "Input should be 'structural_tag'",
            "input": "json_schema",
        },
        {
            "type": "missing",
            "loc": ("body", "response_format", "format"),
            "msg": "Field required",
            "input": {},
        },
    ]
    assert oe.validation_message(schema) == (
        "Invalid request: `response_format.json_schema.schema`: Input should be a valid "
        "dictionary (got 'notaschema')."
    )
    prompt = [
        {"type": t, "loc": ("body", "prompt", w), "msg": m, "input": {"a": 1}}
        for t, w, m in (
            ("list_type", "list[int]", "Input should be a valid list"),
            ("string_type", "str", "Input should be a valid string"),
        )
    ]
    assert oe.validation_message(prompt) == (
        "Invalid request: `prompt`: Input should be a valid list, or a valid string "
        "(got an object with 1 field)."
    )


def test_values_sent_back_are_bounded():
    assert oe.shown("x" * 5000) == repr("x" * oe._MAX_SHOWN + "...")
    assert oe.shown(2**5000) == "a very large integer"
    assert oe.shown(list(range(10**5))) == "a list of 100000 items"
    assert oe.shown(None) == "null" and oe.shown(True) == "true"


def test_errors_that_are_text_stay_text():
    assert oe.validation_message(
        ["Unsupported Media Type: Only 'application/json' is allowed"]
    ) == ("Invalid request: Unsupported Media Type: Only 'application/json' is allowed.")


def test_http_errors_get_a_sentence():
    try:
        b'{"a": "\xff"}'.decode()
    except UnicodeDecodeError as e:
        cause = e
    msg = oe.http_message(
        400, "There was an error parsing the body", "POST", "/v1/completions", cause, None
    )
    assert msg == (
        "The request body is not valid UTF-8 (byte 0xff at position 7): send the JSON "
        "text encoded as UTF-8."
    )
    assert oe.http_message(404, "Not Found", "POST", "/v1/nosuch", None, None) == (
        "This server has no POST /v1/nosuch: see /docs for the endpoints it serves."
    )
    assert oe.http_message(
        405, "Method Not Allowed", "GET", "/v1/completions", None, {"allow": "POST"}
    ) == ("GET is not allowed on /v1/completions: use POST.")


# ----------------------------------------------------------------------------- in process


@pytest.fixture
def app(monkeypatch):
    """A FastAPI app with vLLM's exception handlers, as its build_app sets them up, and
    the patch installed (undone after the test)."""
    from argparse import Namespace

    import vllm.entrypoints.launchers.app as app_module
    from fastapi import FastAPI

    monkeypatch.setattr(app_module, "init_exception_handler", app_module.init_exception_handler)
    oe.apply()
    oe.apply()  # idempotent
    assert getattr(app_module.init_exception_handler, "__wrapped__", None) is not None
    assert not hasattr(app_module.init_exception_handler.__wrapped__, "__wrapped__")

    app = FastAPI()
    app.state.args = Namespace(log_error_stack=False)

    @app.post("/v1/completions")
    async def completions(body: Body):
        return {"ok": body.max_tokens}

    app_module.init_exception_handler(app)
    return app


def test_in_process_bodies_get_vllms_error_shape_and_a_sentence(app):
    from starlette.testclient import TestClient

    c = TestClient(app)
    json_headers = {"content-type": "application/json"}
    r = c.post(
        "/v1/completions", content=b'{"model": "m", "max_tokens": \xff1}', headers=json_headers
    )
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["message"].startswith("The request body is not valid UTF-8 (byte 0xff at position")
    assert err["code"] == 400 and err["type"] == "Bad Request"

    r = c.post("/v1/completions", json={"model": "m", "max_tokens": "ten"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["message"] == (
        "Invalid request: `max_tokens`: Input should be a valid integer, unable to parse "
        "string as an integer (got 'ten')."
    )
    assert err["param"] == "body.max_tokens"  # vLLM's own, kept

    r = c.post("/v1/completions", content=b'{"model": ', headers=json_headers)
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("The request body is not valid JSON")

    r = c.get("/v1/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["message"] == "GET is not allowed on /v1/completions: use POST."

    r = c.post("/v1/nosuch", json={})
    assert r.status_code == 404
    assert "This server has no POST /v1/nosuch" in r.json()["error"]["message"]

    assert c.post("/v1/completions", json={"model": "m"}).json() == {"ok": 16}


def test_not_installed_outside_the_openai_server(monkeypatch):
    """Where vLLM's app module is not imported (the engine, the workers), apply() does
    nothing and imports nothing."""
    import sys

    monkeypatch.delitem(sys.modules, oe.APP_MODULE, raising=False)
    oe.apply()
    assert oe.APP_MODULE not in sys.modules


# ----------------------------------------------------------------------------- responses


def test_responses_assistant_input_without_text(monkeypatch):
    """Patch ``responses_assistant_input_without_text`` (runtime/patches/responses_input.py):
    an assistant message without text in a Responses API input is vLLM's 400
    (VLLMValidationError) with a sentence, not the IndexError/AttributeError (a 500) of
    vLLM's own function; a message with text goes through vLLM's function unchanged."""
    from openai.types.responses import (
        ResponseOutputMessage,
        ResponseOutputRefusal,
        ResponseOutputText,
    )
    from vllm.entrypoints.openai.responses import utils
    from vllm.exceptions import VLLMValidationError

    from vllm_x86.runtime.patches import responses_input

    monkeypatch.setattr(
        utils,
        "_construct_message_from_response_item",
        utils._construct_message_from_response_item,
    )

    def message(*content):
        return ResponseOutputMessage(
            id="m", content=list(content), role="assistant", status="completed", type="message"
        )

    empty = message()
    refusal = message(ResponseOutputRefusal(refusal="no", type="refusal"))
    text = message(ResponseOutputText(text="hello", annotations=[], type="output_text"))
    with pytest.raises(IndexError):  # vLLM's, unpatched: a 500
        utils.construct_chat_messages_with_tool_call([empty])
    responses_input.apply()
    responses_input.apply()  # idempotent
    with pytest.raises(VLLMValidationError, match="has an empty `content`") as e:
        utils.construct_chat_messages_with_tool_call([empty])
    assert e.value.parameter == "input"
    with pytest.raises(VLLMValidationError, match="starts with a `refusal` part"):
        utils.construct_chat_messages_with_tool_call([refusal])
    assert utils.construct_chat_messages_with_tool_call([text]) == [
        {"role": "assistant", "content": "hello"}
    ]


# ----------------------------------------------------------------------------- engine death


class _Engine:
    """An engine client as the patch sees it: vLLM's ``engine_core.resources.engine_dead``
    flag, which vLLM's own cleanup also sets on a normal shutdown."""

    def __init__(self):
        from types import SimpleNamespace

        self.engine_core = SimpleNamespace(resources=SimpleNamespace(engine_dead=False))

    def shutdown(self, timeout=None):
        self.engine_core.resources.engine_dead = True


def test_a_dead_engine_makes_the_server_exit_1(monkeypatch):
    """Patch ``server_exits_nonzero_after_engine_death`` (runtime/patches/engine_death_exit.py),
    on vLLM's server entry module with its build_and_serve stood in for: a shutdown
    asked for (engine alive when shutdown is first called) ends as before; a dead engine
    ends in SystemExit(1) after vLLM's own last awaitable."""
    import asyncio

    import vllm.entrypoints.launchers.api_server.entry as entry

    from vllm_x86.runtime.patches import engine_death_exit as ede

    served = []

    async def build_and_serve(engine_client, *args, **kwargs):  # vLLM's, stood in for
        async def shutdown():
            served.append("vLLM's shutdown awaited")

        return shutdown()

    monkeypatch.setattr(entry, "build_and_serve", build_and_serve)
    monkeypatch.delenv("VLLM_X86_SERVE_DEFAULTS", raising=False)
    ede.apply()
    assert entry.build_and_serve is build_and_serve  # not the plugin's server: untouched
    monkeypatch.setenv("VLLM_X86_SERVE_DEFAULTS", "1")
    ede.apply()
    ede.apply()  # idempotent
    assert entry.build_and_serve.__wrapped__ is build_and_serve

    async def run_server_worker(engine, dies: bool):  # vLLM's order of calls
        task = await entry.build_and_serve(engine, "addr", None, None)
        if dies:
            engine.engine_core.resources.engine_dead = True  # EngineDeadError
        engine.shutdown(timeout=0)  # the signal handler, or the client's context exit
        await task

    asyncio.run(run_server_worker(_Engine(), dies=False))  # Ctrl-C: exit 0 as before
    with pytest.raises(SystemExit) as e:
        asyncio.run(run_server_worker(_Engine(), dies=True))
    assert e.value.code == 1
    assert served == ["vLLM's shutdown awaited"] * 2


def test_an_asked_shutdown_hides_only_the_handlers_engine_dead_record(monkeypatch):
    """Patch ``no_engine_dead_traceback_on_asked_shutdown`` (engine_death_exit.py): once
    a shutdown is asked for with the engine alive, vLLM's async_llm logger drops its
    "output_handler failed" record for an EngineDeadError, and nothing else, until the
    server is done; before the shutdown, or after an engine that died first, that record
    is logged."""
    import asyncio
    import logging

    from vllm.v1.engine.exceptions import EngineDeadError

    from vllm_x86.runtime.patches import engine_death_exit as ede

    target = logging.getLogger(ede.ASYNC_LLM_LOGGER)
    monkeypatch.setattr(target, "filters", [f for f in target.filters
                                            if not isinstance(f, ede._AskedShutdown)])  # fmt: skip
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(f"{record.getMessage()} {type(record.exc_info[1]).__name__}")

    handler = Keep()
    target.addHandler(handler)
    monkeypatch.setattr(target, "disabled", False)
    try:

        def log(message: str, exc: Exception) -> None:
            try:
                raise exc
            except Exception:
                target.error(message, exc_info=True)

        def round_of_records() -> list[str]:
            seen.clear()
            log(ede.HANDLER_FAILED, EngineDeadError())
            log(ede.HANDLER_FAILED, ValueError("a real failure"))
            log("something else", EngineDeadError())
            return list(seen)

        everything = [f"{ede.HANDLER_FAILED} EngineDeadError",
                      f"{ede.HANDLER_FAILED} ValueError", "something else EngineDeadError"]  # fmt: skip
        dead = _Engine()
        ede.watch(dead)
        dead.engine_core.resources.engine_dead = True  # died before the shutdown
        dead.shutdown(timeout=0)
        assert round_of_records() == everything

        alive = _Engine()
        note = ede.watch(alive)
        assert round_of_records() == everything  # no shutdown asked yet
        alive.shutdown(timeout=0)  # Ctrl-C
        assert round_of_records() == everything[1:]
        asyncio.run(ede.exit_after(None, note, alive))  # the server is done: vLLM's again
        assert round_of_records() == everything
    finally:
        target.removeHandler(handler)
