"""`vllm-x86 daemon start|stop|status`, and the hand-over `vllm-x86 serve` tries first."""

from __future__ import annotations

import argparse
import json
import sys
import time

from vllm_x86.tools.daemon.client import DaemonError, handover, running, start, stop


def add_parser(sub) -> None:
    d = sub.add_parser(
        "daemon",
        help="a standby process that serves models in seconds (start, stop, status)",
        description="The standby daemon imports torch, vLLM and the plugin once and waits; "
        "while it runs, `vllm-x86 serve MODEL` hands the model to it and the OpenAI server "
        "answers in seconds instead of tens of seconds. Serving another model replaces the "
        "current one. Files (pid, state, logs) live in VLLM_X86_DAEMON_DIR (default "
        "~/.cache/vllm-x86/daemon). See docs/startup.md.",
    )
    d.add_argument("action", choices=["start", "stop", "status"])
    d.add_argument(
        "--port",
        type=int,
        default=None,
        help="start: the control API's loopback port (default: VLLM_X86_DAEMON_PORT, "
        "0 = a free port)",
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
    if ns.action == "start":
        if serve is not None:
            # check the model and flags before paying for the daemon's warm-up
            from vllm_x86.tools.cli.common import CliError, serve_argv

            model = serve[0] if serve and not serve[0].startswith("-") else None
            try:
                argv, _, _ = serve_argv(model, serve[1:] if model is not None else serve)
            except CliError as e:
                raise DaemonError(str(e)) from None
        start(ns.port)
        if serve is not None:
            if not serve_with_daemon(argv[3:], argv[argv.index("--model") + 1]):
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
    print(
        f"daemon: pid {st['pid']}, control http://127.0.0.1:{st['port']}, up {up:.0f} s, "
        f"warmed up in {st['warm_s']:.1f} s, platform {st['platform']}, dir {st['dir']}"
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
        print(line + f"; log {srv['log']}")
    return 0


def serve_with_daemon(vllm_args: list[str], model: str) -> bool:
    """Hand `vllm-x86 serve` to a running daemon; False when none runs (serve then
    starts a server of its own). Raises DaemonError when the daemon refuses or the
    model fails to start."""
    srv = handover(vllm_args, model)
    if srv is None:
        return False
    print(
        f"vllm-x86: serving {srv['model']} on {srv['url']} from the standby daemon "
        f"(ready {srv['handover_s']:.1f} s after this command; log {srv['log']}). "
        "It keeps serving after this command returns: serving another model replaces it, "
        "`vllm-x86 daemon stop` stops it.",
        file=sys.stderr,
        flush=True,
    )
    return True


__all__ = ["DaemonError", "add_parser", "run", "serve_with_daemon"]
