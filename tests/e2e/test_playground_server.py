"""`vllm-x86 playground` for real: the command, a standby daemon of its own (in a
temporary VLLM_X86_DAEMON_DIR), the default model served by it, over HTTP with a key.

In order, on one playground: the key is required on /api/*; the model list; loading the
default model and a streamed chat; the stop button (the browser drops a stream, and the
request stops running on vLLM's server); bad paths and an unsupported architecture
refused with a sentence while the loaded model still answers; an INT8 load; a model that
fails at load shown as failed with the server's error. Then: a non-loopback host without
a key is refused, and `vllm-x86 serve --playground` serves the page and its API under
/playground/. Every server is eager; the module takes a few minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import httpx
import pytest

from tests.conftest import PYTHON, clean_env
from tests.e2e.conftest import ServeProcess
from tests.e2e.playground_browser import Playground
from vllm_x86.tools.daemon import paths

pytestmark = pytest.mark.slow

KEY = "playground-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL = "smollm2-135m-instruct-q4_1"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _cli(env, *args, timeout=120):
    return subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.cli", *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pg(default_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("playground")
    mine = root / "mine"
    mine.mkdir()
    (mine / "not-a-model").mkdir()
    foo = mine / "foo-model"
    foo.mkdir()
    (foo / "config.json").write_text(json.dumps({"architectures": ["FooForCausalLM"]}))
    # a Llama config with no weights: passes every check, fails in the model server
    empty = mine / "no-weights"
    empty.mkdir()
    cfg = json.loads((default_model / "config.json").read_text())
    (empty / "config.json").write_text(json.dumps(cfg))
    env = clean_env()
    env.pop("VLLM_API_KEY", None)
    srv = Playground(root, env, args=("--api-key", KEY, "--models-dir", str(mine)))
    info = {"base": srv.base, "env": srv.env, "root": root, "mine": mine, "proc": srv.proc,
            "log": srv.log_path}  # fmt: skip
    try:
        yield info
    finally:
        srv.stop()  # the playground (which stops the daemon it started), then the daemon
        if info.get("model_pgid"):  # a model server the daemon could not stop
            try:
                os.killpg(info["model_pgid"], signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _get(pg, path, **kw):
    return httpx.get(pg["base"] + path, headers=AUTH, timeout=kw.pop("timeout", 30), **kw)


def _post(pg, path, body, **kw):
    return httpx.post(pg["base"] + path, headers=AUTH, json=body,
                      timeout=kw.pop("timeout", 60), **kw)  # fmt: skip


def _wait_state(pg, want=("ready", "failed"), timeout=300) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        st = _get(pg, "/api/status").json()
        if st["state"] in want:
            return st
        assert time.monotonic() < deadline, (st, pg["log"].read_text()[-3000:])
        time.sleep(0.5)


def _load(pg, body, timeout=400) -> dict:
    r = _post(pg, "/api/load", body)
    assert r.status_code == 202, r.text
    st = _wait_state(pg, timeout=timeout)
    if st.get("daemon") and st["state"] == "ready":
        srv = json.loads(_cli(pg["env"], "daemon", "status", "--json").stdout)["server"]
        pg["model_pgid"] = srv["pid"]
        # the page's "copy as API request" snippets name the model server itself
        assert st["base_url"] == f"http://{srv['host']}:{srv['port']}", st
    return st


def _answer(pg, **extra) -> str:
    body = {"messages": QUESTION, "max_tokens": 16, "temperature": 0, **extra}
    r = _post(pg, "/api/chat", body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_key_required_on_every_api_route(pg):
    for path in ("/api/health", "/api/models", "/api/status", "/api/metrics"):
        r = httpx.get(pg["base"] + path, timeout=10)
        assert r.status_code == 401 and "this playground has a key" in r.json()["error"]
    r = httpx.post(pg["base"] + "/api/load", json={"model": MODEL}, timeout=10)
    assert r.status_code == 401
    r = httpx.get(pg["base"] + "/api/health", headers={"Authorization": "Bearer nope"}, timeout=10)
    assert r.status_code == 401
    assert httpx.get(pg["base"] + "/", timeout=10).status_code == 200  # the page is public


def test_models_list_the_default_model_first(pg, default_model):
    data = _get(pg, "/api/models").json()
    first = data["models"][0]
    assert first["id"] == data["default"] == MODEL and first["default"] and first["pulled"]
    assert first["path"] == str(default_model)
    assert first["architecture"] == "LlamaForCausalLM"
    assert 100e6 < first["params"] < 200e6 and first["size_bytes"] > 100e6
    assert str(pg["mine"]) in data["roots"]


def test_load_the_default_model_and_chat_streamed(pg):
    st = _load(pg, {"model": MODEL, "max_model_len": 2048})
    assert st["state"] == "ready", st
    assert st["model"] == MODEL and st["precision"] == "bf16" and st["max_model_len"] == 2048
    assert st["mode"] == "daemon" and st["daemon"]["started_by_playground"] is True
    body = {"messages": QUESTION, "max_tokens": 16, "temperature": 0, "stream": True}
    with httpx.stream("POST", pg["base"] + "/api/chat", headers=AUTH, json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in map(json.loads, events[:-1])
        if c["choices"]
    )
    assert "Paris" in text, text


def test_stop_mid_stream_aborts_the_request_on_the_server(pg):
    before = _get(pg, "/api/metrics").json()
    assert before["ok"] and before["running"] == 0, before
    body = {"messages": QUESTION, "max_tokens": 1500, "temperature": 0, "stream": True,
            "ignore_eos": True}  # fmt: skip
    chunks = 0
    with httpx.stream("POST", pg["base"] + "/api/chat", headers=AUTH, json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                chunks += 1
                if chunks == 5:
                    running = _get(pg, "/api/metrics").json()["running"]
                    break  # the stop button: the browser closes the connection
    assert running == 1, "the request was not running on the server while it streamed"
    t0 = time.monotonic()
    while True:
        m = _get(pg, "/api/metrics").json()
        if m["running"] == 0:
            break
        assert time.monotonic() - t0 < 10, f"still running on the server after the stop: {m}"
        time.sleep(0.2)
    time.sleep(1.0)
    after = _get(pg, "/api/metrics").json()
    made = after["generation_tokens_total"] - before["generation_tokens_total"]
    assert after["running"] == 0 and made < 1500, (made, after)  # it stopped generating
    assert after["generation_tokens_total"] == m["generation_tokens_total"]


def test_bad_paths_refused_while_the_loaded_model_answers(pg):
    cases = [
        ("/etc", 403, "outside the folders this playground may load from"),
        (str(pg["root"]), 403, "outside the folders"),
        (str(pg["mine"] / "not-a-model"), 400, "has no config.json"),
        (str(pg["mine"] / "missing"), 400, "does not exist"),
        (str(pg["mine"] / "foo-model"), 400, "FooForCausalLM, an architecture vLLM does not implement"),
    ]  # fmt: skip
    for path, status, words in cases:
        r = _post(pg, "/api/load", {"model": path})
        assert r.status_code == status and words in r.json()["error"], (path, r.text)
    r = _post(pg, "/api/load", {"model": MODEL, "precision": "fp4"})
    assert r.status_code == 400 and "precision must be one of" in r.json()["error"]
    st = _get(pg, "/api/status").json()
    assert st["state"] == "ready" and st["model"] == MODEL, st
    assert "Paris" in _answer(pg)
    r = _post(pg, "/api/chat", {"messages": QUESTION, "temperature": 5})
    assert r.status_code == 400
    assert r.json()["error"] == "temperature must be between 0 and 2 (got 5)"


def test_int8_load_answers(pg):
    st = _load(pg, {"model": MODEL, "precision": "int8", "max_model_len": 1024})
    assert st["state"] == "ready" and st["precision"] == "int8", st
    srv = json.loads(_cli(pg["env"], "daemon", "status", "--json").stdout)["server"]
    assert "x86_int8" in srv["args"]
    assert "Paris" in _answer(pg)


def test_failure_at_load_is_shown_as_a_sentence(pg):
    st = _load(pg, {"model": str(pg["mine"] / "no-weights"), "max_model_len": 512})
    assert st["state"] == "failed", st
    assert st["error"].startswith(f"{pg['mine'] / 'no-weights'} did not start: "), st
    r = _post(pg, "/api/chat", {"messages": QUESTION})
    assert r.status_code == 409 and "no model is loaded" in r.json()["error"]
    assert _post(pg, "/api/unload", {}).json() == {"state": "idle"}
    assert _get(pg, "/api/status").json()["state"] == "idle"


def test_server_view(pg):
    data = _get(pg, "/api/server", timeout=120).json()
    assert data["doctor"]["plugin"]["selected"] is True
    assert "threads" in data["doctor"]["plugin_choices"]
    assert "plugin" in data["doctor"]["doctor_text"].lower()
    assert data["status"]["mode"] == "daemon"


def test_serve_playground_through_the_daemon(pg):
    """`vllm-x86 serve --playground` handed to the daemon: the forked model server
    mounts the page too, and the playground of the daemon sees that model server."""
    from vllm_x86.tools.ports import free_port

    port = free_port()
    r = _cli(
        pg["env"], "serve", MODEL, "--playground", "--port", str(port), "--enforce-eager",
        "--max-model-len", "512", "--detach", timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"playground at http://127.0.0.1:{port}/playground/" in r.stderr
    base = f"http://127.0.0.1:{port}/playground"
    assert httpx.get(base + "/api/health", timeout=10).json() == {"ok": True}
    st = httpx.get(base + "/api/status", timeout=10).json()
    assert st["mode"] == "attached" and st["state"] == "ready" and st["model"] == MODEL
    mine = _get(pg, "/api/status").json()
    assert mine["state"] == "ready" and mine["max_model_len"] == 512


def test_exit_stops_the_daemon_it_started(pg):
    proc = pg["proc"]
    f = paths.files(pg["root"] / "daemon")
    pid = paths.read_pid(f)
    assert pid is not None and paths.is_daemon_process(pid)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=120) == 0
    deadline = time.monotonic() + 30
    while paths.is_daemon_process(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not paths.is_daemon_process(pid)
    assert "daemon stopped" in pg["log"].read_text()


def test_non_loopback_host_without_a_key_is_refused(tmp_path):
    env = clean_env(VLLM_X86_DAEMON_DIR=str(tmp_path / "daemon"))
    env.pop("VLLM_API_KEY", None)
    r = _cli(env, "playground", "--host", "0.0.0.0", "--port", "0")
    assert r.returncode == 1
    assert "the playground will not listen on 0.0.0.0" in r.stderr and "--api-key" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "daemon").exists()  # refused before anything started


def test_serve_playground_mounts_the_page_and_api(default_model, tmp_path):
    srv = ServeProcess(
        MODEL, ["--playground", "--enforce-eager", "--max-model-len", "512"],
        tmp_path / "serve.log",
    )  # fmt: skip
    try:
        r = httpx.get(srv.base + "/playground", timeout=10, follow_redirects=False)
        assert r.status_code in (307, 308) and r.headers["location"].endswith("/playground/")
        page = httpx.get(srv.base + "/playground/", timeout=10)
        assert page.status_code == 200 and "<html" in page.text.lower()
        assert httpx.get(srv.base + "/playground/api/health", timeout=10).json() == {"ok": True}
        st = httpx.get(srv.base + "/playground/api/status", timeout=10).json()
        assert st["state"] == "ready" and st["mode"] == "attached" and st["model"] == MODEL
        r = httpx.post(srv.base + "/playground/api/load", json={"model": MODEL}, timeout=10)
        assert r.status_code == 409 and "serves one model" in r.json()["error"]
        r = httpx.post(
            srv.base + "/playground/api/chat", timeout=120,
            json={"messages": QUESTION, "max_tokens": 16, "temperature": 0},
        )  # fmt: skip
        assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["message"]["content"]
        assert httpx.get(srv.base + "/v1/models", timeout=10).status_code == 200  # vLLM's own
    finally:
        srv.stop()
