"""The standby daemon's control plane without vLLM: files and their modes, liveness, the
Unix socket and its key, the optional TCP listener's rule, the control API's answers to
bad requests, shutdown, and reading a failed server's error from its log.

The daemon process here skips its warm-up (no torch or vLLM import), so these tests take
about a second; tests/e2e/test_daemon.py runs the real thing with models.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import PYTHON, clean_env
from vllm_x86.tools.daemon import access, client, paths
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


def _start_light(f: paths.DaemonFiles, *args: str, key: str | None = None, code: str = ""):
    f.root.mkdir(parents=True, exist_ok=True)
    log = open(f.log, "w")
    env = clean_env()
    env.pop("VLLM_API_KEY", None)
    if key:
        env["VLLM_API_KEY"] = key
    # "vllm_x86.tools.daemon" must be on the command line: that is how a daemon is recognised
    proc = subprocess.Popen(
        [PYTHON, "-c", code + NO_WARMUP, "--dir", str(f.root), *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    log.close()
    deadline = time.monotonic() + 30
    while paths.read_state(f) is None:
        assert proc.poll() is None, f.log.read_text()
        assert time.monotonic() < deadline, f.log.read_text()
        time.sleep(0.05)
    return proc


def _end(proc) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture
def light_daemon(daemon_dir, monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    proc = _start_light(daemon_dir)
    try:
        yield daemon_dir, proc
    finally:
        _end(proc)


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


def test_the_daemon_is_its_owners_only(light_daemon):
    """Directory 0700; pid, state and socket 0600; the state names the socket, no port."""
    f, _ = light_daemon
    assert stat.S_IMODE(os.stat(f.root).st_mode) == 0o700
    for p in (f.pid, f.state, f.socket):
        st = os.stat(p)
        assert stat.S_IMODE(st.st_mode) == 0o600, (p, oct(st.st_mode))
        assert st.st_uid == os.geteuid()
    assert stat.S_ISSOCK(os.stat(f.socket).st_mode)
    state = paths.read_state(f)
    assert state["socket"] == str(f.socket) and state["tcp"] is None and not state["keyed"]


def test_an_existing_directory_is_made_private_and_another_users_is_refused(tmp_path):
    f = paths.files(tmp_path / "d")
    f.root.mkdir(mode=0o755)
    os.chmod(f.root, 0o755)
    old_log = f.model_log(1)
    old_log.write_text("an older version's log\n")
    os.chmod(old_log, 0o644)
    paths.private_dir(f)
    assert stat.S_IMODE(os.stat(f.root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(old_log).st_mode) == 0o600
    if os.geteuid() != 0:
        pytest.skip("giving the directory to another user needs root")
    os.chown(f.root, 65534, 65534)
    with pytest.raises(paths.DaemonError, match="belongs to uid 65534, not to you"):
        paths.private_dir(f)


def _raw(f: paths.DaemonFiles, data: bytes) -> tuple[int, dict]:
    """Send raw bytes on the daemon's socket: (HTTP status, JSON body)."""
    with socket.socket(socket.AF_UNIX) as s, paths.socket_address(f.socket) as addr:
        s.settimeout(15)
        s.connect(addr)
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/"):  # http.server answers a garbled request line bare
        return 400, json.loads(head)
    return int(head.split()[1]), json.loads(body)


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"model": "/no/such/model/dir"}, "model path '/no/such/model/dir' does not exist"),
        ({"model": "no-such-model"}, "unknown model 'no-such-model': no catalog name"),
        ({"model": 3}, "'model' must be a string"),
        ({"model": ["a"]}, "'model' must be a string"),
        ({"args": "--enforce-eager"}, "'args' must be a list of strings"),
        ({"args": ["--port", 8000]}, "'args' must be a list of strings"),
        ({"env": ["VLLM_X86_THREADS=2"]}, "'env' must map names to strings"),
        ({"env": {"VLLM_X86_THREADS": 2}}, "'env' must map names to strings"),
        ({"env": {"PATH": "/x"}}, "the daemon does not pass PATH to a model server"),
        (
            {"env": {"VLLM_PLUGINS": "x", "LD_PRELOAD": "y"}},
            "does not pass LD_PRELOAD, VLLM_PLUGINS",
        ),
        ({"env": {"VLLM_X86_DISABLE": "1"}}, "VLLM_X86_DISABLE=1"),
        ({"modle": "x"}, "unknown field(s) 'modle'"),
    ],
)
def test_bad_serve_requests_are_400_with_a_message(light_daemon, body, fragment):
    f, proc = light_daemon
    code, out = client.request(f, "POST", "/serve", body)
    assert code == 400 and fragment in out["error"], out
    assert client.running(f)["server"] is None  # nothing started, still answering


def test_a_directory_without_config_is_refused(light_daemon, tmp_path):
    f, _ = light_daemon
    (tmp_path / "notamodel").mkdir()
    code, out = client.request(f, "POST", "/serve", {"model": str(tmp_path / "notamodel")})
    assert code == 400 and "no config.json" in out["error"]


@pytest.mark.parametrize(
    "data, code, fragment",
    [
        (b'POST /serve HTTP/1.0\r\nContent-Length: 10\r\n\r\n{"model": ', 400, "not JSON"),
        (b"POST /serve HTTP/1.0\r\nContent-Length: 2\r\n\r\n[]", 400, "a JSON object"),
        (b"POST /serve HTTP/1.0\r\nContent-Length: x\r\n\r\n", 400, "not a byte count"),
        (b"POST /serve HTTP/1.0\r\nContent-Length: 99999999\r\n\r\n", 413, "at most"),
        (b"POST /stop-model HTTP/1.0\r\nContent-Length: 13\r\n\r\n{\"seq\": \"a\"}", 400,
         "'seq' must be"),
        (b"GET /nope HTTP/1.0\r\n\r\n", 404, "no such endpoint: GET /nope"),
        (b"POST /nope HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}", 404, "no such endpoint"),
        (b"DELETE /serve HTTP/1.0\r\n\r\n", 405, "not a method of this API"),
        (b"BREW /coffee HTTP/1.0\r\n\r\n", 501, "Unsupported method"),
        (b"garbage\r\n\r\n", 400, "Bad request"),
    ],
)  # fmt: skip
def test_malformed_requests_get_a_4xx_and_the_daemon_keeps_serving(
    light_daemon, data, code, fragment
):
    f, _ = light_daemon
    got, out = _raw(f, data)
    assert got == code and fragment in out["error"], (got, out)
    assert client.request(f, "GET", "/status")[0] == 200


def test_a_stalled_client_does_not_hold_the_daemon(daemon_dir, monkeypatch):
    """A connection that never finishes its request is dropped after the handler's
    timeout (REQUEST_TIMEOUT_S, 1 s here), and the next request is answered."""
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    proc = _start_light(
        daemon_dir, code="from vllm_x86.tools.daemon import server; server._Handler.timeout = 1; "
    )
    try:
        with socket.socket(socket.AF_UNIX) as s, paths.socket_address(daemon_dir.socket) as addr:
            s.connect(addr)
            s.sendall(b"POST /serve HTTP/1.0\r\nContent-Length: 100\r\n\r\n{")  # no more
            t0 = time.monotonic()
            code, _ = client.request(daemon_dir, "GET", "/status", timeout=30)
            assert code == 200 and time.monotonic() - t0 < 10
    finally:
        _end(proc)


def test_stop_model_names_the_server_it_means(light_daemon):
    f, _ = light_daemon
    code, out = client.request(f, "POST", "/stop-model", {"seq": 4})
    assert code == 409 and "model server 4 is not the daemon's current one" in out["error"]
    assert client.request(f, "POST", "/stop-model", {}) == (200, {"server": None})


def test_a_socket_path_longer_than_sun_path_works(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    f = paths.files(tmp_path / ("d" * 120))
    assert len(str(f.socket)) > paths.SUN_PATH_MAX
    proc = _start_light(f)
    try:
        st = client.running(f)
        assert st is not None and st["socket"] == str(f.socket)
        assert stat.S_ISSOCK(os.stat(f.socket).st_mode)
    finally:
        _end(proc)


# ----------------------------------------------------------------------------- the key


@pytest.fixture
def keyed_daemon(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    f = paths.files(tmp_path / "keyed")
    proc = _start_light(f, "--host", "127.0.0.1", "--port", "0", key="s3cret")
    try:
        yield f, proc
    finally:
        _end(proc)


def test_with_a_key_every_request_needs_it_on_the_socket_and_tcp(keyed_daemon, monkeypatch):
    f, _ = keyed_daemon
    state = paths.read_state(f)
    assert state["keyed"] and state["tcp"].startswith("http://127.0.0.1:")
    port = int(state["tcp"].rsplit(":", 1)[1])
    for where in (f, port):
        for key in (None, "wrong"):
            code, out = client.request(where, "GET", "/status", key=key)
            assert code == 401 and "this standby daemon has a key" in out["error"], out
            code, out = client.request(where, "POST", "/serve", {"model": "/x"}, key=key)
            assert code == 401, out  # refused before the request is looked at
        code, out = client.request(where, "GET", "/status", key="s3cret")
        assert code == 200 and out["keyed"] and out["tcp"] == state["tcp"]
    with pytest.raises(client.DaemonError, match="set it to the key the daemon was started with"):
        client.running(f)
    monkeypatch.setenv("VLLM_API_KEY", "s3cret")  # what the CLI sends
    assert client.running(f)["pid"] == state["pid"]


@pytest.mark.parametrize(
    "args, key, fragment",
    [
        (["--host", "0.0.0.0"], None, "will not listen on 0.0.0.0 (every network interface), "
         "port 0 without a key"),
        (["--port", "8123"], None, "any local user"),
        (["--host", "127.0.0.1", "--port", "8123"], None, "owner-only channel"),
    ],
)  # fmt: skip
def test_tcp_without_a_key_is_refused_before_anything_starts(tmp_path, args, key, fragment):
    env = clean_env(VLLM_X86_DAEMON_DIR=str(tmp_path / "d"))
    env.pop("VLLM_API_KEY", None)
    r = subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.cli", "daemon", "start", *args],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 1 and fragment in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "d" / "daemon.pid").exists()


def test_the_daemon_process_itself_refuses_tcp_without_a_key(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    f = paths.files(tmp_path / "d")
    f.root.mkdir()
    r = subprocess.run(
        [PYTHON, "-c", NO_WARMUP, "--dir", str(f.root), "--host", "0.0.0.0"],
        env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert "will not listen on 0.0.0.0" in r.stderr
    assert not f.pid.exists() and not f.socket.exists() and not f.state.exists()


# ----------------------------------------------------------------------------- environment


def test_the_environment_a_model_server_takes():
    assert {"VLLM_X86_THREADS", "VLLM_X86_KV_CACHE_GIB", "VLLM_API_KEY",
            "VLLM_CPU_KVCACHE_SPACE", "VLLM_CACHE_ROOT"} <= access.SERVE_ENV  # fmt: skip
    for name in ("VLLM_PLUGINS", "VLLM_LOGGING_CONFIG_PATH", "VLLM_SERVER_DEV_MODE",
                 "VLLM_X86_CHOSEN", "VLLM_X86_DAEMON_DIR", "PATH"):  # fmt: skip
        assert name not in access.SERVE_ENV
    passed, left = access.split_env(
        {"VLLM_X86_THREADS": "2", "VLLM_PLUGINS": "x", "VLLM_X86_DAEMON_DIR": "/d", "HOME": "/"}
    )
    assert passed == {"VLLM_X86_THREADS": "2"} and left == ["VLLM_PLUGINS"]


def test_the_client_sends_the_allowed_names_and_says_which_it_left(monkeypatch, capsys):
    for k in [k for k in os.environ if k.startswith("VLLM_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("VLLM_X86_KV_CACHE_GIB", "1")
    monkeypatch.setenv("VLLM_PLUGINS", "x")
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    assert client.serve_env() == {"VLLM_X86_KV_CACHE_GIB": "1"}
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "vllm-x86: not passed to the daemon's model server (not settings it takes, see "
        "docs/startup.md): VLLM_PLUGINS, VLLM_SERVER_DEV_MODE"
    ]


def test_startup_md_lists_the_names_the_daemon_passes():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "startup.md").read_text()
    missing = [n for n in access.VLLM_SERVE_ENV + access.NOT_FOR_A_MODEL_SERVER if n not in doc]
    assert not missing, missing


def test_shutdown_removes_the_files_and_the_process(light_daemon):
    f, proc = light_daemon
    assert client.stop(f) is True
    assert proc.wait(timeout=10) == 0
    assert not f.pid.exists() and not f.state.exists() and not f.socket.exists()
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
    died = tmp_path / "died.log"
    died.write_text(
        "(EngineCore pid=7) ERROR 12-05 08:53:39 [multiproc_executor.py:315] Worker proc "
        "VllmWorker-0 died unexpectedly (exit code: -9), shutting down executor.\n"
        "(EngineCore pid=7) ERROR 12-05 08:53:39 [core.py:1512] EngineCore encountered a fatal "
        "error.\n(APIServer pid=6) RuntimeError: cancelled\n"
    )
    assert error_from_log(died) == (
        "Worker proc VllmWorker-0 died unexpectedly (exit code: -9), shutting down executor. "
        "... RuntimeError: cancelled"
    )
    engine = tmp_path / "engine.log"
    engine.write_text(
        "(APIServer pid=6) WARNING 12-05 15:42:39 [core_client.py:817] [shutdown] MPClient: "
        "engine core exited unexpectedly; starting cleanup\n(APIServer pid=6) ERROR 12-05 "
        "15:42:39 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore "
        "encountered an issue. See stack trace (above) for the root cause.\n"
    )
    assert error_from_log(engine).startswith(
        "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup ... "
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."
    )
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
    f, _ = light_daemon
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with socket.socket() as other:  # another program listens on the asked-for port
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        body = {"model": str(model), "args": ["--port", str(port)]}
        code, out = client.request(f, "POST", "/serve", body)
    assert code == 409, out
    assert f"port {port} on 127.0.0.1 is in use by another program" in out["error"]
    assert client.running(f)["server"] is None  # nothing forked, still answering


def test_a_prepacked_directory_with_a_damaged_manifest_is_refused(light_daemon, tmp_path):
    """resolve_serve_model checks a prepacked directory (`vllm-x86 quantize`'s config and
    x86_quant.json) before vLLM starts (quant/format.py); the daemon answers that
    CliError with 400. The asked-for port is taken, so that if the check were missing
    the answer would be 409 and nothing would start."""
    from vllm_x86.runtime.quant import format as qf

    f, _ = light_daemon
    out = tmp_path / "int8"
    out.mkdir()
    qc = {"quant_method": "x86_int8", "bits": 8, "prepacked": True, "layout": "x",
          "format_version": qf.FORMAT_VERSION, "quantized_layers": []}  # fmt: skip
    (out / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                 "quantization_config": qc}))  # fmt: skip
    (out / "model.safetensors").write_bytes(b"\0" * 64)
    manifest = json.dumps({"format_version": qf.FORMAT_VERSION,
                           "files": {"model.safetensors": {"bytes": 64}}})  # fmt: skip
    (out / qf.MANIFEST).write_text(manifest[: len(manifest) // 2])  # cut short (a full disk)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        body = {"model": str(out), "args": ["--port", str(other.getsockname()[1])]}
        code, answer = client.request(f, "POST", "/serve", body)
    assert code == 400, answer
    assert qf.MANIFEST in answer["error"] and "quantize" in answer["error"], answer
    assert client.running(f)["server"] is None


# ----------------------------------------------------------------------------- serve's flags


def _serve_in_process(monkeypatch, tmp_path, *args):
    """`vllm-x86 serve` in this process, its exec of vLLM's server caught."""
    from vllm_x86.tools.cli import main

    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setenv("VLLM_X86_DAEMON_DIR", str(tmp_path / "no-daemon-here"))
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setattr("vllm_x86.runtime.defaults.apply_omp_env", lambda: {})

    def execv(exe, argv):
        raise SystemExit(0)

    monkeypatch.setattr(main.os, "execv", execv)
    try:
        return main.main(["serve", str(tmp_path), *args])
    except SystemExit as e:
        return e.code


def test_serve_on_the_network_without_a_key_warns_and_starts(monkeypatch, tmp_path, capsys):
    code = _serve_in_process(monkeypatch, tmp_path, "--host", "0.0.0.0", "--port", "8123")
    err = capsys.readouterr().err
    assert code == 0, err
    assert (
        "vllm-x86: warning: the OpenAI server listens on 0.0.0.0 (every network interface), "
        "port 8123 with no API key" in err
    )
    code = _serve_in_process(monkeypatch, tmp_path, "--host", "0.0.0.0", "--api-key", "k")
    assert code == 0 and "warning: the OpenAI server" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--detach"], "no daemon runs (`vllm-x86 daemon start` starts one)"),
        (["--detach", "--no-daemon"], "use one of them"),
    ],
)
def test_detach_needs_a_daemon(monkeypatch, tmp_path, capsys, args, fragment):
    code = _serve_in_process(monkeypatch, tmp_path, *args)
    err = capsys.readouterr().err
    assert code == 1 and fragment in err, err


def test_serve_notes_a_dead_daemon_then_starts_its_own(monkeypatch, tmp_path, capsys):
    f = paths.files(tmp_path / "no-daemon-here")
    f.root.mkdir()
    f.pid.write_text(str(2**22 + 4321))  # a daemon killed without cleaning up
    f.state.write_text("{}")
    code = _serve_in_process(monkeypatch, tmp_path)
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"vllm-x86: the standby daemon (pid {2**22 + 4321}) is gone" in err
    assert "starting a server of its own" in err and "vllm-x86: serving" in err
    assert not f.pid.exists() and not f.state.exists()


def test_a_cold_start_after_a_dead_daemon_waits_for_the_port_its_server_held():
    """The killed daemon's model server may hold its port for a moment while it shuts
    down: the cold start waits for it (bounded) instead of refusing at once."""
    import socket
    import threading

    from vllm_x86.tools.daemon import cli as daemon_cli
    from vllm_x86.tools.ports import free_port, port_free

    port = free_port()
    held = socket.socket()
    held.bind(("127.0.0.1", port))
    held.listen()
    threading.Timer(1.0, held.close).start()
    t0 = time.monotonic()
    daemon_cli._wait_port_released(["--model", "m", "--host", "127.0.0.1", "--port", str(port)])
    assert port_free(port, "127.0.0.1")
    assert 0.8 < time.monotonic() - t0 < daemon_cli.PORT_RELEASE_S


_LEADER_EXITS_FIRST = r"""
import ctypes, socket, sys, threading, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
threading.Thread(target=time.sleep, args=(60,)).start()
ctypes.CDLL(None).syscall(60, 0)  # SYS_exit: ends the main thread only (not exit_group)
"""


def test_a_group_whose_main_thread_ended_still_runs_while_a_thread_holds_its_socket():
    # A process can show as a zombie ("Z") while its other threads still exit: they keep
    # its files open, a server's listening socket among them. The daemon waits on
    # group_members before it calls a model server stopped and its port free.
    proc = subprocess.Popen(
        [PYTHON, "-c", _LEADER_EXITS_FIRST], stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        port = int(proc.stdout.readline())
        deadline = time.monotonic() + 10
        while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the main thread did not end"
            time.sleep(0.05)
        with socket.socket() as c:
            assert c.connect_ex(("127.0.0.1", port)) == 0  # the socket is still open
        assert paths.group_members(proc.pid) == [proc.pid]
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(10)
    assert paths.group_members(proc.pid) == []  # reaped: nothing of it runs
