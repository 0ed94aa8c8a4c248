"""`vllm-x86 playground`: serve the playground page and its API on one port.

Loopback by default. A non-loopback --host needs a key (tools/exposure.py, surface
CONTROL: the playground chooses which model directory is loaded), and with a key every
/api route checks it. Models load through this user's standby daemon: the running one,
or one the playground starts (and stops again when it exits). Model paths are limited to
the model cache and the folders named with --models-dir.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

DEFAULT_PORT = 7860


def add_parser(sub) -> None:
    p = sub.add_parser(
        "playground",
        help="a page in the browser to pick, load and try models (chat, structured output)",
        description="Serve the playground: a page to choose a model (catalog, cache, "
        "prepacked INT8/INT4 folders, a local path), load it with a precision and context "
        "length, chat with it with sampling settings, try structured output, and watch the "
        "server. Models are served by the standby daemon (the running one, or one started "
        "for the playground). Listens on 127.0.0.1 unless --host says otherwise; another "
        "address needs a key.",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="port (default: %(default)s; 0: a free one)"
    )
    p.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="every /api request must carry 'Authorization: Bearer KEY' (default: "
        "VLLM_API_KEY when set); required for a non-loopback --host",
    )
    p.add_argument(
        "--models-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder whose model directories may be loaded, beside the model cache "
        "(repeatable); paths elsewhere are refused",
    )
    p.add_argument(
        "--compiled",
        action="store_true",
        help="serve models in vLLM's compiled mode (default: eager, which loads in seconds)",
    )


def run(ns: argparse.Namespace) -> int:
    from vllm_x86.tools import exposure
    from vllm_x86.tools.cli.common import CliError
    from vllm_x86.tools.ports import free_port, port_free, port_taken

    key = ns.api_key or os.environ.get("VLLM_API_KEY") or None
    port = ns.port or free_port(ns.host if exposure.is_loopback(ns.host) else "127.0.0.1")
    try:
        exposure.check(ns.host, key, surface=exposure.CONTROL, what="the playground", port=port)
    except exposure.ExposureError as e:
        raise CliError(str(e)) from None
    dirs = []
    for d in ns.models_dir:
        path = os.path.realpath(os.path.expanduser(d))
        if not os.path.isdir(path):
            raise CliError(f"--models-dir {d}: no such folder; give a folder of model directories")
        dirs.append(path)
    if not port_free(port, ns.host):
        raise CliError(port_taken(ns.host, port))

    import uvicorn

    from vllm_x86.tools.playground.app import PlaygroundConfig, create_app
    from vllm_x86.tools.playground.backend import DaemonBackend

    backend = DaemonBackend(key=key, eager=not ns.compiled)
    app = create_app(PlaygroundConfig(backend=backend, api_key=key, models_dirs=dirs))
    threading.Thread(target=backend.connect, name="daemon", daemon=True).start()
    shown = ns.host if ":" not in ns.host else f"[{ns.host}]"
    where = (
        "this machine only"
        if exposure.is_loopback(ns.host)
        else "the network; every /api request needs the key"
    )
    print(
        f"vllm-x86: playground on http://{shown}:{port}/ ({where}); models are served by "
        f"the standby daemon in {backend.files.root}. Ctrl-C stops it.",
        file=sys.stderr,
        flush=True,
    )
    try:
        uvicorn.run(app, host=ns.host, port=port, log_level="warning", timeout_graceful_shutdown=5)
    finally:
        app.state.pulls.close()
        backend.close()
    return 0
