"""`vllm-x86 daemon start|stop|status`, and the hand-over `vllm-x86 serve` tries first.

With a daemon running, `vllm-x86 serve MODEL` hands the model over and then stays a
foreground server (:func:`follow`): it streams the model server's log to its stderr,
Ctrl-C or SIGTERM stops that model server (the daemon stays warm) and exits 0, and it
exits non-zero with a sentence when the model server fails or exits on its own, another
request replaces it, or the daemon dies. `--detach` returns once the model is ready.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from vllm_x86.tools.daemon.client import (
    STOP_MODEL_TIMEOUT_S,
    DaemonError,
    gone,
    handover,
    request,
    running,
    server_failed,
    start,
    stop,
    wait_for_server,
)
from vllm_x86.tools.daemon.paths import DaemonFiles, files, is_daemon_process

# How often an attached `serve` copies the log and asks the daemon how its server is.
FOLLOW_POLL_S = 0.1
STATUS_EVERY_S = 0.5


def add_parser(sub) -> None:
    d = sub.add_parser(
        "daemon",
        help="a standby process that serves models in seconds (start, stop, status)",
        description="The standby daemon imports torch, vLLM and the plugin once and waits; "
        "while it runs, `vllm-x86 serve MODEL` hands the model to it and the OpenAI server "
        "answers in seconds instead of tens of seconds. Serving another model replaces the "
        "current one. Its control API is a Unix socket only its owner can use, in "
        "VLLM_X86_DAEMON_DIR (default ~/.cache/vllm-x86/daemon, mode 0700) with its pid, "
        "state and log files. See docs/startup.md.",
    )
    d.add_argument("action", choices=["start", "stop", "status"])
    d.add_argument(
        "--host",
        default=None,
        help="start: also listen on TCP at this address (for containers); needs a key "
        "(--api-key or VLLM_API_KEY), which every request must then carry",
    )
    d.add_argument(
        "--port",
        type=int,
        default=None,
        help="start: the TCP port (default: VLLM_X86_DAEMON_PORT; 0 with --host: a free "
        "one; a port without --host listens on 127.0.0.1)",
    )
    d.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="start: every request must carry 'Authorization: Bearer KEY' (the CLI sends "
        "VLLM_API_KEY); default: VLLM_API_KEY when set, else no key",
    )
    d.add_argument(
        "--keep-alive",
        type=float,
        default=None,
        metavar="SECONDS",
        help="start: keep a model server loaded this long after the `vllm-x86 serve` "
        "attached to it leaves (Ctrl-C), still answering on its port; a `vllm-x86 serve` "
        "of the same model and flags then attaches at once (default: "
        "VLLM_X86_DAEMON_KEEP_ALIVE, else 0: it stops with its serve)",
    )
    d.add_argument("--json", action="store_true", help="status: machine-readable output")
    d.add_argument(
        "--serve",
        nargs=argparse.REMAINDER,
        metavar="MODEL [vLLM flags]",
        help="start: then serve MODEL (path or catalog name) with these server flags, as "
        "`vllm-x86 serve MODEL [flags]` would; a later `vllm-x86 serve` of the same model "
        "and flags answers at once. Must come last: everything after it goes to the server",
    )


def run(ns: argparse.Namespace) -> int:
    """Exit code; raises DaemonError for the caller to print."""
    serve = getattr(ns, "serve", None)
    if serve is not None and ns.action != "start":
        raise DaemonError("--serve goes with `vllm-x86 daemon start` only")
    keep_alive = getattr(ns, "keep_alive", None)
    if ns.action != "start" and (
        ns.host or ns.port is not None or ns.api_key or keep_alive is not None
    ):
        raise DaemonError(
            "--host, --port, --api-key and --keep-alive go with `vllm-x86 daemon start` only"
        )
    if keep_alive is not None and not keep_alive >= 0:
        raise DaemonError(f"--keep-alive takes seconds >= 0, not {keep_alive:g}")
    if ns.action == "start":
        if serve is not None:
            # check the model and flags before paying for the daemon's warm-up
            from vllm_x86.tools.cli.common import CliError, serve_argv

            model = serve[0] if serve and not serve[0].startswith("-") else None
            try:
                argv, host, port = serve_argv(model, serve[1:] if model is not None else serve)
            except CliError as e:
                raise DaemonError(str(e)) from None
            warn_exposure(argv[3:], host, port)
        start(ns.port, host=ns.host, api_key=ns.api_key, keep_alive=keep_alive)
        if serve is not None:
            if serve_with_daemon(argv[3:], argv[argv.index("--model") + 1], detach=True) is None:
                raise DaemonError("the daemon stopped before it could serve the model")
        return 0
    if ns.action == "stop":
        if not stop():
            print("vllm-x86: no daemon is running", file=sys.stderr)
        return 0
    st = running()
    if ns.json:
        print(json.dumps(st, indent=2))
        return 0 if st else 3
    if st is None:
        print("no daemon is running (`vllm-x86 daemon start` starts one)")
        return 3
    up = time.time() - st["started_at"]
    control = f"{st['socket']} (owner only)"
    if st.get("tcp"):
        control += f" and {st['tcp']}"
    if st.get("keyed"):
        control += ", key required"
    keep = f", keep-alive {st['keep_alive_s']:g} s" if st.get("keep_alive_s") else ""
    print(
        f"daemon: pid {st['pid']}, control {control}, up {up:.0f} s, "
        f"warmed up in {st['warm_s']:.1f} s, platform {st['platform']}{keep}, dir {st['dir']}"
    )
    srv = st.get("server")
    if srv is None:
        print("model: none (`vllm-x86 serve MODEL` hands one to the daemon)")
    else:
        line = f"model: {srv['model']} at {srv['url']}: {srv['state']}"
        if srv.get("ready_s") is not None:
            line += f" (ready in {srv['ready_s']:.1f} s)"
        if srv.get("error"):
            line += f": {srv['error']}"
        if srv.get("idle_s_left") is not None:
            line += f", kept loaded without a serve ({srv['idle_s_left']:.0f} s left)"
        print(line + f"; log {srv['log']}")
    return 0


def warn_exposure(vllm_args: list[str], host: str, port: int) -> None:
    """`vllm-x86 serve`'s warning for an OpenAI server on the network without a key."""
    from vllm_x86.tools import exposure

    v = exposure.check(
        host, exposure.api_key(vllm_args), surface=exposure.API, what="the OpenAI server",
        port=port,
    )  # fmt: skip
    if v.warning:
        print(f"vllm-x86: warning: {v.warning}", file=sys.stderr, flush=True)


def _absolute_model(vllm_args: list[str]) -> list[str]:
    """The daemon runs in another directory: a relative model path is made absolute."""
    out = list(vllm_args)
    i = out.index("--model") + 1
    if os.path.exists(out[i]):
        out[i] = os.path.abspath(out[i])
    return out


class _Stop:
    """SIGINT and SIGTERM set a flag instead of interrupting: an attached `serve` then
    stops its model server and exits 0."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, object] = {}

    def __enter__(self) -> _Stop:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._on)
        return self

    def _on(self, signum, frame) -> None:
        self.signum = signum

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


# How long a cold start after a dead daemon waits for the port its model server held.
PORT_RELEASE_S = 30.0


def _wait_port_released(vllm_args: list[str]) -> None:
    """A killed daemon's model server gets SIGTERM from the kernel and may hold its port
    for a few seconds while it shuts down (longer on a busy machine): wait for the port
    (bounded) before the cold start checks it, rather than refuse at once."""
    from vllm_x86.tools.cli.common import DEFAULT_HOST, DEFAULT_PORT, _flag_value
    from vllm_x86.tools.ports import port_free

    host = _flag_value(vllm_args, "--host") or DEFAULT_HOST
    port = int(_flag_value(vllm_args, "--port") or DEFAULT_PORT)
    deadline = time.monotonic() + PORT_RELEASE_S
    while not port_free(port, host) and time.monotonic() < deadline:
        time.sleep(0.2)


def serve_with_daemon(
    vllm_args: list[str], model: str, detach: bool = False, f: DaemonFiles | None = None
) -> int | None:
    """Hand `vllm-x86 serve` to a running daemon: the exit code, or None when no daemon
    runs (serve then starts a server of its own, after a note when a daemon died).
    Raises DaemonError when the daemon refuses or the model fails. Without `detach` it
    stays attached until the model server stops (:func:`follow`)."""
    f = f or files()
    dead = gone(f)
    if dead is not None:
        print(
            f"vllm-x86: the standby daemon (pid {dead}) is gone (it left its files in "
            f"{f.root}); starting a server of its own",
            file=sys.stderr,
            flush=True,
        )
        _wait_port_released(vllm_args)
    vllm_args = _absolute_model(vllm_args)
    if detach:
        h = handover(vllm_args, model, f)
        if h is None:
            return None
        srv = h["server"]
        if srv["state"] != "ready":
            srv = wait_for_server(f, srv["seq"], model)
        print(
            f"vllm-x86: serving {srv['model']} on {srv['url']} from the standby daemon "
            f"(ready {time.monotonic() - h['t0']:.1f} s after this command; log {srv['log']}). "
            "It keeps serving after this command returns (--detach): serving another model "
            "replaces it, `vllm-x86 daemon stop` stops it.",
            file=sys.stderr,
            flush=True,
        )
        return 0
    with _Stop() as stop_flag:
        h = handover(vllm_args, model, f)
        if h is None:
            return None if stop_flag.signum is None else 128 + stop_flag.signum
        return follow(f, h, model, stop_flag)


def follow(f: DaemonFiles, h: dict, model: str, stop_flag: _Stop) -> int:
    """Stay attached to model server h["server"]: copy its log (from where this hand-over
    started) to stderr, announce it once ready, and return 0 after stopping it on
    SIGINT/SIGTERM; raise DaemonError when it ends any other way."""
    srv = h["server"]
    seq = srv["seq"]
    log_path = srv["log"]
    offset = 0
    if not h["fresh"]:  # that exact server already ran: its log from now on
        try:
            offset = os.path.getsize(log_path)
        except OSError:
            pass
    ready = False
    next_status = 0.0
    keep_alive = float(h.get("keep_alive_s") or 0.0)  # the daemon's, from /status

    def pump() -> None:
        nonlocal offset
        try:
            with open(log_path, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except OSError:
            return
        if data:
            offset += len(data)
            sys.stderr.write(data.decode(errors="replace"))
            sys.stderr.flush()

    def announce(s: dict) -> None:
        leave = (
            f"Ctrl-C leaves this model server loaded for {keep_alive:g} s (keep-alive)"
            if keep_alive > 0
            else "Ctrl-C stops this model server"
        )
        print(
            f"vllm-x86: serving {s['model']} on {s['url']} from the standby daemon (ready "
            f"{time.monotonic() - h['t0']:.1f} s after this command; log {s['log']}). "
            f"{leave}; the daemon stays warm.",
            file=sys.stderr,
            flush=True,
        )

    if srv["state"] == "ready":
        ready = True
        announce(srv)
    while stop_flag.signum is None:
        pump()
        now = time.monotonic()
        if now >= next_status:
            try:
                code, st = request(f, "GET", "/status", timeout=5.0)
            except OSError:
                if not is_daemon_process(h["daemon_pid"]):
                    pump()
                    raise DaemonError(
                        f"the standby daemon (pid {h['daemon_pid']}) is gone, and its model "
                        f"server {seq} ({model}) went with it; `vllm-x86 serve` starts a "
                        "server of its own while no daemon runs"
                    ) from None
                code, st = 0, {}  # busy (another request): ask again
            if code == 200:
                keep_alive = float(st.get("keep_alive_s") or 0.0)
                s = st.get("server") or {}
                if s.get("seq") != seq:
                    pump()
                    now_serving = f"{s.get('model')} (model server {s.get('seq')})" if s else "none"
                    raise DaemonError(
                        f"another request replaced model server {seq} ({model}); the daemon "
                        f"now serves {now_serving}"
                    )
                if s.get("state") == "ready" and not ready:
                    ready = True
                    pump()
                    announce(s)
                failed = server_failed(s, model)
                if failed:
                    pump()
                    raise DaemonError(failed)
            elif code:
                raise DaemonError(st.get("error") or f"the standby daemon answered {code}")
            next_status = now + (STATUS_EVERY_S if ready else FOLLOW_POLL_S)
        time.sleep(FOLLOW_POLL_S)
    # Ctrl-C or SIGTERM: this serve leaves model server seq (not a replacement someone
    # else started), which stops unless the daemon keeps it loaded (keep-alive).
    name = signal.Signals(stop_flag.signum).name
    if not (keep_alive > 0 and ready):
        print(
            f"vllm-x86: {name}: stopping model server {seq} ({model}); the daemon stays warm",
            file=sys.stderr,
            flush=True,
        )
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C leaves at once
    try:
        code, out = request(
            f, "POST", "/stop-model", {"seq": seq, "leave": True}, timeout=STOP_MODEL_TIMEOUT_S
        )
    except OSError as e:
        raise DaemonError(f"the standby daemon did not answer the stop request: {e}") from None
    pump()
    if code == 409:
        print(f"vllm-x86: {out.get('error')}", file=sys.stderr, flush=True)
        return 0
    if code != 200:
        raise DaemonError(out.get("error") or f"the standby daemon answered {code}")
    kept = out.get("kept_alive_s")
    if kept:
        url = (out.get("server") or {}).get("url", "its port")
        print(
            f"vllm-x86: {name}: model server {seq} ({model}) stays loaded for {kept:g} s "
            f"and still answers on {url} (the daemon's keep-alive, "
            "VLLM_X86_DAEMON_KEEP_ALIVE): `vllm-x86 serve` of the same model and flags "
            "attaches to it at once; `vllm-x86 daemon stop` stops it",
            file=sys.stderr,
            flush=True,
        )
        return 0
    print(f"vllm-x86: model server {seq} stopped", file=sys.stderr, flush=True)
    return 0


__all__ = ["DaemonError", "add_parser", "follow", "run", "serve_with_daemon", "warn_exposure"]
