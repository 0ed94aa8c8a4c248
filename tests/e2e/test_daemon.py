"""The standby daemon for real: a separate process, driven through the CLI and its socket.

One daemon (its own directory) serves the whole module, in order: start; `vllm-x86 serve
--detach` hands the default model to it; a second model replaces it on the same port; a
missing path and a corrupt checkpoint are refused with clear errors while the daemon stays
usable; greedy float32 output from the daemon equals a cold `vllm-x86 serve` and stock
vLLM CPU's server; `vllm-x86 serve` without --detach stays attached (the model server's
log on its stderr; Ctrl-C or SIGTERM stops that model server, a replacement ends it with a
sentence); `vllm-x86 demo` runs with the daemon; stop leaves no process, pid file,
socket or listening port behind. Every server is eager with a 512-token context, so the
module takes a few minutes. Owner-only access and faults: test_daemon_access_and_faults.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time

import httpx
import pytest

from tests.conftest import PYTHON, clean_env
from vllm_x86.tools.daemon import client, paths
from vllm_x86.tools.ports import free_port

pytestmark = pytest.mark.slow

FLAGS = ["--enforce-eager", "--max-model-len", "512", "--dtype", "float32"]
PROMPT = "The capital of France is"


def _cli(env, *args, timeout=600):
    return subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _greedy(base: str, model: str) -> str:
    r = httpx.post(
        f"{base}/v1/completions",
        timeout=120,
        json={"model": model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def _greedy_chat(base: str, model: str) -> str:
    """A chat answer: goes through the chat template the server resolved."""
    r = httpx.post(
        f"{base}/v1/chat/completions",
        timeout=120,
        json={
            "model": model,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 16,
            "temperature": 0,
        },
    )
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def _models(base: str) -> list[str]:
    return [m["id"] for m in httpx.get(f"{base}/v1/models", timeout=10).json()["data"]]


def _stop_daemon(env, groups) -> None:
    """`vllm-x86 daemon stop`, then SIGKILL to whatever process group it left."""
    _cli(env, "daemon", "stop", timeout=120)
    for pg in groups:
        try:
            os.killpg(pg, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.fixture(scope="module")
def daemon(default_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("daemon")
    env = clean_env(VLLM_X86_DAEMON_DIR=str(root))
    f = paths.files(root)
    r = _cli(env, "daemon", "start")
    assert r.returncode == 0, r.stderr + "\n" + f.log.read_text()[-3000:]
    st = client.running(f)
    info = {"env": env, "files": f, "pid": st["pid"], "port": free_port(), "groups": set()}
    try:
        yield info
    finally:
        _stop_daemon(env, info["groups"] | {info["pid"]})


def _serve(d, *args, extra=()):
    t0 = time.monotonic()
    r = _cli(d["env"], "serve", *args, "--port", str(d["port"]), *FLAGS, *extra, "--detach")
    st = client.running(d["files"])
    if st and st["server"] and st["server"]["pid"]:
        d["groups"].add(st["server"]["pid"])
    return r, time.monotonic() - t0, st


def test_daemon_is_a_separate_process_with_pid_file_and_socket_control(daemon):
    f = daemon["files"]
    assert paths.read_pid(f) == daemon["pid"] != os.getpid()
    assert paths.is_daemon_process(daemon["pid"])
    r = _cli(daemon["env"], "daemon", "status")
    assert r.returncode == 0 and f"pid {daemon['pid']}" in r.stdout, r.stdout
    assert f"control {f.socket} (owner only)" in r.stdout
    assert "X86Platform" in r.stdout
    st = json.loads(_cli(daemon["env"], "daemon", "status", "--json").stdout)
    assert st["server"] is None and st["warm_s"] > 0


def test_serve_hands_the_default_model_to_the_daemon(daemon):
    r, secs, st = _serve(daemon)
    assert r.returncode == 0, r.stderr
    assert "standby daemon" in r.stderr
    srv = st["server"]
    assert srv["state"] == "ready" and srv["port"] == daemon["port"]
    assert srv["pid"] != daemon["pid"]
    base = f"http://127.0.0.1:{daemon['port']}"
    assert _models(base) == ["smollm2-135m-instruct-q4_1"]
    daemon["daemon_text"] = _greedy(base, "smollm2-135m-instruct-q4_1")
    assert "Paris" in daemon["daemon_text"]
    log = open(srv["log"]).read()
    assert "engine-core and worker processes start by fork" in log
    # the forked worker pinned its threads itself (vLLM's binding cannot reach it)
    pinned = re.search(r"OpenMP threads pinned to CPUs \[([-\d, ]+)\]", log)
    assert pinned and "-1" not in pinned.group(1), log[-3000:]
    assert "platform plugin active" in log
    # the tokenizer copies and the chat-template lookup ran beside the engine start
    # (runtime/patches/frontend_warmup.py), and chat works after it
    assert re.search(r"tokenizer copies and processor chat-template lookup.* done beside", log), (
        log[-3000:]
    )
    assert "Paris" in _greedy_chat(base, "smollm2-135m-instruct-q4_1")
    print(f"\ndaemon-served default model ready {secs:.1f} s after `serve`")


def test_serving_another_model_replaces_the_first(daemon):
    from vllm_x86.tools.bench.synthetic import build

    first = client.running(daemon["files"])["server"]
    tiny = build("tiny-llama")
    r, secs, st = _serve(daemon, str(tiny), "--served-model-name", "tiny")
    assert r.returncode == 0, r.stderr
    assert st["server"]["seq"] == first["seq"] + 1 and st["server"]["state"] == "ready"
    assert _models(f"http://127.0.0.1:{daemon['port']}") == ["tiny"]
    assert not paths.group_members(first["pid"])  # the first server's processes are gone


def test_missing_model_path_is_a_clear_error_and_the_daemon_keeps_serving(daemon):
    r, _, st = _serve(daemon, "/no/such/model")
    assert r.returncode == 1
    assert "model path '/no/such/model' does not exist" in r.stderr
    # the same through the control API directly
    code, out = client.request(daemon["files"], "POST", "/serve", {"model": "/no/such/model"})
    assert code == 400 and "does not exist" in out["error"]
    assert client.running(daemon["files"])["server"]["state"] == "ready"  # tiny still serves
    assert _models(f"http://127.0.0.1:{daemon['port']}") == ["tiny"]


def test_flags_vllm_refuses_are_a_clear_error(daemon):
    r, _, st = _serve(daemon, extra=("--dtype", "nonsense"))
    assert r.returncode == 1
    assert "argument --dtype: invalid choice: 'nonsense'" in r.stderr, r.stderr
    assert st["server"]["state"] == "failed"


def test_corrupt_checkpoint_is_a_clear_error_and_the_daemon_stays_usable(
    daemon, default_model, tmp_path
):
    bad = tmp_path / "corrupt"
    shutil.copytree(default_model, bad)
    for w in bad.glob("*.safetensors"):
        w.write_bytes(b"\x00\x01 not a safetensors file" * 10)
    r, _, st = _serve(daemon, str(bad))
    assert r.returncode == 1
    assert "did not start" in r.stderr and "The daemon is still running" in r.stderr, r.stderr
    assert "Error" in r.stderr  # the error read from the server's log
    assert st["server"]["state"] == "failed" and st["server"]["error"]
    deadline = time.monotonic() + 15  # its processes were SIGKILLed as it failed
    while paths.group_members(st["server"]["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not paths.group_members(st["server"]["pid"])  # nothing of it left running
    # and the next request works
    r, _, st = _serve(daemon)
    assert r.returncode == 0, r.stderr
    assert "Paris" in _greedy(f"http://127.0.0.1:{daemon['port']}", "smollm2-135m-instruct-q4_1")


def _one_server(cmd, env, model_name):
    port = free_port()
    proc = subprocess.Popen(
        [*cmd, "--port", str(port), *FLAGS],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.3)
        return _greedy(base, model_name), _greedy_chat(base, model_name)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_greedy_output_equals_cold_and_stock_servers(daemon, default_model):
    base = f"http://127.0.0.1:{daemon['port']}"
    daemon_text = (
        _greedy(base, "smollm2-135m-instruct-q4_1"),
        _greedy_chat(base, "smollm2-135m-instruct-q4_1"),
    )
    # one engine at a time on the machine: stop the daemon's server first
    code, _ = client.request(daemon["files"], "POST", "/stop-model", {}, timeout=120)
    assert code == 200
    cold = _one_server(
        [PYTHON, "-m", "vllm_x86.tools.cli", "serve", "--no-daemon"],
        daemon["env"],
        "smollm2-135m-instruct-q4_1",
    )
    stock = _one_server(
        [PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(default_model),
         "--served-model-name", "stock"],
        clean_env(VLLM_X86_DISABLE="1", VLLM_CPU_KVCACHE_SPACE="1"),
        "stock",
    )  # fmt: skip
    assert daemon_text == cold == stock, (daemon_text, cold, stock)


class Attached:
    """`vllm-x86 serve` without --detach, in the background: its stderr in a file."""

    count = 0

    def __init__(self, d, tmp_path, *args, name="tiny"):
        Attached.count += 1
        self.err = tmp_path / f"serve-{Attached.count}-{name}.err"
        # the order of _serve's command line: the same flags are the same server
        cmd = [PYTHON, "-m", "vllm_x86.tools.cli", "serve", *args, "--port", str(d["port"]),
               *FLAGS, "--served-model-name", name]  # fmt: skip
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                cmd, env=d["env"], stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
            )
        self.d = d

    def text(self) -> str:
        return self.err.read_text(errors="replace")

    def wait_for(self, fragment: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while fragment not in self.text():
            assert self.proc.poll() is None, self.text()[-3000:]
            assert time.monotonic() < deadline, self.text()[-3000:]
            time.sleep(0.2)
        st = client.running(self.d["files"])
        if st and st["server"] and st["server"]["pid"]:
            self.d["groups"].add(st["server"]["pid"])

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


READY = "Ctrl-C stops this model server; the daemon stays warm."


def test_serve_stays_attached_and_ctrl_c_stops_only_its_model_server(daemon, tmp_path):
    from vllm_x86.tools.bench.synthetic import build

    a = Attached(daemon, tmp_path, str(build("tiny-llama")))
    a.wait_for(READY)
    err = a.text()
    # the model server's own log, from its first line, on serve's stderr
    assert "$ vllm-x86 serve (daemon) --model" in err and "Application startup complete" in err
    srv = client.running(daemon["files"])["server"]
    assert srv["state"] == "ready"
    assert _models(f"http://127.0.0.1:{daemon['port']}") == ["tiny"]
    assert a.proc.poll() is None  # still attached while the model serves
    os.killpg(a.proc.pid, signal.SIGINT)
    assert a.wait() == 0, a.text()[-3000:]
    assert f"SIGINT: stopping model server {srv['seq']}" in a.text()
    assert f"model server {srv['seq']} stopped" in a.text()
    st = client.running(daemon["files"])  # the daemon stays, its model server is gone
    assert st["pid"] == daemon["pid"] and st["server"]["state"] == "stopped"
    assert not paths.group_members(srv["pid"])
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", daemon["port"])) != 0


def test_a_replacement_ends_the_attached_serve_and_sigterm_stops_the_new_one(daemon, tmp_path):
    from vllm_x86.tools.bench.synthetic import build

    tiny = str(build("tiny-llama"))
    first = Attached(daemon, tmp_path, tiny, name="first")
    first.wait_for(READY)
    seq = client.running(daemon["files"])["server"]["seq"]
    r, _, st = _serve(daemon, tiny, extra=("--served-model-name", "second"))  # --detach
    assert r.returncode == 0, r.stderr
    assert "keeps serving after this command returns (--detach)" in r.stderr
    assert first.wait() == 1
    assert f"another request replaced model server {seq} ({tiny})" in first.text()
    assert st["server"]["seq"] == seq + 1 and st["server"]["state"] == "ready"
    # attaching to the server that runs already: its log from now on, SIGTERM stops it
    again = Attached(daemon, tmp_path, tiny, name="second")
    again.wait_for(READY, timeout=60)
    assert "already serving this model" in again.text()
    assert "Application startup complete" not in again.text()
    assert client.running(daemon["files"])["server"]["seq"] == seq + 1
    os.killpg(again.proc.pid, signal.SIGTERM)
    assert again.wait() == 0, again.text()[-3000:]
    assert "SIGTERM: stopping model server" in again.text()
    assert client.running(daemon["files"])["server"]["state"] == "stopped"


def test_demo_runs_with_the_daemon_and_leaves_it_warm(daemon):
    r = _cli(daemon["env"], "demo", "--max-tokens", "16", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "A: The capital of France is Paris." in r.stdout, r.stdout
    assert f"the standby daemon (pid {daemon['pid']}) serves it" in r.stderr
    assert "4/4 stop the server" in r.stderr and "Traceback" not in r.stderr
    st = client.running(daemon["files"])
    assert st["pid"] == daemon["pid"] and st["server"]["state"] == "stopped"
    port = int(re.search(r"start the server on http://127\.0\.0\.1:(\d+)", r.stderr).group(1))
    assert st["server"]["port"] == port
    with socket.socket() as s:  # the demo's model server is gone
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_stop_leaves_nothing_behind(daemon):
    f = daemon["files"]
    groups = set(daemon["groups"])
    r = _cli(daemon["env"], "daemon", "stop", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "daemon stopped" in r.stderr
    assert not f.pid.exists() and not f.state.exists() and not f.socket.exists()
    assert not paths.is_daemon_process(daemon["pid"])
    for pg in groups | {daemon["pid"]}:
        left = paths.group_members(pg)
        cmds = []
        for pid in left:
            try:
                cmds.append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" "))
            except OSError:
                pass
        assert not left, f"process group {pg} still has processes: {cmds}"
    with socket.socket() as s:  # the model server's port is free again
        assert s.connect_ex(("127.0.0.1", daemon["port"])) != 0
    r = _cli(daemon["env"], "daemon", "status")
    assert r.returncode == 3


def test_start_with_a_model_preloads_it_and_serve_then_answers_at_once(tmp_path):
    from vllm_x86.tools.bench.synthetic import build

    env = clean_env(VLLM_X86_DAEMON_DIR=str(tmp_path))
    f = paths.files(tmp_path)
    tiny = str(build("tiny-llama"))
    port = str(free_port())
    args = [tiny, "--served-model-name", "tiny", "--port", port, *FLAGS]
    r = _cli(env, "daemon", "start", "--serve", *args)
    pids = set()
    try:
        assert r.returncode == 0, r.stderr + "\n" + f.log.read_text()[-3000:]
        st = client.running(f)
        pids = {st["pid"], st["server"]["pid"]}
        assert st["server"]["state"] == "ready" and st["server"]["seq"] == 1
        assert _models(f"http://127.0.0.1:{port}") == ["tiny"]
        # the same model and flags: the preloaded server, not a new one
        r = _cli(env, "serve", *args, "--detach")
        assert r.returncode == 0, r.stderr
        assert "already serving this model" in r.stderr
        assert client.running(f)["server"]["seq"] == 1
        assert _models(f"http://127.0.0.1:{port}") == ["tiny"]
    finally:
        _stop_daemon(env, pids)


def test_keep_alive_leaves_the_model_loaded_and_the_next_serve_attaches(tmp_path):
    # `daemon start --keep-alive S`: Ctrl-C on serve leaves its model server loaded and
    # answering; a serve of the same model and flags attaches to that server (the same
    # one, at once); with no serve attached it stops after S seconds.
    from vllm_x86.tools.bench.synthetic import build

    root = tmp_path / "d"
    env = clean_env(VLLM_X86_DAEMON_DIR=str(root))
    f = paths.files(root)
    d = {"env": env, "files": f, "port": free_port(), "groups": set()}
    tiny = str(build("tiny-llama"))
    r = _cli(env, "daemon", "start", "--keep-alive", "12")
    pids = set()
    try:
        assert r.returncode == 0, r.stderr + "\n" + f.log.read_text()[-3000:]
        assert client.running(f)["keep_alive_s"] == 12
        a = Attached(d, tmp_path, tiny)
        a.wait_for("Ctrl-C leaves this model server loaded for 12 s (keep-alive)")
        srv = client.running(f)["server"]
        pids = {client.running(f)["pid"], srv["pid"]}
        os.killpg(a.proc.pid, signal.SIGINT)
        assert a.wait() == 0, a.text()[-3000:]
        assert f"model server {srv['seq']} ({tiny}) stays loaded for 12 s" in a.text()
        base = f"http://127.0.0.1:{d['port']}"
        assert _models(base) == ["tiny"]  # still answering after its serve left
        st = client.running(f)["server"]
        assert st["state"] == "ready" and st["seq"] == srv["seq"] and st["idle_s_left"] > 0
        out = _cli(env, "daemon", "status").stdout
        assert "keep-alive 12 s" in out and "kept loaded without a serve" in out, out
        t0 = time.monotonic()
        b = Attached(d, tmp_path, tiny)
        b.wait_for("already serving this model")
        b.wait_for("Ctrl-C leaves this model server loaded")
        attach_s = time.monotonic() - t0
        st = client.running(f)["server"]
        assert st["seq"] == srv["seq"] and st["idle_s_left"] is None  # attached: no timer
        assert attach_s < 10, attach_s  # a bound for a loaded machine, not a speed claim
        os.killpg(b.proc.pid, signal.SIGINT)
        assert b.wait() == 0, b.text()[-3000:]
        # nobody attaches again: stopped after the keep-alive, the port freed
        deadline = time.monotonic() + 60
        while client.running(f)["server"]["state"] == "ready":
            assert time.monotonic() < deadline, f.log.read_text()[-3000:]
            time.sleep(0.5)
        assert client.running(f)["server"]["state"] == "stopped"
        assert "kept loaded 12 s without a serve attached" in f.log.read_text()
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", d["port"])) != 0
    finally:
        _stop_daemon(env, pids)
