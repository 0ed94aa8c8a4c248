"""What the CLI does with a daemon: start, stop, status, and hand `serve` over to it.

Light on purpose (standard library only, no vLLM import): `vllm-x86 serve` asks here
first whether a daemon runs, and that must cost milliseconds.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time

from vllm_x86.runtime.defaults import apply_omp_env
from vllm_x86.tools.daemon.paths import (
    DaemonFiles,
    files,
    group_members,
    is_daemon_process,
    read_pid,
    read_state,
    remove_files,
)

START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0
PROGRESS_EVERY_S = 5.0


class DaemonError(Exception):
    """A daemon operation failed; the message is meant for the user."""


def _say(msg: str) -> None:
    print(f"vllm-x86: {msg}", file=sys.stderr, flush=True)


def request(
    port: int, method: str, path: str, body: dict | None = None, timeout: float = 10.0
) -> tuple[int, dict]:
    """One call to a daemon's control API: (HTTP status, JSON body). Raises OSError when
    nothing answers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        raw = r.read()
        try:
            out = json.loads(raw or b"{}")
        except ValueError:
            out = {"error": raw.decode(errors="replace")}
        return r.status, out
    except http.client.HTTPException as e:
        raise OSError(str(e)) from e
    finally:
        conn.close()


def running(f: DaemonFiles | None = None) -> dict | None:
    """The running daemon's /status, or None when no daemon answers in this directory.
    Files a dead daemon left behind are removed."""
    f = f or files()
    pid = read_pid(f)
    if pid is None:
        return None
    if not is_daemon_process(pid):
        remove_files(f)
        return None
    state = read_state(f)
    if state is None or state.get("pid") != pid:
        return None  # alive but still warming up (no control port yet)
    try:
        code, status = request(state["port"], "GET", "/status", timeout=5.0)
    except OSError:
        return None
    return status if code == 200 else None


def start(port: int | None = None, f: DaemonFiles | None = None) -> dict:
    """Start a daemon in the background and wait until it answers; its /status."""
    from vllm_x86.runtime import envs

    f = f or files()
    if envs.disabled():
        raise DaemonError(
            "VLLM_X86_DISABLE=1 is set: the daemon serves with the plugin only; unset it"
        )
    st = running(f)
    if st is not None:
        _say(f"a daemon is already running (pid {st['pid']}, control port {st['port']})")
        return st
    pid = read_pid(f)
    if pid is not None and is_daemon_process(pid):
        raise DaemonError(
            f"a daemon (pid {pid}) is starting or not answering in {f.root}; "
            "`vllm-x86 daemon stop` stops it"
        )
    remove_files(f)
    f.root.mkdir(parents=True, exist_ok=True)
    if port is None:
        port = int(envs.get("VLLM_X86_DAEMON_PORT"))
    t0 = time.monotonic()
    # The daemon loads torch once and forks every model server from itself: the
    # OpenMP settings must be in its environment (docs/threads.md).
    env = dict(os.environ)
    apply_omp_env(env)
    with open(f.log, "a") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vllm_x86.tools.daemon",
                "--dir",
                str(f.root),
                "--port",
                str(port),
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
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
                code, st = request(state["port"], "GET", "/status", timeout=5.0)
                if code == 200:
                    break
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
    _say(
        f"daemon ready in {time.monotonic() - t0:.1f} s: pid {st['pid']}, control "
        f"http://127.0.0.1:{st['port']}, log {f.log}"
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
    if state is not None and state.get("pid") == pid:
        try:
            code, st = request(state["port"], "GET", "/status", timeout=5.0)
            if code == 200 and st.get("server"):
                model_pgid = st["server"].get("pid")
            request(state["port"], "POST", "/shutdown", {}, timeout=10.0)
        except OSError:
            os.kill(pid, signal.SIGTERM)
    else:
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


def wait_for_server(port: int, seq: int, model: str, timeout_s: float = 1800.0) -> dict:
    """Poll the daemon until model server `seq` is ready; its record. Raises DaemonError
    when it fails (with the error the daemon read from its log)."""
    t0 = time.monotonic()
    next_note = t0 + PROGRESS_EVERY_S
    while True:
        try:
            code, st = request(port, "GET", "/status", timeout=10.0)
        except OSError as e:
            raise DaemonError(f"the daemon stopped answering: {e}") from None
        srv = st.get("server") or {}
        if srv.get("seq") != seq:
            raise DaemonError("another request replaced this model server while it started")
        if srv.get("state") == "ready":
            return srv
        if srv.get("state") in ("failed", "exited", "stopped"):
            raise DaemonError(
                f"{model} did not start: {srv.get('error') or srv.get('state')} "
                f"(log: {srv.get('log')}). The daemon is still running."
            )
        now = time.monotonic()
        if now - t0 > timeout_s:
            raise DaemonError(f"{model} did not start in {timeout_s:.0f} s (log: {srv.get('log')})")
        if now >= next_note:
            _say(f"  starting {model} in the daemon ({now - t0:.0f} s)")
            next_note = now + PROGRESS_EVERY_S
        time.sleep(0.05)


def serve_env() -> dict[str, str]:
    """The caller's vLLM and plugin settings, applied in the forked model server."""
    return {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}


def handover(vllm_args: list[str], model: str, f: DaemonFiles | None = None) -> dict | None:
    """Serve `vllm_args` (vLLM server flags, --model included) from a running daemon;
    the ready server's record, or None when no daemon runs here."""
    from vllm_x86.runtime import envs

    st = running(f)
    if st is None:
        return None
    if envs.disabled():
        _say("VLLM_X86_DISABLE=1: not using the standby daemon (it runs the plugin)")
        return None
    t0 = time.monotonic()
    _say(f"handing {model} to the standby daemon (pid {st['pid']})")
    code, out = request(
        st["port"], "POST", "/serve", {"model": None, "args": vllm_args, "env": serve_env()}
    )
    if code >= 400:
        raise DaemonError(out.get("error") or f"the daemon answered {code}")
    srv = out["server"]
    if out.get("note"):
        _say(out["note"])
    if srv["state"] != "ready":
        srv = wait_for_server(st["port"], srv["seq"], model)
    srv["handover_s"] = time.monotonic() - t0
    srv["daemon_pid"] = st["pid"]
    return srv
