"""What the CLI does with a daemon: start, stop, status, and hand `serve` over to it.

Light on purpose (standard library only, no vLLM import): `vllm-x86 serve` asks here
first whether a daemon runs, and that must cost milliseconds. The control API is HTTP
over the daemon's Unix socket (http.client with a connection that connects AF_UNIX);
every request carries VLLM_API_KEY as its bearer key when that is set.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time

from vllm_x86.runtime.defaults import apply_layer_name_env, apply_omp_env
from vllm_x86.tools.daemon import access
from vllm_x86.tools.daemon.paths import (
    DaemonError,
    DaemonFiles,
    files,
    group_members,
    is_daemon_process,
    open_private,
    private_dir,
    read_pid,
    read_state,
    remove_files,
    socket_address,
)

START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0
PROGRESS_EVERY_S = 5.0
# /stop-model waits for the server's own shutdown (the daemon's STOP_GRACE_S, 30 s).
STOP_MODEL_TIMEOUT_S = 120.0


def _say(msg: str) -> None:
    print(f"vllm-x86: {msg}", file=sys.stderr, flush=True)


class _UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over the daemon's Unix socket."""

    def __init__(self, path, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._socket_path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            with socket_address(self._socket_path) as addr:
                s.connect(addr)
        except BaseException:
            s.close()
            raise
        self.sock = s


def request(
    where: DaemonFiles | int,
    method: str,
    path: str,
    body: dict | None = None,
    timeout: float = 10.0,
    key: str | None = None,
) -> tuple[int, dict]:
    """One call to a daemon's control API: (HTTP status, JSON body). `where` is the
    daemon's directory (its Unix socket) or a loopback TCP port (a daemon started with
    --port). Sends `key`, else VLLM_API_KEY, as the bearer key. Raises OSError when
    nothing answers."""
    if isinstance(where, DaemonFiles):
        conn: http.client.HTTPConnection = _UnixHTTPConnection(where.socket, timeout)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", int(where), timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        headers.update(access.key_header(key))
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        raw = r.read()
        try:
            out = json.loads(raw or b"{}")
        except ValueError:
            out = {"error": raw.decode(errors="replace")}
        if not isinstance(out, dict):
            out = {"error": str(out)}
        return r.status, out
    except http.client.HTTPException as e:
        raise OSError(str(e)) from e
    finally:
        conn.close()


def _refused(code: int, out: dict) -> DaemonError:
    return DaemonError(out.get("error") or f"the standby daemon answered {code}")


def running(f: DaemonFiles | None = None) -> dict | None:
    """The running daemon's /status, or None when no daemon answers in this directory.
    Files a dead daemon left behind are removed. Raises DaemonError when the daemon
    answers but refuses this caller (401: no or a wrong key; 403: another user)."""
    f = f or files()
    pid = read_pid(f)
    if pid is None:
        return None
    if not is_daemon_process(pid):
        remove_files(f)
        return None
    state = read_state(f)
    if state is None or state.get("pid") != pid:
        return None  # alive but still warming up (not listening yet)
    try:
        code, status = request(f, "GET", "/status", timeout=5.0)
    except OSError:
        return None
    if code in (401, 403):
        raise _refused(code, status)
    return status if code == 200 else None


def gone(f: DaemonFiles | None = None) -> int | None:
    """The pid of a daemon that died without cleaning up (its pid file names no live
    daemon), or None."""
    f = f or files()
    pid = read_pid(f)
    return pid if pid is not None and not is_daemon_process(pid) else None


def tcp_settings(host: str | None, port: int | None) -> tuple[str | None, int | None]:
    """(host, port) of the optional TCP listener from `daemon start`'s flags and
    VLLM_X86_DAEMON_PORT; (None, None): the Unix socket only."""
    from vllm_x86.runtime import envs

    if port is None:
        port = int(envs.get("VLLM_X86_DAEMON_PORT") or 0)
    if host is None and not port:
        return None, None
    return host or "127.0.0.1", port


def start(
    port: int | None = None,
    f: DaemonFiles | None = None,
    host: str | None = None,
    api_key: str | None = None,
    keep_alive: float | None = None,
) -> dict:
    """Start a daemon in the background and wait until it answers; its /status. With
    `host` or `port` (or VLLM_X86_DAEMON_PORT) it also listens on TCP, which needs a
    key (`api_key`, else VLLM_API_KEY). `keep_alive`: VLLM_X86_DAEMON_KEEP_ALIVE for
    the daemon (seconds a model server stays loaded after its serve leaves)."""
    from vllm_x86.runtime import envs

    f = f or files()
    if envs.disabled():
        raise DaemonError(
            "VLLM_X86_DISABLE=1 is set: the daemon serves with the plugin only; unset it"
        )
    key = api_key or os.environ.get("VLLM_API_KEY") or None
    host, port = tcp_settings(host, port)
    if host is not None:
        access.check_tcp(host, port or 0, key)  # refused before paying for the warm-up
    st = running(f)
    if st is not None:
        _say(f"a daemon is already running (pid {st['pid']}, control {st['socket']})")
        return st
    pid = read_pid(f)
    if pid is not None and is_daemon_process(pid):
        raise DaemonError(
            f"a daemon (pid {pid}) is starting or not answering in {f.root}; "
            "`vllm-x86 daemon stop` stops it"
        )
    private_dir(f)
    remove_files(f)
    t0 = time.monotonic()
    # The daemon loads torch once and forks every model server from itself: the
    # OpenMP settings must be in its environment (docs/threads.md).
    env = dict(os.environ)
    apply_omp_env(env)
    apply_layer_name_env(env)  # before the daemon imports vLLM (VLLM_X86_CPP_WRAPPER)
    if key:  # in the environment, not on the command line other users can read
        env["VLLM_API_KEY"] = key
    if keep_alive is not None:
        env["VLLM_X86_DAEMON_KEEP_ALIVE"] = f"{keep_alive:g}"
    cmd = [sys.executable, "-m", "vllm_x86.tools.daemon", "--dir", str(f.root)]
    if host is not None:
        cmd += ["--host", host, "--port", str(port or 0)]
    log = open_private(f.log, os.O_WRONLY | os.O_APPEND)
    try:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        os.close(log)
    _say(f"starting the standby daemon (pid {proc.pid}): importing torch, vLLM and the plugin")
    next_note = t0 + PROGRESS_EVERY_S
    while True:
        if proc.poll() is not None:
            raise DaemonError(
                f"the daemon exited with code {proc.returncode} while starting "
                f"(log: {f.log}):\n{_tail(f.log)}"
            )
        state = read_state(f)
        if state is not None and state.get("pid") == proc.pid:
            try:
                code, st = request(f, "GET", "/status", timeout=5.0, key=key)
                if code == 200:
                    break
                raise _refused(code, st)
            except OSError:
                pass
        now = time.monotonic()
        if now - t0 > START_TIMEOUT_S:
            _kill_tree(proc.pid, None)
            raise DaemonError(f"the daemon did not start in {START_TIMEOUT_S:.0f} s (log: {f.log})")
        if now >= next_note:
            _say(f"  still warming up ({now - t0:.0f} s)")
            next_note = now + PROGRESS_EVERY_S
        time.sleep(0.1)
    where = f"{st['socket']} (owner only)"
    if st.get("tcp"):
        where += f" and {st['tcp']} (key required)"
    elif st.get("keyed"):
        where += ", key required"
    _say(
        f"daemon ready in {time.monotonic() - t0:.1f} s: pid {st['pid']}, control "
        f"{where}, log {f.log}"
    )
    return st


def stop(f: DaemonFiles | None = None) -> bool:
    """Stop the daemon and its model server; False when none was running."""
    f = f or files()
    pid = read_pid(f)
    if pid is None or not is_daemon_process(pid):
        remove_files(f)
        return False
    state = read_state(f)
    model_pgid = None
    asked = False
    if state is not None and state.get("pid") == pid:
        try:
            code, st = request(f, "GET", "/status", timeout=5.0)
            if code == 200 and st.get("server"):
                model_pgid = st["server"].get("pid")
            asked = request(f, "POST", "/shutdown", {}, timeout=10.0)[0] == 200
        except OSError:
            pass
    if not asked:  # not answering, or refusing this caller: the owner may signal it
        os.kill(pid, signal.SIGTERM)
    _say(f"stopping the daemon (pid {pid})")
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while is_daemon_process(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if is_daemon_process(pid):
        _say(f"the daemon did not stop in {STOP_TIMEOUT_S:.0f} s: killing it")
        _kill_tree(pid, model_pgid)
    # Return only when no process of the daemon's or its model server's group is left
    # (one may still be exiting a moment after the daemon).
    groups = [g for g in (pid, model_pgid) if g is not None]
    deadline = time.monotonic() + 10.0
    while any(group_members(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.1)
    if any(group_members(g) for g in groups):
        _say("processes of the daemon were still running after it stopped: killing them")
        _kill_tree(pid, model_pgid)
    remove_files(f)
    _say("daemon stopped")
    return True


def _kill_tree(pid: int | None, model_pgid: int | None) -> None:
    for pg in (model_pgid, pid):
        if pg is None:
            continue
        try:
            os.killpg(pg, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    time.sleep(0.2)


def _tail(path, lines: int = 20) -> str:
    try:
        return "\n".join(open(path, errors="replace").read().splitlines()[-lines:])
    except OSError:
        return ""


def server_failed(srv: dict, model: str) -> str | None:
    """What to tell the user when model server record `srv` is no longer serving."""
    state = srv.get("state")
    if state == "failed":
        return (
            f"{model} did not start: {srv.get('error') or state} (log: {srv.get('log')}). "
            "The daemon is still running."
        )
    if state == "exited":
        return (
            f"{model} stopped serving: {srv.get('error') or state} (log: {srv.get('log')}). "
            "The daemon is still running; `vllm-x86 serve` starts the model again."
        )
    if state == "stopped":
        return (
            f"model server {srv.get('seq')} ({model}) was stopped by another request "
            "(POST /stop-model or `vllm-x86 daemon stop`)"
        )
    return None


def wait_for_server(
    f: DaemonFiles, seq: int, model: str, timeout_s: float = 1800.0, progress: bool = True
) -> dict:
    """Poll the daemon until model server `seq` is ready; its record. Raises DaemonError
    when it fails (with the error the daemon read from its log)."""
    t0 = time.monotonic()
    next_note = t0 + PROGRESS_EVERY_S
    while True:
        try:
            code, st = request(f, "GET", "/status", timeout=10.0)
        except OSError as e:
            raise DaemonError(f"the daemon stopped answering: {e}") from None
        if code != 200:
            raise _refused(code, st)
        srv = st.get("server") or {}
        if srv.get("seq") != seq:
            raise DaemonError("another request replaced this model server while it started")
        if srv.get("state") == "ready":
            return srv
        failed = server_failed(srv, model)
        if failed:
            raise DaemonError(failed)
        now = time.monotonic()
        if now - t0 > timeout_s:
            raise DaemonError(f"{model} did not start in {timeout_s:.0f} s (log: {srv.get('log')})")
        if progress and now >= next_note:
            _say(f"  starting {model} in the daemon ({now - t0:.0f} s)")
            next_note = now + PROGRESS_EVERY_S
        time.sleep(0.05)


def serve_env() -> dict[str, str]:
    """The caller's settings a model server takes (access.SERVE_ENV), applied in the
    forked model server; one line on stderr names the caller's other VLLM_* names."""
    passed, left = access.split_env(os.environ)
    if left:
        _say(
            f"not passed to the daemon's model server (not settings it takes, see "
            f"docs/startup.md): {', '.join(left)}"
        )
    return passed


def handover(vllm_args: list[str], model: str, f: DaemonFiles | None = None) -> dict | None:
    """Ask a running daemon to serve `vllm_args` (vLLM server flags, --model included);
    the daemon's answer (``server``: the record, maybe still starting; ``fresh``: a new
    server, False when that exact one already ran; ``daemon_pid``; ``t0``), or None when
    no daemon runs here. Raises DaemonError when the daemon refuses."""
    from vllm_x86.runtime import envs

    f = f or files()
    st = running(f)
    if st is None:
        return None
    if envs.disabled():
        _say("VLLM_X86_DISABLE=1: not using the standby daemon (it runs the plugin)")
        return None
    t0 = time.monotonic()
    _say(f"handing {model} to the standby daemon (pid {st['pid']})")
    try:
        code, out = request(
            f, "POST", "/serve", {"model": None, "args": vllm_args, "env": serve_env()},
            timeout=STOP_MODEL_TIMEOUT_S,  # replacing a model waits for its stop
        )  # fmt: skip
    except OSError as e:
        raise DaemonError(f"the standby daemon (pid {st['pid']}) stopped answering: {e}") from None
    if code >= 400:
        raise _refused(code, out)
    if out.get("note"):
        _say(out["note"])
    return {
        "server": out["server"],
        "fresh": code == 202,
        "daemon_pid": st["pid"],
        "keep_alive_s": st.get("keep_alive_s"),
        "t0": t0,
    }
