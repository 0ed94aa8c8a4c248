"""The playground's back end, in process: the real FastAPI app (auth, path limits, load
checks, sampling validation, structured output, the proxy) against a fake model server
(httpx's MockTransport) and a fake backend where no daemon is needed. The real daemon,
model server and CLI process: tests/e2e/test_playground_server.py."""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from vllm_x86.tools.playground import models as M
from vllm_x86.tools.playground import structured
from vllm_x86.tools.playground.app import PlaygroundConfig, ProxyStream, create_app, parse_metrics
from vllm_x86.tools.playground.asgi import PlaygroundMiddleware
from vllm_x86.tools.playground.backend import DaemonBackend, Upstream

KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


def _safetensors(path: Path, tensors: dict[str, list[int]], pad: int = 0) -> None:
    header = {n: {"dtype": "BF16", "shape": s, "data_offsets": [0, 0]} for n, s in tensors.items()}
    raw = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        if pad:
            fh.truncate(fh.tell() + pad)  # sparse: a big file that takes no disk


def _model(path: Path, cfg: dict = LLAMA, tensors=None, pad: int = 0) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(cfg))
    _safetensors(path / "model.safetensors", tensors or {"w": [10, 20], "b": [5]}, pad)
    return path


class FakeBackend:
    """A backend that records loads; `up` is the model server it says is ready."""

    mode = "daemon"

    def __init__(self, up: Upstream | None = None):
        self.up = up
        self.loads: list[M.LoadPlan] = []

    def status(self) -> dict:
        return {"state": "ready" if self.up else "idle", "model": self.up and self.up.model,
                "mode": self.mode}  # fmt: skip

    def upstream(self):
        return self.up

    def current_rss(self) -> int:
        return 0

    def load(self, plan):
        self.loads.append(plan)
        return {"state": "starting", "model": plan.id, "precision": plan.precision}

    def unload(self):
        return {"state": "idle"}


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """A model cache and a --models-dir folder, each with models in it."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("VLLM_X86_CACHE_DIR", str(cache))
    cached = _model(cache / "models" / "my-llama")
    packed_cfg = dict(LLAMA, quantization_config={"quant_method": "x86_int8", "bits": 8})
    packed = _model(cache / "models" / "my-llama-int8", packed_cfg)
    (packed / "x86_quant.json").write_text("{}")
    extra = tmp_path / "mine"
    local = _model(extra / "local-llama")
    (extra / "not-a-model").mkdir()
    (extra / "not-a-model" / "readme.txt").write_text("x")
    _model(extra / "foo-model", dict(LLAMA, architectures=["FooForCausalLM"]))
    _model(extra / "huge", pad=2 << 40)  # 2 TiB of weights (sparse)
    outside = _model(tmp_path / "elsewhere" / "m")
    (extra / "sneaky").symlink_to(outside)
    return {"cache": cache, "cached": cached, "packed": packed, "extra": extra,
            "local": local, "outside": outside}  # fmt: skip


def _app(backend=None, key=KEY, extra=None, **kw):
    cfg = PlaygroundConfig(
        backend=backend or FakeBackend(),
        api_key=key,
        models_dirs=[str(extra)] if extra else [],
        supported_archs=lambda: frozenset({"LlamaForCausalLM"}),
        mem_available=lambda: 8 << 30,
        **kw,
    )
    return TestClient(create_app(cfg), base_url="http://127.0.0.1:7860")


# ----------------------------------------------------------------------------- auth


@pytest.mark.parametrize(
    "method,path",
    [("get", "/api/health"), ("get", "/api/models"), ("post", "/api/load"),
     ("get", "/api/status"), ("post", "/api/chat"), ("get", "/api/metrics"),
     ("post", "/api/validate"), ("get", "/api/examples"), ("get", "/api/server"),
     ("post", "/api/unload"), ("get", "/api/no-such-route")],
)  # fmt: skip
def test_every_api_route_needs_the_key(method, path):
    c = _app()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = getattr(c, method)(path, headers=headers)
        assert r.status_code == 401, (path, headers, r.text)
        assert "this playground has a key" in r.json()["error"]


def test_key_accepted_and_page_public():
    c = _app()
    r = c.get("/api/health", headers=AUTH)
    assert r.status_code == 200 and r.json() == {"ok": True}
    page = c.get("/")  # the page carries no secret: no key needed
    assert page.status_code == 200 and "<html" in page.text.lower()
    assert c.get("/api/health").status_code == 401


def test_no_key_no_check():
    c = _app(key=None)
    assert c.get("/api/health").json() == {"ok": True}
    r = c.get("/api/nope")
    assert r.status_code == 404 and r.json()["error"] == "no such API route: /api/nope"


def test_requests_from_another_site_are_refused():
    for key, auth in ((KEY, AUTH), (None, {})):
        c = _app(key=key)
        ok = c.get("/api/health", headers={**auth, "Origin": "http://127.0.0.1:7860"})
        assert ok.status_code == 200, ok.text  # the page's own requests
        for origin in ("http://evil.example", "null", "http://127.0.0.1:9999"):
            r = c.post("/api/load", json={"model": "x"}, headers={**auth, "Origin": origin})
            assert r.status_code == 403, (origin, r.text)
            assert "a request from another site" in r.json()["error"]
    # without a key: a name that resolves to 127.0.0.1 (DNS rebinding) is refused
    c = _app(key=None)
    r = c.get("/api/health", headers={"Host": "evil.example:7860"})
    assert r.status_code == 403 and "addressed to this machine only" in r.json()["error"]
    assert c.get("/api/health", headers={"Host": "localhost:7860"}).status_code == 200
    assert c.get("/api/health", headers={"Host": "[::1]:7860"}).status_code == 200
    # with a key, any Host (the key is what protects a playground on the network)
    r = _app().get("/api/health", headers={**AUTH, "Host": "box.lan:7860"})
    assert r.status_code == 200


# ----------------------------------------------------------------------------- models and paths


def test_models_lists_default_first_then_cache_prepacked_and_local(roots):
    c = _app(extra=roots["extra"])
    r = c.get("/api/models", headers=AUTH)
    assert r.status_code == 200, r.text
    data = r.json()
    ms = data["models"]
    assert ms[0]["id"] == data["default"] == "smollm2-135m-instruct-q4_1" and ms[0]["default"]
    assert ms[0]["source"] == "catalog" and ms[0]["pulled"] is False  # an empty cache
    assert ms[0]["quantization"] == "gguf q4_1 -> bf16" and ms[0]["params"] == 135_000_000
    by_path = {m["path"]: m for m in ms if m["path"]}
    cached = by_path[str(roots["cached"])]
    assert cached["source"] == "cache" and cached["architecture"] == "LlamaForCausalLM"
    assert cached["params"] == 10 * 20 + 5  # from the safetensors header
    assert cached["dtype"] == "bfloat16" and cached["size_bytes"] > 0
    packed = by_path[str(roots["packed"])]
    assert packed["source"] == "prepacked" and packed["quantization"] == "x86_int8"
    assert packed["params"] > 10_000  # from the config: the packed shapes are not counts
    local = by_path[str(roots["local"])]
    assert local["source"] == "local" and local["id"] == str(roots["local"])
    assert str(roots["extra"]) in data["roots"]
    assert not any("not-a-model" in p for p in by_path)


def test_models_show_what_vllm_x86_check_recorded(roots):
    """ "checked" is the verdict `vllm-x86 check` recorded for these weights: null when
    never checked, true or false after a run."""
    from vllm_x86.tools.conformance import check

    c = _app(extra=roots["extra"])

    def checked() -> dict:
        ms = c.get("/api/models", headers=AUTH).json()["models"]
        return {m["path"]: m["checked"] for m in ms if m["path"]}

    assert checked()[str(roots["cached"])] is None
    check.record_verdict(roots["cached"], {s: "ok" for s in check.STAGES})
    check.record_verdict(roots["local"], {"architecture": "ok", "ops": "FAIL"})
    got = checked()
    assert got[str(roots["cached"])] is True and got[str(roots["local"])] is False
    assert got[str(roots["packed"])] is None


def test_path_outside_the_roots_is_403_with_a_sentence(roots):
    c = _app(extra=roots["extra"])
    for path in (str(roots["outside"]), "/etc", str(roots["extra"] / "sneaky")):
        for route, body in (
            ("/api/load", {"model": path}),
            ("/api/models/inspect", {"path": path}),
        ):
            r = c.post(route, json=body, headers=AUTH)
            assert r.status_code == 403, (path, r.text)
            assert "outside the folders this playground may load from" in r.json()["error"]
            assert "--models-dir" in r.json()["error"]


def test_bad_paths_inside_the_roots_are_400(roots):
    c = _app(extra=roots["extra"])
    cases = {
        str(roots["extra"] / "not-a-model"): "has no config.json",
        str(roots["extra"] / "missing"): "does not exist",
        str(roots["extra"] / "not-a-model" / "readme.txt"): "is a file",
    }
    for path, words in cases.items():
        r = c.post("/api/load", json={"model": path}, headers=AUTH)
        assert r.status_code == 400 and words in r.json()["error"], (path, r.text)
    r = c.post("/api/load", json={"model": "some/relative"}, headers=AUTH)
    assert r.status_code == 400 and "neither a catalog name" in r.json()["error"]
    r = c.post("/api/load", json={"model": "nosuchmodel"}, headers=AUTH)
    assert r.status_code == 400 and "unknown model 'nosuchmodel'" in r.json()["error"]
    r = c.post("/api/models/inspect", json={"path": str(roots["local"])}, headers=AUTH)
    assert r.status_code == 200 and r.json()["architecture"] == "LlamaForCausalLM"


def test_load_checks_run_before_the_backend_is_touched(roots):
    fake = FakeBackend()
    c = _app(fake, extra=roots["extra"])
    bad = [
        ({"model": str(roots["local"]), "precision": "fp8"}, "precision must be one of"),
        ({"model": str(roots["local"]), "max_model_len": 8}, "between 16 and 131072"),
        ({"model": str(roots["local"]), "max_model_len": "big"}, "whole number"),
        ({"model": str(roots["local"]), "dtype": "x"}, "unknown field(s) dtype"),
        ({"model": str(roots["extra"] / "foo-model")}, "FooForCausalLM, an architecture vLLM does not implement"),
        ({"model": str(roots["extra"] / "huge")}, "too big for this machine's memory"),
        ({"model": str(roots["packed"]), "precision": "int4"}, "prepacked INT8 model"),
        ({"model": "smollm2-135m-instruct-q4_1"}, "not downloaded yet"),
    ]  # fmt: skip
    for body, words in bad:
        r = c.post("/api/load", json=body, headers=AUTH)
        assert 400 <= r.status_code < 500, (body, r.text)
        assert words in r.json()["error"], (body, r.json())
    assert fake.loads == []  # the model that serves was never stopped


def test_load_hands_the_plan_to_the_backend(roots):
    fake = FakeBackend()
    c = _app(fake, extra=roots["extra"])
    r = c.post("/api/load", json={"model": str(roots["local"]), "precision": "int4",
                                  "max_model_len": 2048}, headers=AUTH)  # fmt: skip
    assert r.status_code == 202 and r.json()["state"] == "starting", r.text
    plan = fake.loads[-1]
    assert plan.flags() == ["--max-model-len", "2048", "--quantization", "x86_int4"]
    assert plan.model == str(roots["local"])
    # a prepacked directory takes its own precision, with no --quantization
    r = c.post("/api/load", json={"model": str(roots["packed"]) + "/"}, headers=AUTH)
    assert r.status_code == 202 and r.json()["precision"] == "int8", r.text
    assert fake.loads[-1].quantization is None and fake.loads[-1].flags() == []


def test_without_a_daemon_status_and_load_say_so(tmp_path):
    b = DaemonBackend(daemon_dir=str(tmp_path / "d"), start_daemon=False)
    b.connect()
    st = b.status()
    assert st["state"] == "failed" and "no standby daemon runs" in st["error"]
    assert st["mode"] == "daemon"
    c = _app(b, key=None, extra=tmp_path)
    (tmp_path / "m").mkdir()
    _model(tmp_path / "m" / "x")
    r = c.post("/api/load", json={"model": str(tmp_path / "m" / "x")})
    assert r.status_code == 503 and "daemon start" in r.json()["error"]


def test_pull_state_of_catalog_models(roots):
    c = _app()
    r = c.get("/api/pull/smollm2-135m-instruct-q4_1", headers=AUTH)
    assert r.status_code == 200 and r.json()["state"] == "idle"  # the cache is empty here
    assert r.json()["message"] == "not downloaded"
    r = c.get("/api/pull/nosuch", headers=AUTH)
    assert r.status_code == 404 and "unknown model 'nosuch'" in r.json()["error"]
    r = c.post("/api/pull", json={"name": "nosuch"}, headers=AUTH)
    assert r.status_code == 400 and "unknown model 'nosuch'" in r.json()["error"]


# ----------------------------------------------------------------------------- chat proxy


class _Chunks(httpx.AsyncByteStream):
    """A streamed upstream body, chunk by chunk (as a real server's)."""

    def __init__(self, chunks: list[bytes]):
        self.chunks = chunks

    async def __aiter__(self):
        for c in self.chunks:
            yield c


def _upstream_transport(seen: list):
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.url.path, body, request.headers.get("authorization")))
        if body.get("temperature") == 1.5:
            return httpx.Response(400, json={"error": {"message": "upstream says no"}})
        if body.get("stream"):
            chunks = [b'data: {"choices":[{"delta":{"content":"Pa"}}]}\n\n',
                      b'data: {"choices":[{"delta":{"content":"ris"}}]}\n\n', b"data: [DONE]\n\n"]  # fmt: skip
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  stream=_Chunks(chunks))  # fmt: skip
        return httpx.Response(200, json={"choices": [{"message": {"content": "Paris"}}]})

    return httpx.MockTransport(handler)


def test_chat_is_proxied_with_the_model_and_key_filled_in():
    seen: list = []
    up = Upstream("http://model", "served-name", "upkey", max_model_len=512)
    c = _app(FakeBackend(up), transport=_upstream_transport(seen))
    msgs = [{"role": "user", "content": "capital of France?"}]
    r = c.post("/api/chat", json={"messages": msgs, "max_tokens": 8}, headers=AUTH)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Paris"
    assert seen[-1] == ("/v1/chat/completions", {"messages": msgs, "max_tokens": 8,
                                                 "model": "served-name"}, "Bearer upkey")  # fmt: skip
    r = c.post("/api/chat", json={"messages": msgs, "stream": True}, headers=AUTH)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.text.count("data: ") == 3 and r.text.endswith("data: [DONE]\n\n")
    r = c.post("/api/completions", json={"prompt": "The capital", "max_tokens": 4}, headers=AUTH)
    assert r.status_code == 200 and seen[-1][0] == "/v1/completions"
    r = c.post("/api/chat", json={"messages": msgs, "temperature": 1.5}, headers=AUTH)
    assert r.status_code == 400
    assert r.json()["error"] == "the model server refused the request: upstream says no"


@pytest.mark.parametrize(
    "extra,error",
    [({"temperature": 5}, "temperature must be between 0 and 2 (got 5)"),
     ({"temperature": True}, "temperature must be between 0 and 2 (got True)"),
     ({"top_p": 0}, "top_p must be above 0 and at most 1 (got 0)"),
     ({"top_k": 0}, "top_k must be -1 (off) or a whole number from 1 (got 0)"),
     ({"max_tokens": 513}, "max_tokens must be between 1 and 512 (got 513)"),
     ({"max_tokens": 0}, "max_tokens must be between 1 and 512 (got 0)"),
     ({"seed": 1.5}, "seed must be a whole number (got 1.5)"),
     ({"stop": ["a", "b", "c", "d", "e"]}, "stop must be at most 4 non-empty strings"),
     ({"stop": [""]}, "stop must be at most 4 non-empty strings"),
     ({"messages": []}, "messages must be a non-empty list")],
)  # fmt: skip
def test_sampling_is_validated_on_the_server(extra, error):
    seen: list = []
    c = _app(FakeBackend(Upstream("http://model", "m", None, 512)),
             transport=_upstream_transport(seen))  # fmt: skip
    body = {"messages": [{"role": "user", "content": "hi"}], **extra}
    r = c.post("/api/chat", json=body, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"].startswith(error), r.text
    assert seen == []  # never sent on


def test_chat_without_a_model_is_409():
    r = _app(FakeBackend(None)).post("/api/chat", json={"messages": [{"role": "user",
                                     "content": "hi"}]}, headers=AUTH)  # fmt: skip
    assert r.status_code == 409 and "no model is loaded" in r.json()["error"]
    r = _app(FakeBackend(None)).post("/api/chat", content=b"{nope", headers=AUTH)
    assert r.status_code == 400 and r.json()["error"] == "the request body is not JSON"


def test_stream_is_closed_upstream_when_the_browser_disconnects():
    """The stop button: the browser goes away mid-stream, and the upstream response is
    closed at once (which makes vLLM abort the request; the e2e test sees that)."""
    closed = asyncio.Event()

    class Endless(httpx.AsyncByteStream):
        async def __aiter__(self):
            while True:
                yield b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
                await asyncio.sleep(0.01)

        async def aclose(self):
            closed.set()

    async def run():
        transport = httpx.MockTransport(
            lambda req: httpx.Response(
                200, stream=Endless(), headers={"content-type": "text/event-stream"}
            )  # fmt: skip
        )
        client = httpx.AsyncClient(transport=transport)
        resp = await client.send(client.build_request("POST", "http://m/v1/x"), stream=True)
        sent: list = []
        gone = asyncio.Event()

        async def send(msg):
            sent.append(msg)
            if len(sent) == 4:
                gone.set()  # the browser's stop button, after three chunks

        async def receive():
            await gone.wait()
            return {"type": "http.disconnect"}

        await asyncio.wait_for(ProxyStream(resp, client)({"type": "http"}, receive, send), 5)
        return sent

    sent = asyncio.run(run())
    assert closed.is_set()
    assert sent[0]["type"] == "http.response.start" and len(sent) >= 4


# ----------------------------------------------------------------------------- structured output


def test_validate_uses_jsonschema_with_formats():
    c = _app()
    schema = next(s["schema"] for s in structured.SCHEMAS if "date" in s["name"])
    ok = c.post("/api/validate", json={"schema": schema,
                "text": '{"title": "launch", "date": "2026-12-05"}'}, headers=AUTH).json()  # fmt: skip
    assert ok == {"json_ok": True, "schema_ok": True, "errors": []}
    bad = c.post("/api/validate", json={"schema": schema,
                 "text": '{"title": "launch", "date": "2026-02-30"}'}, headers=AUTH).json()  # fmt: skip
    assert bad["json_ok"] and not bad["schema_ok"]
    assert bad["errors"] == ["$.date: '2026-02-30' is not a 'date'"]
    notjson = c.post("/api/validate", json={"schema": schema, "text": "{"}, headers=AUTH).json()
    assert notjson["json_ok"] is False and notjson["errors"][0].startswith("the text is not JSON")
    r = c.post("/api/validate", json={"schema": {"type": "nonsense"}, "text": "{}"}, headers=AUTH)
    assert r.status_code == 400 and "not a valid JSON Schema" in r.json()["error"]
    shop = next(s["schema"] for s in structured.SCHEMAS if "shopping" in s["name"])
    long = {"items": ["a", "b", "c", "d", "e", "f"]}
    out = c.post("/api/validate", json={"schema": shop, "text": json.dumps(long)}, headers=AUTH)
    assert out.json()["errors"] == [f"$.items: {long['items']!r} is too long"]
    rx = c.post("/api/validate", json={"regex": r"#[0-9a-f]{6}", "text": "#00ff00"}, headers=AUTH)
    assert rx.json()["schema_ok"] is True
    ch = c.post("/api/validate", json={"choice": ["yes", "no"], "text": "maybe"}, headers=AUTH)
    assert ch.json()["schema_ok"] is False


def test_examples_are_valid_and_cover_the_kinds():
    from jsonschema import Draft202012Validator

    ex = _app().get("/api/examples", headers=AUTH).json()
    assert len(ex["schemas"]) >= 12 and len(ex["regex"]) >= 3 and len(ex["choice"]) >= 3
    text = json.dumps(ex["schemas"])
    for needle in ('"format": "date"', '"enum"', '"maxItems"', '"minItems"', '"address"'):
        assert needle in text
    for s in ex["schemas"]:
        Draft202012Validator.check_schema(s["schema"])
    import re

    for r in ex["regex"]:
        re.compile(r["pattern"])
    assert all(c["choices"] for c in ex["choice"])


# ----------------------------------------------------------------------------- metrics, server


def test_metrics_parsed_from_prometheus_text():
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        "# TYPE vllm:generation_tokens counter\n"
        'vllm:generation_tokens_total{engine="0",model_name="m"} 40.0\n'
        'vllm:generation_tokens_total{engine="1",model_name="m"} 2.0\n'
    )
    out = parse_metrics(text)
    assert out == {"running": 2.0, "waiting": 1.0, "kv_cache_usage": 0.25,
                   "prompt_tokens_total": None, "generation_tokens_total": 42.0}  # fmt: skip


def test_metrics_without_a_model_are_not_ok():
    r = _app(FakeBackend(None)).get("/api/metrics", headers=AUTH)
    assert r.status_code == 200 and r.json()["ok"] is False and r.json()["running"] is None


# ----------------------------------------------------------------------------- serve --playground


def test_middleware_mounts_the_playground_under_its_prefix(monkeypatch):
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    inner = Starlette(routes=[Route("/v1/models", lambda r: PlainTextResponse("vllm"))])
    monkeypatch.setattr("sys.argv", ["vllm-x86 serve", "--api-key", KEY])
    c = TestClient(PlaygroundMiddleware(inner), follow_redirects=False)
    assert c.get("/v1/models").text == "vllm"  # everything else is vLLM's
    r = c.get("/playground")
    assert r.status_code in (307, 308) and r.headers["location"].endswith("/playground/")
    assert c.get("/playground/").status_code == 200
    assert c.get("/playground/api/health").status_code == 401  # the server's key
    assert c.get("/playground/api/health", headers=AUTH).json() == {"ok": True}
    r = c.post("/playground/api/load", json={"model": "x"}, headers=AUTH)
    assert r.status_code == 409 and "serves one model" in r.json()["error"]


# ----------------------------------------------------------------------------- the command


def test_non_loopback_without_a_key_is_refused(monkeypatch, capsys):
    from vllm_x86.tools.cli.main import main

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert main(["playground", "--host", "0.0.0.0", "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert "the playground will not listen on 0.0.0.0" in err and "Traceback" not in err
    assert main(["serve", "--playground", "--host", "0.0.0.0", "--port", "9"]) == 1
    assert "will not listen on 0.0.0.0" in capsys.readouterr().err


def test_models_dir_must_exist(tmp_path, capsys):
    from vllm_x86.tools.cli.main import main

    assert main(["playground", "--port", "0", "--models-dir", str(tmp_path / "none")]) == 1
    assert "no such folder" in capsys.readouterr().err
