"""Bad input and client faults against `vllm-x86 serve` (vLLM's OpenAI server with the
plugin), and the model worker killed under a streaming request.

Bad input: every request gets a 4xx whose ``error.message`` says what is wrong in words,
and a normal request right after still gets its answer (one server for the session:
tests/e2e/conftest.py). Where vLLM accepts what OpenAI refuses (an absent ``content``,
a role of its own), the server answers normally, as vLLM documents.
Faults: clients that drop a stream after a few chunks, and 64 streams opened at once
and abandoned, are aborted (vLLM's ``finished_reason="abort"`` counter), the running and
waiting gauges return to 0, and other clients get answers during and after. A SIGKILLed
model worker ends the in-flight stream with an error, and the server exits non-zero.
What the server answered to each is in docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import httpx
import pytest

from tests.e2e.conftest import MAX_LEN, ServeProcess

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
HI = [{"role": "user", "content": "Hi"}]
LONG = "word " * (MAX_LEN + 50)


def chat(**kw):
    return {"messages": HI, "max_tokens": 2, **kw}


def comp(**kw):
    return {"prompt": "Hi", "max_tokens": 2, **kw}


# (path, body, status, phrases the message must contain); a body of bytes is sent as is,
# a dict gets the served model's name unless it names one
BAD = [
    # malformed JSON
    pytest.param(CHAT, b'{"model": "m", "messages": [', 400, ["not valid JSON"], id="chat-json-cut-short"),
    pytest.param(COMP, b'{"prompt": "Hi",, }', 400, ["not valid JSON"], id="comp-json-malformed"),
    # wrong types
    pytest.param(CHAT, {"messages": "hello"}, 400, ["`messages`", "valid list"], id="chat-messages-a-string"),
    pytest.param(CHAT, chat(max_tokens="ten"), 400, ["`max_tokens`", "valid integer", "'ten'"], id="chat-max-tokens-ten"),
    pytest.param(COMP, comp(max_tokens="ten"), 400, ["`max_tokens`", "valid integer"], id="comp-max-tokens-ten"),
    pytest.param(CHAT, chat(temperature=[1]), 400, ["`temperature`", "valid number"], id="chat-temperature-a-list"),
    pytest.param(COMP, comp(temperature=[1]), 400, ["`temperature`", "valid number"], id="comp-temperature-a-list"),
    pytest.param(COMP, comp(prompt={"a": 1}), 400, ["`prompt`"], id="comp-prompt-an-object"),
    pytest.param(CHAT, chat(logprobs=5), 400, ["`logprobs`", "valid boolean"], id="chat-logprobs-an-int"),
    pytest.param(CHAT, [1, 2], 400, ["request body", "dictionary"], id="chat-body-a-list"),
    # max_tokens out of range
    pytest.param(CHAT, chat(max_tokens=-1), 400, ["max_tokens must be at least 1"], id="chat-max-tokens-negative"),
    pytest.param(COMP, comp(max_tokens=-1), 400, ["max_tokens must be at least 1"], id="comp-max-tokens-negative"),
    pytest.param(CHAT, chat(max_tokens=0), 400, ["max_tokens must be at least 1"], id="chat-max-tokens-zero"),
    pytest.param(CHAT, chat(max_tokens=10**9), 400, [f"cannot be greater than max_model_len={MAX_LEN}"], id="chat-max-tokens-huge"),
    pytest.param(COMP, comp(max_tokens=2**70), 400, [f"cannot be greater than max_model_len={MAX_LEN}"], id="comp-max-tokens-2**70"),
    pytest.param(CHAT, chat(max_completion_tokens=-5), 400, ["must be at least 1"], id="chat-max-completion-tokens-negative"),
    # n out of range
    pytest.param(CHAT, chat(n=0), 400, ["n must be at least 1"], id="chat-n-zero"),
    pytest.param(CHAT, chat(n=-1), 400, ["n must be at least 1"], id="chat-n-negative"),
    pytest.param(COMP, comp(n=0), 400, ["n must be at least 1"], id="comp-n-zero"),
    pytest.param(CHAT, chat(n=10**6), 400, ["n must be at most"], id="chat-n-huge"),
    pytest.param(COMP, comp(n=2**70), 400, ["n must be at most"], id="comp-n-2**70"),
    # logprobs out of range
    pytest.param(CHAT, chat(logprobs=True, top_logprobs=1000), 400, ["max allowed: 20"], id="chat-top-logprobs-huge"),
    pytest.param(CHAT, chat(logprobs=True, top_logprobs=-1), 400, ["max allowed: 20"], id="chat-top-logprobs-negative"),
    pytest.param(CHAT, chat(top_logprobs=5), 400, ["`logprobs` must be set to true"], id="chat-top-logprobs-without-logprobs"),
    pytest.param(COMP, comp(logprobs=1000), 400, ["max allowed: 20"], id="comp-logprobs-huge"),
    pytest.param(COMP, comp(logprobs=-1), 400, ["max allowed: 20"], id="comp-logprobs-negative"),
    pytest.param(COMP, comp(prompt_logprobs=1000), 400, ["max allowed: 20"], id="comp-prompt-logprobs-huge"),
    # empty messages and prompts
    pytest.param(CHAT, chat(messages=[]), 400, ["empty conversation"], id="chat-messages-empty"),
    pytest.param(CHAT, chat(messages=[{"content": "Hi"}]), 400, ["`messages[0].role` is required"], id="chat-message-without-role"),
    pytest.param(COMP, comp(prompt=""), 400, ["must be provided and non-empty"], id="comp-prompt-empty"),
    pytest.param(COMP, comp(prompt=[]), 400, ["at least one prompt"], id="comp-prompt-empty-list"),
    # prompts over the context
    pytest.param(CHAT, chat(messages=[{"role": "user", "content": LONG}]), 400, [f"maximum context length is {MAX_LEN} tokens"], id="chat-prompt-over-context"),
    pytest.param(COMP, comp(prompt=LONG), 400, [f"maximum context length is {MAX_LEN} tokens"], id="comp-prompt-over-context"),
    pytest.param(COMP, comp(prompt=[1] * (MAX_LEN + 10)), 400, [f"maximum context length is {MAX_LEN} tokens"], id="comp-token-ids-over-context"),
    pytest.param(COMP, comp(prompt=[10**9]), 400, ["out of vocabulary"], id="comp-token-id-out-of-vocab"),
    # structured output: invalid JSON schemas, regexes, grammars
    pytest.param(CHAT, chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nosuchtype"}}}), 400, ["Invalid type: nosuchtype"], id="chat-response-format-bad-schema"),
    pytest.param(CHAT, chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": "notaschema"}}), 400, ["`response_format.json_schema.schema`", "valid dictionary"], id="chat-response-format-schema-a-string"),
    pytest.param(CHAT, chat(response_format={"type": "xml"}), 400, ["`response_format.type`", "'json_schema'"], id="chat-response-format-unknown-type"),
    pytest.param(CHAT, chat(structured_outputs={"json": {"type": "nosuchtype"}}), 400, ["Invalid type: nosuchtype"], id="chat-structured-bad-schema"),
    pytest.param(COMP, comp(structured_outputs={"json": {"type": "nosuchtype"}}), 400, ["Invalid type: nosuchtype"], id="comp-structured-bad-schema"),
    pytest.param(CHAT, chat(structured_outputs={"json": "{not json"}), 400, ["Invalid JSON grammar"], id="chat-structured-schema-not-json"),
    pytest.param(CHAT, chat(structured_outputs={"regex": "(unclosed"}), 400, ["invalid regex", "unclosed group"], id="chat-structured-bad-regex"),
    pytest.param(COMP, comp(structured_outputs={"regex": "[a-"}), 400, ["invalid regex", "unclosed character class"], id="comp-structured-bad-regex"),
    pytest.param(CHAT, chat(structured_outputs={"grammar": "root ::= ("}), 400, ["Invalid grammar"], id="chat-structured-bad-grammar"),
    pytest.param(CHAT, chat(structured_outputs={"choice": []}), 400, ["cannot be an empty list"], id="chat-structured-empty-choice"),
    pytest.param(CHAT, chat(structured_outputs={"choice": ["@\u0014x", "yes"]}), 400, ["choice[0]", "U+0014", "no token"], id="chat-choice-unspellable"),
    pytest.param(COMP, comp(structured_outputs={"regex": "[0-9]+\u0014"}), 400, ["regex requires", "U+0014", "no token"], id="comp-regex-unspellable"),
    # non-UTF-8 bytes
    pytest.param(CHAT, b'{"messages": [{"role": "user", "content": "\xff\xfe"}], "max_tokens": 2}', 400, ["not valid UTF-8", "0xff"], id="chat-non-utf8"),
    pytest.param(COMP, b'{"prompt": "\xc3\x28", "max_tokens": 2}', 400, ["not valid UTF-8", "0xc3"], id="comp-non-utf8"),
    # unknown model, unknown path
    pytest.param(CHAT, chat(model="no-such-model"), 404, ["`no-such-model` does not exist", "Valid aliases"], id="chat-unknown-model"),
    pytest.param(COMP, comp(model="no-such-model"), 404, ["`no-such-model` does not exist"], id="comp-unknown-model"),
    pytest.param("/v1/embeddings", {"input": "Hi"}, 404, ["no POST /v1/embeddings"], id="path-not-served"),
]  # fmt: skip

# What vLLM accepts although OpenAI would refuse it: answered normally.
ACCEPTED = [
    pytest.param(CHAT, chat(messages=[{"role": "user", "content": ""}]), id="chat-content-empty"),
    pytest.param(CHAT, chat(messages=[{"role": "user"}]), id="chat-content-absent"),
    pytest.param(
        CHAT, chat(messages=[{"role": "wizard", "content": "Hi"}]), id="chat-role-of-its-own"
    ),
    pytest.param(COMP, comp(best_of=0), id="comp-best-of-zero"),
    pytest.param(COMP, comp(echo=True, max_tokens=0), id="comp-echo-max-tokens-zero"),
]


def _send(srv, path: str, body, timeout: float = 120) -> httpx.Response:
    if isinstance(body, bytes):
        if b'"model"' not in body:
            body = body.replace(b"{", b'{"model": "%s", ' % srv.model.encode(), 1)
        return httpx.post(
            srv.base + path,
            content=body,
            headers={"content-type": "application/json"},
            timeout=timeout,
        )
    if isinstance(body, dict) and "model" not in body:
        body = {"model": srv.model, **body}
    return httpx.post(srv.base + path, json=body, timeout=timeout)


def _answers(srv, path: str = COMP) -> None:
    """A normal request gets its answer."""
    body = chat(max_tokens=1) if path == CHAT else comp(max_tokens=1)
    r = _send(srv, CHAT if path == CHAT else COMP, body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] > 0


@pytest.mark.parametrize("path,body,status,says", BAD)
def test_bad_input(openai_server, path, body, status, says):
    r = _send(openai_server, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]  # vLLM's error shape, whatever refused the request
    message = err["message"]
    assert err["code"] == status
    for phrase in says:
        assert phrase in message, message
    # a sentence, not a dump of validation records or a traceback
    assert 10 < len(message) < 600, message
    for dump in ("{'type':", "validation error", "Traceback", "[type="):
        assert dump not in message, message
    _answers(openai_server, path)


@pytest.mark.parametrize("path,body", ACCEPTED)
def test_what_vllm_accepts_is_answered(openai_server, path, body):
    r = _send(openai_server, path, body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_responses_assistant_input_without_text(openai_server):
    """Found by fuzzing: vLLM answered these 500 (ledger: responses_assistant_input_without_text)."""
    srv = openai_server
    for content, says in (
        ([], "has an empty `content`"),
        ([{"type": "refusal", "refusal": "no"}], "starts with a `refusal` part"),
    ):
        item = {"type": "message", "role": "assistant", "id": "m", "status": "completed"}
        body = {"input": [{**item, "content": content}], "max_output_tokens": 2}
        r = _send(srv, "/v1/responses", body)
        assert r.status_code == 400, r.text
        assert says in r.json()["error"]["message"]
    text = [{"type": "output_text", "text": "Hello.", "annotations": []}]
    body = {
        "input": [
            {"type": "message", "role": "user", "content": "Hi"},
            {**item, "content": text},
            {"type": "message", "role": "user", "content": "And?"},
        ],
        "max_output_tokens": 2,
    }
    r = _send(srv, "/v1/responses", body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["output_tokens"] > 0


def test_max_tokens_past_what_the_prompt_leaves_is_shortened(openai_server):
    """vLLM answers with what fits in the context instead of refusing."""
    srv = openai_server
    r = _send(srv, COMP, comp(prompt="word " * (MAX_LEN - 16), max_tokens=100, ignore_eos=True))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["total_tokens"] == MAX_LEN
    assert body["usage"]["completion_tokens"] < 100


# ----------------------------------------------------------------------------- faults

STREAM = {"prompt": "Tell me a long story.", "max_tokens": 200, "ignore_eos": True, "stream": True}


def _settles(srv, timeout: float = 60) -> dict[str, float]:
    """Polls /metrics until no request runs or waits; fails after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        m = srv.metrics()
        if m["running"] == 0 and m["waiting"] == 0:
            return m
        assert time.monotonic() < deadline, f"requests still held after {timeout} s: {m}"
        time.sleep(0.5)


def _finished(m: dict[str, float]) -> float:
    """Requests the engine finished (any reason: stop, length, ...); an aborted one is
    not counted (vLLM's ``request_success_total``)."""
    return sum(v for k, v in m.items() if k.startswith("finished:"))


def test_a_client_that_drops_its_stream_frees_its_slot(openai_server):
    """The stream (200 tokens, no early stop) is dropped after 3 chunks while it is
    still running: the running count returns to 0 and the engine never finished it."""
    srv = openai_server
    before = _settles(srv)
    chunks = 0
    with httpx.Client(timeout=120) as c:
        with c.stream("POST", srv.base + COMP, json={"model": srv.model, **STREAM}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                chunks += line.startswith("data: {")
                if chunks == 3:
                    held = srv.metrics()
                    break  # leaving the block closes the connection mid-stream
    assert chunks == 3
    assert held["running"] + held["waiting"] == 1, held  # dropped while in flight
    after = _settles(srv)
    assert _finished(after) == _finished(before), (before, after)  # aborted, not finished
    _answers(srv)


def _open_stream(port: int, body: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    return s


def test_64_abandoned_streams_are_freed_and_others_are_served(openai_server):
    """64 streams opened at once and never read: another client is answered while they
    hold their slots; closed while all 64 are still in flight, they are aborted (the
    engine finishes none of them) and the running and waiting counts return to 0."""
    srv = openai_server
    body = json.dumps({"model": srv.model, **STREAM}).encode()
    before = _settles(srv)
    socks = [_open_stream(srv.port, body) for _ in range(64)]
    try:
        deadline = time.monotonic() + 90
        while True:  # all 64 in the engine (a stream's chunks wait unread in its socket)
            m = srv.metrics()
            if m["running"] + m["waiting"] >= 64:
                break
            assert time.monotonic() < deadline, f"the 64 streams did not all start: {m}"
            time.sleep(0.5)
        _answers(srv, CHAT)  # another client, while the 64 hold their slots
        held = srv.metrics()
    finally:
        for s in socks:
            s.close()
    assert held["running"] + held["waiting"] == 64, held  # all still in flight at the close
    after = _settles(srv, timeout=90)
    # the engine finished the other client's request and none of the 64
    assert _finished(after) == _finished(before) + 1, (before, after)
    _answers(srv, CHAT)
    _answers(srv, COMP)


def test_a_killed_model_worker_ends_the_stream_with_an_error_and_the_server_exits(tmp_path):
    """The cold server's model process (the engine core, which runs the worker)
    SIGKILLed (as the OOM killer would) while a stream
    is in flight: the stream ends with an error (vLLM's error event, or the connection
    closed), not a hang, and `vllm-x86 serve` exits non-zero with its whole group."""
    from vllm_x86.tools.bench.synthetic import build

    tiny = build("tiny-llama")
    srv = ServeProcess(
        str(tiny),
        ["--enforce-eager", "--max-model-len", "256", "--dtype", "float32",
         "--served-model-name", "tiny"],
        tmp_path / "server.log",
    )  # fmt: skip
    try:
        # the model runs in the engine-core process: no worker process of its own
        # (VLLM_X86_WORKER_IN_ENGINE); "VLLM::EngineCore", cut to 15 characters by comm
        names = srv.group_pids()
        assert "VLLM::Worker" not in names.values(), names
        workers = [pid for pid, comm in names.items() if comm.startswith("VLLM::EngineCor")]
        assert len(workers) == 1, names
        events: list[str] = []
        ended = threading.Event()
        failure: list[BaseException] = []

        def read():
            try:
                with httpx.Client(timeout=httpx.Timeout(60)) as c:
                    with c.stream("POST", srv.base + COMP, json={"model": "tiny", **STREAM}) as r:
                        assert r.status_code == 200
                        for line in r.iter_lines():
                            if line.startswith("data: "):
                                events.append(line[6:])
            except httpx.TransportError as e:  # the connection closed under it: an error
                failure.append(e)
            finally:
                ended.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 60
        while len(events) < 3:
            assert not ended.is_set(), f"the stream ended before the kill: {events}"
            assert time.monotonic() < deadline, "no tokens in 60 s"
            time.sleep(0.01)
        os.kill(workers[0], signal.SIGKILL)
        assert ended.wait(90), "the stream hangs after the worker was killed"
        assert not isinstance(failure[0] if failure else None, httpx.TimeoutException), failure
        finished = [json.loads(e) for e in events if e.startswith("{")]
        errors = [e for e in finished if "error" in e]
        done_normally = any(
            c.get("finish_reason") == "length" for e in finished for c in e.get("choices", [])
        )
        assert not done_normally, "the stream finished as if nothing happened"
        assert errors or failure, events[-3:]
        if errors:
            assert errors[0]["error"]["code"] >= 500, errors[0]
        code = srv.proc.wait(timeout=120)  # fails (TimeoutExpired) if the server hangs
        assert code != 0, f"the server exited 0 after its worker died:\n{srv.log()[-3000:]}"
        deadline = time.monotonic() + 30
        while srv.group_pids():
            assert time.monotonic() < deadline, f"left behind: {srv.group_pids()}"
            time.sleep(0.2)
    finally:
        srv.stop()
