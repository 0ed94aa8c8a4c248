"""The standby daemon's control plane without vLLM: files, liveness, the control API's
answers to bad requests, shutdown, and reading a failed server's error from its log.

The daemon process here skips its warm-up (no torch or vLLM import), so these tests take
about a second; tests/e2e/test_daemon.py runs the real thing with models.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import PYTHON, clean_env
from vllm_x86.tools.daemon import client, paths
from vllm_x86.tools.daemon.server import error_from_log

# The daemon process of these tests: the real one, minus the imports.
NO_WARMUP = (
    "import sys; from vllm_x86.tools.daemon import server; "
    "server.Daemon.warm_up = lambda self: None; "
    "sys.exit(server.main(sys.argv[1:]))"
)


@pytest.fixture
def daemon_dir(tmp_path):
    return paths.files(tmp_path / "daemon")


@pytest.fixture
def light_daemon(daemon_dir):
    daemon_dir.root.mkdir(parents=True)
    log = open(daemon_dir.log, "w")
    # "vllm_x86.tools.daemon" must be on the command line: that is how a daemon is recognised
    proc = subprocess.Popen(
        [PYTHON, "-c", NO_WARMUP, "--dir", str(daemon_dir.root), "--port", "0"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=clean_env(),
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    try:
        while client.running(daemon_dir) is None:
            assert proc.poll() is None, daemon_dir.log.read_text()
            assert time.monotonic() < deadline, daemon_dir.log.read_text()
            time.sleep(0.05)
        yield daemon_dir, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def test_no_daemon_means_none(daemon_dir):
    assert client.running(daemon_dir) is None
    assert client.stop(daemon_dir) is False


def test_stale_pid_file_is_cleaned(daemon_dir):
    daemon_dir.root.mkdir(parents=True)
    # a pid that is alive but not a daemon (this test process), then a dead one
    for pid in (os.getpid(), 2**22 + 12345):
        daemon_dir.pid.write_text(str(pid))
        daemon_dir.state.write_text(f'{{"pid": {pid}, "port": 1}}')
        assert client.running(daemon_dir) is None
        assert not daemon_dir.pid.exists() and not daemon_dir.state.exists()


def test_pid_of_a_daemon_is_recognised(light_daemon):
    f, proc = light_daemon
    assert paths.read_pid(f) == proc.pid
    st = client.running(f)
    assert st["pid"] == proc.pid and st["server"] is None and st["dir"] == str(f.root)


def _port(f) -> int:
    return paths.read_state(f)["port"]


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"model": "/no/such/model/dir"}, "does not exist"),
        ({"model": 3}, "'model' must be a string"),
        ({"args": "--enforce-eager"}, "'args' must be a list"),
        ({"env": {"PATH": "/x"}}, "VLLM_* settings only"),
        ({"env": {"VLLM_X86_DISABLE": "1"}}, "VLLM_X86_DISABLE=1"),
    ],
)
def test_bad_serve_requests_are_400_with_a_message(light_daemon, body, fragment):
    f, proc = light_daemon
    code, out = client.request(_port(f), "POST", "/serve", body)
    assert code == 400 and fragment in out["error"], out
    assert client.running(f)["server"] is None  # nothing started, still answering


def test_a_directory_without_config_is_refused(light_daemon, tmp_path):
    f, _ = light_daemon
    (tmp_path / "notamodel").mkdir()
    code, out = client.request(_port(f), "POST", "/serve", {"model": str(tmp_path / "notamodel")})
    assert code == 400 and "no config.json" in out["error"]


def test_malformed_json_and_unknown_paths(light_daemon):
    import http.client

    f, _ = light_daemon
    conn = http.client.HTTPConnection("127.0.0.1", _port(f), timeout=5)
    conn.request("POST", "/serve", body=b'{"model": ', headers={"Content-Length": "10"})
    r = conn.getresponse()
    assert r.status == 400 and b"not JSON" in r.read()
    conn.close()
    assert client.request(_port(f), "GET", "/nope")[0] == 404
    assert client.request(_port(f), "POST", "/nope", {})[0] == 404
    assert client.running(f) is not None


def test_shutdown_removes_the_files_and_the_process(light_daemon):
    f, proc = light_daemon
    assert client.stop(f) is True
    assert proc.wait(timeout=10) == 0
    assert not f.pid.exists() and not f.state.exists()
    assert client.running(f) is None


def test_error_from_log_quotes_the_root_cause(tmp_path):
    log = tmp_path / "model.log"
    log.write_text(
        "(EngineCore pid=12) ERROR 12-02 21:00:00 [core.py:1] EngineCore failed to start.\n"
        "(EngineCore pid=12) Traceback (most recent call last):\n"
        '(EngineCore pid=12)   File "x.py", line 1, in f\n'
        "(EngineCore pid=12) safetensors_rust.SafetensorError: Error while deserializing "
        "header: header too large\n"
        "Traceback (most recent call last):\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    msg = error_from_log(log)
    assert msg.startswith("safetensors_rust.SafetensorError: Error while deserializing")
    assert msg.endswith("RuntimeError: Engine core initialization failed. See root cause above.")
    usage = tmp_path / "usage.log"
    usage.write_text("usage: vllm-x86 serve [-h]\n   [--dtype {auto}]\nvllm-x86 serve: error: "
                     "argument --dtype: invalid choice: 'x'\n")  # fmt: skip
    assert error_from_log(usage) == "vllm-x86 serve: error: argument --dtype: invalid choice: 'x'"
    empty = tmp_path / "empty.log"
    empty.write_text("")
    assert "printed nothing" in error_from_log(empty)
    assert "no log" in error_from_log(tmp_path / "missing.log")


def test_cli_status_and_stop_without_a_daemon(tmp_path):
    env = clean_env(VLLM_X86_DAEMON_DIR=str(tmp_path / "d"))
    r = subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.cli", "daemon", "status"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 3 and "no daemon is running" in r.stdout
    r = subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.cli", "daemon", "stop"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and "no daemon is running" in r.stderr


def test_daemon_refuses_to_start_with_the_plugin_disabled(tmp_path):
    env = clean_env(VLLM_X86_DAEMON_DIR=str(tmp_path / "d"), VLLM_X86_DISABLE="1")
    r = subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.cli", "daemon", "start"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and "VLLM_X86_DISABLE=1" in r.stderr
    assert not Path(tmp_path / "d" / "daemon.pid").exists()


def test_setting_rows_exist():
    from vllm_x86.runtime import envs

    names = {s.name for s in envs.SETTINGS}
    assert {"VLLM_X86_DAEMON_DIR", "VLLM_X86_DAEMON_PORT", "VLLM_X86_ENGINE_FORK"} <= names
    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    assert all(
        n in doc for n in ("VLLM_X86_DAEMON_DIR", "VLLM_X86_DAEMON_PORT", "VLLM_X86_ENGINE_FORK")
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["start", "--serve", "/nonexistent/model"],
            "model path '/nonexistent/model' does not exist",
        ),
        (["status", "--serve", "x"], "--serve goes with `vllm-x86 daemon start` only"),
    ],
)
def test_start_with_a_bad_model_fails_before_starting_a_daemon(tmp_path, args, message):
    env = clean_env(VLLM_X86_DAEMON_DIR=str(tmp_path))
    r = subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.cli", "daemon", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert message in r.stderr, r.stderr
    f = paths.files(tmp_path)
    assert not f.pid.exists() and client.running(f) is None


def test_a_taken_port_is_refused_before_anything_starts(light_daemon, tmp_path):
    import socket

    f, _ = light_daemon
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with socket.socket() as other:  # another program listens on the asked-for port
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        body = {"model": str(model), "args": ["--port", str(port)]}
        code, out = client.request(_port(f), "POST", "/serve", body)
    assert code == 409, out
    assert f"port {port} on 127.0.0.1 is in use by another program" in out["error"]
    assert client.running(f)["server"] is None  # nothing forked, still answering
