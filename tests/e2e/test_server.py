"""`vllm-x86 serve` for real: a server process on a free loopback port, driven over HTTP.

One server (eager mode, 512-token context) serves every test in this module.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import httpx
import pytest

from tests.conftest import PYTHON, clean_env

pytestmark = pytest.mark.slow

MAX_LEN = 512
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a TCP socket in LISTEN state on `port` (from /proc)."""
    out = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(path).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state = fields[1], fields[3]
            addr, p = local.split(":")
            if int(p, 16) == port and state == "0A":
                out.add(addr)
    return out


@pytest.fixture(scope="module")
def server(default_model, tmp_path_factory):
    from vllm_x86.tools.ports import free_port

    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "vllm_x86.tools.cli",
            "serve",
            "--port",
            str(port),
            "--enforce-eager",
            "--max-model-len",
            str(MAX_LEN),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=clean_env(),
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited ({proc.returncode}):\n{log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"server not ready in 600 s:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.5)
        yield {"base": base, "port": port, "log": log_path, "proc": proc}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def test_listens_on_loopback_only_and_says_so(server):
    addrs = _listening_addresses(server["port"])
    assert addrs == {"0100007F"}, f"listening on {addrs}, expected 127.0.0.1 only"
    assert f"http://127.0.0.1:{server['port']}/v1" in server["log"].read_text()


def test_plugin_is_the_platform(server):
    log = server["log"].read_text()
    assert "vllm-x86 0.1.0: platform plugin active" in log
    assert "vllm-x86: compute threads on CPUs" in log


def test_model_processes_get_the_openmp_setting(server):
    """Where every core runs a model thread, libgomp in the server's processes reads
    GOMP_SPINCOUNT from their environment (defaults.omp_env); elsewhere nothing is set."""
    from vllm_x86.runtime import defaults

    expected, _ = defaults.omp_env(environ=clean_env())
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    group, titles = [], []
    for pid in pids:
        try:
            if os.getpgid(pid) == server["proc"].pid:
                env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
                titles.append(open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace"))
                group.append(
                    {k.decode(): v.decode() for k, _, v in (e.partition(b"=") for e in env) if k}
                )
        except (OSError, ProcessLookupError):
            continue
    # The API server and the engine core, which runs the model itself (the worker runs
    # inside it: VLLM_X86_WORKER_IN_ENGINE); a forked worker would make a third.
    assert len(group) >= 2, titles
    assert any("EngineCore" in t for t in titles), titles
    for env in group:
        assert env.get("GOMP_SPINCOUNT") == expected.get("GOMP_SPINCOUNT")
    log = server["log"].read_text()
    assert ("GOMP_SPINCOUNT=10000 for the model's OpenMP threads" in log) == bool(expected)


def _heap_returned(log: str, who: str, when: str) -> None:
    """The log line of runtime/heap.py from process `who` (vLLM's log prefix) for `when`,
    with figures that agree: resident before >= after, their difference the amount."""
    m = re.search(
        rf"\({who} pid=\d+\).*returned (\d+) MiB of freed heap to the system {when} "
        r"\(resident (\d+) -> (\d+) MiB",
        log,
    )
    assert m, log[-3000:]
    freed, before, after = (int(x) for x in m.groups())
    assert after <= before and abs((before - after) - freed) <= 1


def test_the_engine_returns_its_freed_heap_after_warm_up(server):
    # runtime/heap.py: once warm, the engine process hands the pages that loading and
    # warming up freed back to the system, and says how much in the log
    _heap_returned(server["log"].read_text(), "EngineCore", "after loading and warm-up")


def test_the_api_server_returns_the_heap_its_tokenizer_copies_freed(server):
    # patches/frontend_warmup.py: the copies go through a JSON round trip of the Rust
    # tokenizer; the API server gives the freed pages back once, and says so
    _heap_returned(server["log"].read_text(), "APIServer", "after the tokenizer copies")


def test_models(server):
    r = httpx.get(f"{server['base']}/v1/models", timeout=10)
    assert r.status_code == 200
    ids = [m["id"] for m in r.json()["data"]]
    assert ids == ["smollm2-135m-instruct-q4_1"]


def test_chat_completion(server):
    r = httpx.post(
        f"{server['base']}/v1/chat/completions",
        timeout=120,
        json={
            "model": "smollm2-135m-instruct-q4_1",
            "messages": QUESTION,
            "temperature": 0,
            "max_tokens": 16,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["content"].startswith("The capital of France is Paris.")
    assert body["usage"]["completion_tokens"] > 0


def test_chat_completion_streaming(server):
    chunks, done = [], False
    with httpx.stream(
        "POST",
        f"{server['base']}/v1/chat/completions",
        timeout=120,
        json={
            "model": "smollm2-135m-instruct-q4_1",
            "messages": QUESTION,
            "temperature": 0,
            "max_tokens": 16,
            "stream": True,
        },
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            payload = line[len("data: ") :]
            if payload == "[DONE]":
                done = True
                continue
            for choice in json.loads(payload)["choices"]:
                chunks.append(choice["delta"].get("content") or "")
    assert done
    assert len([c for c in chunks if c]) > 3  # it really streamed, token by token
    assert "".join(chunks).startswith("The capital of France is Paris.")


def test_completion(server):
    r = httpx.post(
        f"{server['base']}/v1/completions",
        timeout=120,
        json={
            "model": "smollm2-135m-instruct-q4_1",
            "prompt": "The capital of France is",
            "temperature": 0,
            "max_tokens": 8,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion"
    assert "Paris" in body["choices"][0]["text"]


def test_overlong_prompt_is_400_and_server_keeps_serving(server):
    prompt = "Paris is the capital of France. " * 200  # far over 512 tokens
    r = httpx.post(
        f"{server['base']}/v1/completions",
        timeout=120,
        json={"model": "smollm2-135m-instruct-q4_1", "prompt": prompt, "max_tokens": 8},
    )
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "512" in message and "token" in message.lower(), message
    test_chat_completion(server)


def test_malformed_json_is_400_and_server_keeps_serving(server):
    r = httpx.post(
        f"{server['base']}/v1/chat/completions",
        timeout=30,
        content=b'{"model": "smollm2-135m-instruct-q4_1", "messages": [',
        headers={"content-type": "application/json"},
    )
    assert 400 <= r.status_code < 500
    test_completion(server)


def _chat_cli(server, *args, stdin=None):
    return subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.cli", "chat", "--url", f"{server['base']}/v1", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
    )


def test_chat_cli_one_shot(server):
    p = _chat_cli(server, "-q", "What is the capital of France?")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("The capital of France is Paris.")
    assert "tokens/s]" in p.stderr


def test_chat_cli_interactive_keeps_the_conversation(server):
    p = _chat_cli(server, stdin="What is the capital of France?\nAnd of Italy?\n\n")
    assert p.returncode == 0, p.stderr
    answers = p.stdout.replace("> ", "")
    assert "Paris" in answers
    assert "Rome" in answers  # answering "And of Italy?" needs the first turn
