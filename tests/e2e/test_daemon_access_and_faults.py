"""The standby daemon, owner only and under faults, for real.

One daemon with a key, listening on its Unix socket and on a loopback TCP port, serves
the module, in order: its files are its owner's only, and a client run as user `nobody`
cannot reach it (nor, with the directory opened up, get past its uid check: 403);
without the key every request is 401, with it 200, on the socket and on TCP; an
environment name it does not pass is 400; a model server whose worker is SIGKILLed in
the middle of a streamed answer gives the client an error (no hang), the daemon reports
the failure and the next `vllm-x86 serve` starts the model again; the daemon SIGKILLed
takes its model server with it, and the next `vllm-x86 serve` says so in one line and
serves cold. The model is the tiny random Llama (eager, float32), so starts take seconds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import PYTHON, clean_env
from tests.e2e.test_daemon import FLAGS, READY, Attached, _cli
from vllm_x86.tools.bench.server import stop_group
from vllm_x86.tools.daemon import client, paths
from vllm_x86.tools.ports import free_port

pytestmark = pytest.mark.slow

KEY = "e2e-daemon-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
# How long a client may wait for the answer to a request whose worker died.
FAULT_BOUND_S = 60

# Run as another user: only the standard library, from /usr/bin/python3 (the project's
# interpreter may live where that user cannot read).
OTHER_USER_CLIENT = """
import json, socket, sys
out = {}
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
try:
    s.connect(sys.argv[1])
except OSError as e:
    out["connect"] = type(e).__name__
else:
    out["connect"] = "ok"
    s.sendall(b"GET /status HTTP/1.0\\r\\nAuthorization: Bearer " + sys.argv[2].encode()
              + b"\\r\\n\\r\\n")
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\\r\\n\\r\\n")
    out["status"] = int(head.split()[1])
    out["body"] = json.loads(body)
print(json.dumps(out))
"""


@pytest.fixture(autouse=True)
def _the_key(monkeypatch):
    """What this process's client sends (client.running, as the CLI does)."""
    monkeypatch.setenv("VLLM_API_KEY", KEY)


@pytest.fixture(scope="module")
def tiny():
    from vllm_x86.tools.bench.synthetic import build

    return str(build("tiny-llama"))


@pytest.fixture(scope="module")
def daemon():
    # Under /tmp with a short name (pytest's own temporary directories are 0700, so
    # `nobody` could not get near the socket even with the daemon directory opened up).
    base = Path(tempfile.mkdtemp(prefix="vllm-x86-daemon-", dir="/tmp"))
    os.chmod(base, 0o711)
    root = base / "d"
    env = clean_env(VLLM_X86_DAEMON_DIR=str(root), VLLM_API_KEY=KEY)
    tcp = free_port()
    f = paths.files(root)
    r = _cli(env, "daemon", "start", "--port", str(tcp))  # loopback TCP: has a key
    assert r.returncode == 0, (
        r.stderr + "\n" + (f.log.read_text()[-3000:] if f.log.exists() else "")
    )
    assert f"and http://127.0.0.1:{tcp} (key required)" in r.stderr, r.stderr
    pid = paths.read_pid(f)
    info = {"env": env, "files": f, "pid": pid, "port": free_port(), "tcp": tcp,
            "groups": set(), "base": base}  # fmt: skip
    try:
        yield info
    finally:
        _cli(env, "daemon", "stop", timeout=120)
        for pg in info["groups"] | {pid}:
            try:
                os.killpg(pg, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        shutil.rmtree(base, ignore_errors=True)


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def _as_nobody(d) -> dict:
    script = d["base"] / "other_user_client.py"
    script.write_text(OTHER_USER_CLIENT)
    os.chmod(script, 0o644)
    r = subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
         "/usr/bin/python3", str(script), str(d["files"].socket), KEY],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_files_are_owner_only_and_another_user_is_refused(daemon):
    f = daemon["files"]
    assert _mode(f.root) == 0o700
    for p in (f.pid, f.state, f.socket, f.log):
        assert _mode(p) == 0o600, (p, oct(_mode(p)))
        assert os.stat(p).st_uid == os.geteuid()
    if os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"):
        pytest.skip("running a client as user nobody needs root, setpriv and /usr/bin/python3")
    # the directory keeps `nobody` from the socket: connecting is refused by the kernel
    assert _as_nobody(daemon) == {"connect": "PermissionError"}
    # with the directory and socket opened up, the daemon's own uid check answers 403
    try:
        os.chmod(f.root, 0o711)
        os.chmod(f.socket, 0o666)
        out = _as_nobody(daemon)
    finally:
        os.chmod(f.root, 0o700)
        os.chmod(f.socket, 0o600)
    assert out["connect"] == "ok" and out["status"] == 403, out
    assert "answers its owner (uid 0) only, and you are uid 65534" in out["body"]["error"]
    # the owner's client works
    code, st = client.request(f, "GET", "/status", key=KEY)
    assert code == 200 and st["pid"] == daemon["pid"] and st["keyed"]


def test_every_request_needs_the_key_on_the_socket_and_tcp(daemon):
    f = daemon["files"]
    for where in (f, daemon["tcp"]):
        for key in ("", "wrong"):
            code, out = client.request(where, "GET", "/status", key=key)
            assert code == 401 and "this standby daemon has a key" in out["error"], out
            code, out = client.request(where, "POST", "/shutdown", {}, key=key)
            assert code == 401, out
        code, st = client.request(where, "GET", "/status", key=KEY)
        assert code == 200 and st["tcp"] == f"http://127.0.0.1:{daemon['tcp']}"
    env = dict(daemon["env"])
    del env["VLLM_API_KEY"]
    r = _cli(env, "daemon", "status", timeout=60)
    assert r.returncode == 1 and "set it to the key the daemon was started with" in r.stderr
    assert "Traceback" not in r.stderr
    assert paths.is_daemon_process(daemon["pid"])  # still running after the refusals


def test_an_environment_name_it_does_not_pass_is_400(daemon, tiny):
    body = {"model": tiny, "env": {"VLLM_PLUGINS": "anything", "VLLM_X86_THREADS": "1"}}
    code, out = client.request(daemon["files"], "POST", "/serve", body, key=KEY)
    assert code == 400, out
    assert "the daemon does not pass VLLM_PLUGINS to a model server" in out["error"]
    code, st = client.request(daemon["files"], "GET", "/status", key=KEY)
    assert code == 200 and st["server"] is None


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _worker(server_pid: int) -> int:
    """The model server's process that runs the model: its engine core, where the worker
    runs (VLLM_X86_WORKER_IN_ENGINE; vLLM titles it VLLM::EngineCore), or a worker
    process of its own (VLLM::Worker) where the worker runs apart."""
    found = {}
    for p in _descendants(server_pid):
        try:
            found[open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")[0]] = p
        except OSError:
            pass
    for title in (b"VLLM::Worker", b"VLLM::EngineCore"):
        if title in found:
            return found[title]
    raise AssertionError(f"no VLLM::Worker or VLLM::EngineCore under model server {server_pid}")


def _ask(port: int) -> httpx.Response:
    return httpx.post(
        f"http://127.0.0.1:{port}/v1/completions",
        headers=AUTH,
        timeout=120,
        json={"model": "tiny", "prompt": "hello", "max_tokens": 4, "temperature": 0},
    )


def _state(d, want: tuple[str, ...], timeout: float = FAULT_BOUND_S) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        code, st = client.request(d["files"], "GET", "/status", key=KEY)
        assert code == 200, st
        srv = st["server"] or {}
        if srv.get("state") in want:
            return srv
        assert time.monotonic() < deadline, srv
        time.sleep(0.2)


def test_a_worker_killed_mid_stream_is_an_error_reported_and_serve_recovers(daemon, tiny, tmp_path):
    d = daemon
    env = dict(d["env"], VLLM_PLUGINS="not-for-the-daemon")
    a = Attached(dict(d, env=env), tmp_path, tiny)
    a.wait_for(READY)
    assert (
        "not passed to the daemon's model server (not settings it takes, see docs/startup.md): "
        "VLLM_PLUGINS" in a.text()
    )
    srv = _state(d, ("ready",))
    assert _mode(Path(srv["log"])) == 0o600
    # the key went to the model server too: vLLM's API wants it
    assert _ask(d["port"]).status_code == 200
    no_key = httpx.get(f"http://127.0.0.1:{d['port']}/v1/models", timeout=30)
    assert no_key.status_code == 401, no_key.text
    worker = _worker(srv["pid"])

    t0 = time.monotonic()
    lines, failure = [], None
    try:
        with httpx.stream(
            "POST",
            f"http://127.0.0.1:{d['port']}/v1/completions",
            headers=AUTH,
            timeout=FAULT_BOUND_S,
            json={"model": "tiny", "prompt": "hello", "max_tokens": 400, "stream": True,
                  "ignore_eos": True, "temperature": 0},
        ) as r:  # fmt: skip
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {") and not lines:
                    os.kill(worker, signal.SIGKILL)  # after the first token
                if line:
                    lines.append(line)
    except httpx.HTTPError as e:  # the connection dropped: an error too
        failure = repr(e)
    elapsed = time.monotonic() - t0
    assert elapsed < FAULT_BOUND_S + 10, elapsed
    errors = [x for x in lines if '"error"' in x]
    assert failure or errors, lines[-5:]
    assert not any('"finish_reason":"length"' in x for x in lines), lines[-5:]

    srv = _state(d, ("exited", "failed"))
    assert re.search(r"(died|exited) unexpectedly", srv["error"]), srv
    # the attached serve says so and exits non-zero
    assert a.wait(timeout=FAULT_BOUND_S) == 1, a.text()[-3000:]
    assert "stopped serving" in a.text() and "The daemon is still running" in a.text()
    deadline = time.monotonic() + 30  # the rest of its processes were killed
    while paths.group_members(srv["pid"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not paths.group_members(srv["pid"])

    again = Attached(d, tmp_path, tiny, name="tiny")
    again.wait_for(READY)
    d["attached"] = again  # serving when the next test kills the daemon
    assert _state(d, ("ready",))["seq"] == srv["seq"] + 1
    r = _ask(d["port"])
    assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text


def test_a_killed_daemon_takes_its_model_server_and_serve_starts_cold(daemon, tiny, tmp_path):
    d = daemon
    a = d.get("attached")
    if a is None or a.proc.poll() is not None:
        a = Attached(d, tmp_path, tiny)
        a.wait_for(READY)
    srv = _state(d, ("ready",))
    os.kill(d["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30  # the kernel tells the model server (die_with_parent)
    while paths.group_members(srv["pid"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not paths.group_members(srv["pid"]), "the model server outlived its daemon"
    assert a.wait(timeout=30) == 1
    assert f"the standby daemon (pid {d['pid']}) is gone" in a.text(), a.text()[-2000:]

    err = tmp_path / "cold.err"
    with open(err, "w") as fh:
        cold = subprocess.Popen(
            [PYTHON, "-m", "vllm_x86.tools.cli", "serve", tiny, "--port", str(d["port"]),
             *FLAGS, "--served-model-name", "tiny"],
            env=d["env"], stdout=subprocess.DEVNULL, stderr=fh, start_new_session=True,
        )  # fmt: skip
    d["groups"].add(cold.pid)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert cold.poll() is None, err.read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{d['port']}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, err.read_text()[-3000:]
            time.sleep(0.3)
        notes = [x for x in err.read_text().splitlines() if "is gone" in x]
        assert notes == [
            f"vllm-x86: the standby daemon (pid {d['pid']}) is gone (it left its files in "
            f"{d['files'].root}); starting a server of its own"
        ], notes
        r = _ask(d["port"])
        assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text
        assert not d["files"].pid.exists() and not d["files"].socket.exists()
    finally:  # the server may have exited already: the assertion above says why
        stop_group(cold, grace_s=60)
