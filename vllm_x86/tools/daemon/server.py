"""The daemon process: warm imports, an owner-only control API, one model server at a time.

Run by ``vllm-x86 daemon start`` as ``python -m vllm_x86.tools.daemon --dir DIR [--host H
--port P]``. Single-threaded on purpose: the control API (``http.server`` handlers) runs
in the main thread, and the daemon forks model servers from that thread, so a child
never inherits a lock held by another of the daemon's threads. Between requests,
``poll`` watches the model server (ready, failed, exited) and reaps its processes.

Control API: JSON over HTTP on the Unix socket DIR/daemon.sock (mode 0600 in a 0700
directory; each connection's uid is checked, 403 to another user), and, only when the
daemon has a key, also on TCP H:P (access.py says why). With a key every request needs
``Authorization: Bearer KEY`` (401 otherwise). A request is read within
``REQUEST_TIMEOUT_S``; bodies over ``MAX_BODY`` bytes are refused (413).

    GET  /status      the daemon and the model server (state: starting, ready, failed,
                      exited, stopped; error: what its log says went wrong)
    POST /serve       {"model": PATH_OR_NAME_OR_null, "args": [vLLM server flags...],
                      "env": {NAME: VALUE} (names of access.SERVE_ENV only)}: stop the
                      current model server, start this one; 202 with its record (poll
                      /status until ready or failed), 200 if that exact server is
                      already running, 400 for a bad request (unknown model, missing
                      path, bad flags, an environment name it does not pass), 409 when
                      another program has the port; each with a message in "error"
    POST /stop-model  {"seq": N} (optional): stop the current model server (409 when
                      model server N is no longer the current one: nothing stopped);
                      {"seq": N, "leave": true}: the serve attached to it leaves: with
                      VLLM_X86_DAEMON_KEEP_ALIVE set, a ready server stays loaded that
                      long ("kept_alive_s" in the answer), else it stops
    POST /shutdown    stop the model server and the daemon
"""

from __future__ import annotations

import argparse
import gc
import http.client
import importlib
import json
import os
import re
import selectors
import signal
import socket
import socketserver
import sys
import time
import traceback
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from vllm_x86._version import __version__
from vllm_x86.runtime.startup import childproc
from vllm_x86.tools import exposure
from vllm_x86.tools.daemon import access
from vllm_x86.tools.daemon.paths import (
    DaemonError,
    DaemonFiles,
    files,
    group_members,
    open_private,
    private_dir,
    remove_files,
    socket_address,
    write_json_atomic,
    write_private,
)
from vllm_x86.tools.ports import bind_host, port_free, port_taken

# Imported once in the daemon, inherited by every forked model server: torch, vLLM's
# OpenAI server, engine, CPU worker and loader, the model families the project serves,
# and the plugin (platform, worker, kernels, quantization methods).
WARM_MODULES = (
    "torch",
    "vllm",
    "vllm.engine.arg_utils",
    "vllm.entrypoints.launchers.api_server.entry",
    "vllm.entrypoints.launchers.cli_args",
    "vllm.entrypoints.serve.utils.api_utils",
    "vllm.utils.argparse_utils",
    "vllm.v1.engine.async_llm",
    "vllm.v1.engine.core",
    "vllm.v1.engine.core_client",
    "vllm.v1.executor.multiproc_executor",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.model_executor.model_loader",
    "vllm.model_executor.models.llama",
    "vllm.model_executor.models.qwen2",
    "vllm.model_executor.models.qwen3",
    "transformers",
    "tokenizers",
    "vllm_x86.runtime.platform",
    "vllm_x86.runtime.worker",
    "vllm_x86.runtime.ops.registry",
    "vllm_x86.runtime.quant",
    "vllm_x86.runtime._C",
)
# What a served model's processes import after the fork unless the daemon has: the
# OpenAI server's routers and serving classes, then the engine's and worker's modules
# (the op table's layers, the loaders' quantization modules). Listed from a Qwen3 serve
# (sys.modules of each process against the daemon's, 2026-12-04): about 0.6 s of
# imports per served model on the development VM. A name this vLLM lacks is logged
# and skipped, like the ones above.
WARM_SERVER_MODULES = (
    "fastapi.staticfiles",
    "httptools",
    "jmespath",
    "model_hosting_container_standards",
    "multiprocessing.popen_fork",
    "prometheus_fastapi_instrumentator",
    "starlette.staticfiles",
    "uvicorn.lifespan.on",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.websockets.auto",
    "websockets",
    "vllm.entrypoints.anthropic.api_router",
    "vllm.entrypoints.anthropic.serving",
    "vllm.entrypoints.cohere",
    "vllm.entrypoints.generate.api_router",
    "vllm.entrypoints.generate.generative_scoring",
    "vllm.entrypoints.generate.label_reads",
    "vllm.entrypoints.generate.structured_decisions",
    "vllm.entrypoints.openai.chat_completion.api_router",
    "vllm.entrypoints.openai.chat_completion.batch_serving",
    "vllm.entrypoints.openai.chat_completion.serving",
    "vllm.entrypoints.openai.completion.api_router",
    "vllm.entrypoints.openai.completion.serving",
    "vllm.entrypoints.openai.models.api_router",
    "vllm.entrypoints.openai.responses.api_router",
    "vllm.entrypoints.openai.responses.context",
    "vllm.entrypoints.openai.responses.serving",
    "vllm.entrypoints.openai.responses.streaming_events",
    "vllm.entrypoints.scale_out.derender",
    "vllm.entrypoints.scale_out.factories",
    "vllm.entrypoints.scale_out.render",
    "vllm.entrypoints.scale_out.token_in_token_out.api_router",
    "vllm.entrypoints.scale_out.token_in_token_out.mm_features",
    "vllm.entrypoints.scale_out.token_in_token_out.mm_serde",
    "vllm.entrypoints.scale_out.token_in_token_out.serving",
    "vllm.entrypoints.serve.elastic_ep.api_router",
    "vllm.entrypoints.serve.instrumentator.metrics",
    "vllm.entrypoints.serve.instrumentator.offline_docs",
    "vllm.entrypoints.serve.lora.api_router",
    "vllm.entrypoints.serve.profile",
    "vllm.entrypoints.serve.tokenize.api_router",
    "vllm.entrypoints.serve.utils.fingerprint",
    "vllm.entrypoints.serve.utils.orca_metrics",
    "vllm.entrypoints.serve.utils.sse_keep_alive",
    "vllm.plugins.lora_resolvers",
    "vllm.renderers.hf",
    "vllm.transformers_utils.chat_templates",
    "vllm.v1.metrics.reader",
)
WARM_WORKER_MODULES = (
    "compressed_tensors",
    "setproctitle",
    "vllm.distributed.elastic_ep",
    "vllm.model_executor.layers.fused_moe.eep_reconfigure",
    "vllm.model_executor.layers.mamba.gdn",
    "vllm.model_executor.layers.mamba.mamba_mixer",
    "vllm.model_executor.layers.quantization.auto_awq",
    "vllm.model_executor.layers.quantization.auto_gptq",
    "vllm.model_executor.layers.quantization.compressed_tensors.utils",
    "vllm.model_executor.layers.quantization.inc",
    "vllm.model_executor.layers.quantization.online",
    "vllm.model_executor.layers.quantization.utils.gptq_utils",
    "vllm.v1.attention.backends.cpu_attn",
    "vllm.v1.attention.backends.mamba1_attn",
    "vllm.v1.core.sched.scheduler",
    "vllm_x86.runtime.startup.compile_cache",
    "vllm_x86.runtime.startup.kv_alloc",
    "vllm_x86.runtime.ops.gdn",
    "vllm_x86.runtime.ops.mamba",
    "vllm_x86.runtime.ops.qwen3_attention",
    "vllm_x86.runtime.quant.methods",
)

HEALTH_POLL_S = 0.1
# How often the main loop looks at the model server between requests.
LOOP_POLL_S = 0.05
# A control connection must deliver its request (and take its answer) within this.
REQUEST_TIMEOUT_S = 10.0
MAX_BODY = 1 << 20
# How long a switch on the same port waits for the stopped server's port to be free.
PORT_WAIT_S = 10.0
STOP_GRACE_S = 30.0
# The last lines of a failed server's log that the error message quotes.
ERROR_CONTEXT_LINES = 3


def _keep_alive_setting() -> float:
    """VLLM_X86_DAEMON_KEEP_ALIVE in seconds (a bad value: a sentence, and 0)."""
    from vllm_x86.runtime import envs

    raw = envs.get("VLLM_X86_DAEMON_KEEP_ALIVE").strip() or "0"
    try:
        value = float(raw)
        if value < 0 or value != value:
            raise ValueError
    except ValueError:
        _say(f"VLLM_X86_DAEMON_KEEP_ALIVE={raw!r} is not a number of seconds >= 0: using 0")
        return 0.0
    return value


def _op_table_modules() -> list[str]:
    """The modules the op table's rows name (vLLM's classes and the plugin's), which a
    worker imports as it installs the rows before building the model."""
    from vllm_x86.runtime.ops.registry import OVERRIDES

    found: list[str] = []
    for row in OVERRIDES:
        for path in (row.target, row.impl, row.check, row.choose):
            if path and ":" in path and path.partition(":")[0] not in found:
                found.append(path.partition(":")[0])
    return found


def _say(msg: str) -> None:
    print(f"[vllm-x86 daemon] {time.strftime('%H:%M:%S')} {msg}", flush=True)


class ModelServer:
    """One model server the daemon forked, and what became of it."""

    def __init__(self, seq: int, model: str, served_name: str | None, vllm_args: list[str],
                 host: str, port: int, env: dict[str, str], log: Path):  # fmt: skip
        self.seq = seq
        self.model = model
        self.served_name = served_name
        self.vllm_args = vllm_args
        self.host = host
        self.port = port
        self.env = env
        self.log = log
        self.pid: int | None = None
        self.state = "starting"
        self.error: str | None = None
        self.exit_code: int | None = None
        self.t_start = time.monotonic()
        self.started_at = time.time()
        self.ready_s: float | None = None
        self._next_probe = 0.0
        self.stopping = False  # the daemon asked it to stop (not an exit on its own)
        # Kept loaded after its serve left (VLLM_X86_DAEMON_KEEP_ALIVE): stopped at this
        # time (monotonic) unless a serve of the same model attaches first.
        self.idle_until: float | None = None

    @property
    def key(self) -> tuple:
        return (tuple(self.vllm_args), tuple(sorted(self.env.items())))

    @property
    def alive(self) -> bool:
        return self.state in ("starting", "ready")

    def record(self) -> dict:
        return {
            "seq": self.seq,
            "model": self.model,
            "served_name": self.served_name,
            "url": f"http://{self.host}:{self.port}/v1",
            "host": self.host,
            "port": self.port,
            "pid": self.pid,
            "state": self.state,
            "error": self.error,
            "exit_code": self.exit_code,
            "log": str(self.log),
            "started_at": self.started_at,
            "ready_s": self.ready_s,
            "args": self.vllm_args,
            "idle_s_left": (
                None if self.idle_until is None else max(0.0, self.idle_until - time.monotonic())
            ),
        }


_ERROR_LINE = re.compile(r"^(?:\([^)]*\)\s+)?(?:ERROR\s.*?\]\s+)?([\w.]*(?:Error|Exception)\b.*)$")
# A process of the server that died (vLLM's executor: "Worker proc VllmWorker-0 died
# unexpectedly (exit code: -9), shutting down executor."; with the worker inside the
# engine process, vLLM's client: "MPClient: engine core exited unexpectedly; starting
# cleanup"): the root cause of what follows.
_DIED_LINE = re.compile(r"\]\s+(.*\b(?:died|exited) unexpectedly\b.*)$")


def error_from_log(path: Path) -> str:
    """The most telling lines of a failed server's log: the first exception line (the
    root cause, usually in the engine process) and the last one (what the server died
    of), without tracebacks."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    found: list[str] = []
    died = next((m.group(1).strip() for x in lines if (m := _DIED_LINE.search(x))), None)
    if died is not None:
        found.append(died)
    for line in lines:
        m = _ERROR_LINE.match(line.strip())
        if m and not line.lstrip().startswith(("File ", "raise ", "^")):
            text = m.group(1).strip()
            if text not in found:
                found.append(text)
    if not found:
        said = [x.strip() for x in lines if ": error:" in x]  # argparse's way
        if said:
            return said[-1]
        tail = [x for x in lines if x.strip()][-ERROR_CONTEXT_LINES:]
        return " | ".join(tail) if tail else "(the server printed nothing)"
    picked = [found[0]] if len(found) == 1 else [found[0], found[-1]]
    return " ... ".join(picked)


class Daemon:
    def __init__(self, f: DaemonFiles, host: str | None = None, port: int | None = None,
                 key: str | None = None):  # fmt: skip
        self.files = f
        self.tcp_host = host  # None: the Unix socket only
        self.tcp_port = port
        self.key = key or None
        self.listeners: list[socketserver.BaseServer] = []
        self.server: ModelServer | None = None
        self.seq = 0
        self.started_at = time.time()
        self.warm_s: float | None = None
        self.quit = False
        self.request_socket = None  # the connection of the request being handled
        self.umask = 0o022  # the caller's, restored in each model server
        self.keep_alive_s = _keep_alive_setting()

    # ------------------------------------------------------------------ start-up

    def warm_up(self) -> None:
        t0 = time.perf_counter()
        missing = []
        names = (*WARM_MODULES, *WARM_SERVER_MODULES, *WARM_WORKER_MODULES)
        names += tuple(m for m in _op_table_modules() if m not in names)
        for name in names:
            try:
                importlib.import_module(name)
            except Exception as e:  # a module of another vLLM build: not fatal
                missing.append(f"{name} ({type(e).__name__}: {e})")
        imported = len(names) - len(missing)
        # Resolve vLLM's platform now (this runs the plugin's register()).
        from vllm.platforms import current_platform

        self.platform = type(current_platform).__name__
        # vLLM CPU's stand-ins for its Triton kernels, registered here once instead of
        # in every worker (X86Platform.register_triton_kernel_overrides).
        try:
            current_platform.register_triton_kernel_overrides()
        except Exception as e:
            missing.append(f"Triton kernel overrides ({type(e).__name__}: {e})")
        # Inductor's once-per-process checks of a compiled start, inherited by every
        # model server (startup/inductor_checks.py).
        from vllm_x86.runtime.startup import inductor_checks

        missing += inductor_checks.compute()
        gc.collect()
        gc.freeze()  # keep the warm objects out of the children's copy-on-write pages
        self.warm_s = time.perf_counter() - t0
        for m in missing:
            _say(f"could not prepare {m}")
        threads = len(os.listdir("/proc/self/task"))
        _say(
            f"warm in {self.warm_s:.1f} s: {imported} modules "
            f"imported, platform {self.platform}, {threads} thread(s)"
        )

    # ------------------------------------------------------------------ requests

    @property
    def tcp_url(self) -> str | None:
        if self.tcp_host is None:
            return None
        host = self.tcp_host if ":" not in self.tcp_host else f"[{self.tcp_host}]"
        return f"http://{host}:{self.tcp_port}"

    def status(self) -> dict:
        return {
            "pid": os.getpid(),
            "socket": str(self.files.socket),
            "tcp": self.tcp_url,
            "keyed": self.key is not None,
            "version": __version__,
            "started_at": self.started_at,
            "warm_s": self.warm_s,
            "keep_alive_s": self.keep_alive_s,
            "platform": getattr(self, "platform", None),
            "dir": str(self.files.root),
            "server": self.server.record() if self.server else None,
        }

    def serve(self, body: dict) -> tuple[int, dict]:
        from vllm_x86.tools.cli.common import CliError, serve_argv

        unknown = sorted(set(body) - {"model", "args", "env"})
        if unknown:
            return 400, {
                "error": f"unknown field(s) {', '.join(map(repr, unknown))}: /serve takes "
                "'model', 'args' and 'env'"
            }
        model = body.get("model")
        args = body.get("args", [])
        env = body.get("env", {})
        if model is not None and not isinstance(model, str):
            return 400, {"error": "'model' must be a string (a path or catalog name) or null"}
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            return 400, {"error": "'args' must be a list of strings (vLLM server flags)"}
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            return 400, {"error": "'env' must map names to strings"}
        if env.get("VLLM_X86_DISABLE", "0").strip().lower() in ("1", "true", "yes", "on"):
            return 400, {
                "error": "VLLM_X86_DISABLE=1 asks for stock vLLM CPU, but the daemon has "
                "the plugin loaded; start the server without the daemon for that"
            }
        refused = access.refused_env(env)
        if refused:
            return 400, {"error": refused}
        try:
            argv, host, port = serve_argv(model, args)
        except CliError as e:
            return 400, {"error": str(e)}
        except (ValueError, SystemExit) as e:
            return 400, {"error": f"bad server flags: {e}"}
        vllm_args = argv[3:]  # after `python -m vllm.entrypoints.openai.api_server`
        path = vllm_args[vllm_args.index("--model") + 1]
        served = None
        if "--served-model-name" in vllm_args:
            served = vllm_args[vllm_args.index("--served-model-name") + 1]
        cur = self.server
        if (
            cur is not None
            and cur.alive
            and cur.key == (tuple(vllm_args), tuple(sorted(env.items())))
        ):
            cur.idle_until = None  # a serve attaches: kept loaded no longer
            return 200, {"server": cur.record(), "note": "already serving this model"}
        same_port = cur is not None and cur.alive and cur.port == port
        if not same_port and not port_free(port, host):
            # Refused before the current model is touched: it keeps serving.
            return 409, {"error": port_taken(host, port)}
        # The OpenAI server follows `vllm-x86 serve`'s rule: on the network without a
        # key it starts, with the warning in the answer and the daemon's log.
        verdict = exposure.check(
            host, exposure.api_key(vllm_args, env), surface=exposure.API,
            what="the OpenAI server", port=port,
        )  # fmt: skip
        if cur is not None and cur.alive:
            _say(f"stopping model server {cur.seq} ({cur.model}) to serve {path}")
            self.stop_model()
        if same_port and not self._wait_port(host, port):
            return 409, {
                "error": port_taken(host, port) + f" (it was still taken {PORT_WAIT_S:.0f} s "
                f"after model server {cur.seq} stopped; the daemon serves no model now)"
            }
        self.seq += 1
        self.files.prune_model_logs()
        ms = ModelServer(
            self.seq, path, served, vllm_args, host, port, env, self.files.model_log(self.seq)
        )
        self.server = ms
        self._fork(ms)
        _say(f"model server {ms.seq}: pid {ms.pid}, {path} on {ms.host}:{ms.port} (log {ms.log})")
        out: dict = {"server": ms.record()}
        if verdict.warning:
            _say(f"warning: {verdict.warning}")
            out["warning"] = verdict.warning
        return 202, out

    def _wait_port(self, host: str, port: int) -> bool:
        """Wait until the stopped server's port can be bound again."""
        deadline = time.monotonic() + PORT_WAIT_S
        while not port_free(port, host):
            if time.monotonic() > deadline:
                return False
            self._reap()
            time.sleep(0.05)
        return True

    # ------------------------------------------------------------------ model servers

    def _fork(self, ms: ModelServer) -> None:
        fd = open_private(ms.log, os.O_WRONLY | os.O_TRUNC)
        os.write(fd, ("$ vllm-x86 serve (daemon) " + " ".join(ms.vllm_args) + "\n").encode())
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the model server
            code = 1
            try:
                os.setsid()
                childproc.die_with_parent(signal.SIGTERM)
                for srv in self.listeners:  # the control sockets stay the daemon's
                    srv.socket.close()
                if self.request_socket is not None:  # the /serve request's connection
                    self.request_socket.close()
                os.umask(self.umask)  # caches and files the server writes: as a cold serve
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.close(fd)
                os.close(null)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                for k in [k for k in os.environ if k.startswith("VLLM_")]:
                    del os.environ[k]
                os.environ.update(ms.env)
                os.environ.setdefault("VLLM_X86_SERVE_DEFAULTS", "1")  # runtime/envs.py
                sys.argv = ["vllm-x86 serve", *ms.vllm_args]
                from vllm.entrypoints.launchers.api_server.entry import main

                main()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if e.code is not None and not isinstance(e.code, int):
                    print(e.code, file=sys.stderr)
            except KeyboardInterrupt:
                code = 0
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                childproc.exit_now(code)
        os.close(fd)
        ms.pid = pid

    def _reap(self) -> None:
        """Collect exited children (the model server, and orphans of its tree: the
        daemon is their subreaper)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            ms = self.server
            if ms is not None and pid == ms.pid and ms.exit_code is None:
                ms.exit_code = os.waitstatus_to_exitcode(status)
                how = (
                    f"killed by {signal.Signals(-ms.exit_code).name}"
                    if ms.exit_code < 0
                    else f"exit code {ms.exit_code}"
                )
                if ms.stopping:
                    if ms.alive:
                        ms.state = "stopped"
                elif ms.state == "starting":
                    ms.state = "failed"
                    ms.error = error_from_log(ms.log)
                    _say(f"model server {ms.seq} failed to start: {ms.error}")
                elif ms.state == "ready":
                    ms.state = "exited"
                    ms.error = f"the model server exited on its own ({how}): " + error_from_log(
                        ms.log
                    )
                    _say(f"model server {ms.seq} exited: {ms.error}")
                self._kill_group(ms, signal.SIGKILL)

    def _kill_group(self, ms: ModelServer, sig: int) -> None:
        if ms.pid is None:
            return
        try:
            os.killpg(ms.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _probe(self, ms: ModelServer) -> bool:
        host = "127.0.0.1" if ms.host in ("", "0.0.0.0", "::") else ms.host
        conn = http.client.HTTPConnection(host, ms.port, timeout=0.2)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def poll(self) -> None:
        self._reap()
        ms = self.server
        if ms is not None and ms.alive and ms.idle_until is not None:
            if time.monotonic() >= ms.idle_until:
                _say(
                    f"model server {ms.seq} kept loaded {self.keep_alive_s:g} s without a "
                    "serve attached (VLLM_X86_DAEMON_KEEP_ALIVE): stopping it"
                )
                ms.idle_until = None
                self.stop_model(ms.seq)
            return
        if ms is None or ms.state != "starting":
            return
        now = time.monotonic()
        if now < ms._next_probe:
            return
        ms._next_probe = now + HEALTH_POLL_S
        if self._probe(ms):
            ms.state = "ready"
            ms.ready_s = time.monotonic() - ms.t_start
            _say(f"model server {ms.seq} ready in {ms.ready_s:.1f} s")

    def leave_model(self, seq: int) -> tuple[int, dict]:
        """The serve attached to model server `seq` leaves: keep it loaded for
        VLLM_X86_DAEMON_KEEP_ALIVE seconds when that is set and it is ready, else stop it."""
        ms = self.server
        if self.keep_alive_s > 0 and ms is not None and ms.seq == seq and ms.state == "ready":
            ms.idle_until = time.monotonic() + self.keep_alive_s
            _say(
                f"model server {ms.seq} kept loaded for {self.keep_alive_s:g} s after its "
                "serve left (VLLM_X86_DAEMON_KEEP_ALIVE)"
            )
            return 200, {"server": ms.record(), "kept_alive_s": self.keep_alive_s}
        return self.stop_model(seq)

    def stop_model(self, seq: int | None = None) -> tuple[int, dict]:
        """Stop the current model server (only if it is number `seq`, when given)."""
        ms = self.server
        if seq is not None and (ms is None or ms.seq != seq):
            now = f"model server {ms.seq} ({ms.state})" if ms is not None else "no model"
            return 409, {
                "error": f"model server {seq} is not the daemon's current one (it has {now}); "
                "nothing was stopped",
                "server": ms.record() if ms is not None else None,
            }
        if ms is None or ms.pid is None:
            return 200, {"server": None}
        ms.stopping = True
        if group_members(ms.pid):
            self._kill_group(ms, signal.SIGINT)
            deadline = time.monotonic() + STOP_GRACE_S
            while group_members(ms.pid) and time.monotonic() < deadline:
                self._reap()
                time.sleep(0.05)
            if group_members(ms.pid):
                _say(f"model server {ms.seq} did not stop in {STOP_GRACE_S:.0f} s: SIGKILL")
                self._kill_group(ms, signal.SIGKILL)
                while group_members(ms.pid):
                    self._reap()
                    time.sleep(0.05)
        self._reap()
        if ms.alive:
            ms.state = "stopped"
        _say(f"model server {ms.seq} stopped")
        return 200, {"server": ms.record()}

    # ------------------------------------------------------------------ main loop

    def _listen(self) -> None:
        f = self.files
        try:
            f.socket.unlink()  # a dead daemon's (start() checked that none runs)
        except FileNotFoundError:
            pass
        old = os.umask(0o177)  # the socket is created 0600, with no moment of wider access
        try:
            with socket_address(f.socket) as addr:
                self.listeners.append(_UnixControlServer(addr, self))
        finally:
            os.umask(old)
        os.chmod(f.socket, 0o600)
        if self.tcp_host is not None:
            access.check_tcp(self.tcp_host, self.tcp_port or 0, self.key)
            tcp = _TCPControlServer((bind_host(self.tcp_host), self.tcp_port or 0), self)
            self.tcp_port = tcp.server_address[1]
            self.listeners.append(tcp)

    def _loop(self) -> None:
        sel = selectors.DefaultSelector()
        for srv in self.listeners:
            srv.timeout = 0
            sel.register(srv, selectors.EVENT_READ)
        while not self.quit:
            for key, _ in sel.select(LOOP_POLL_S):
                key.fileobj.handle_request()
            self.poll()

    def run(self) -> int:
        f = self.files
        try:
            private_dir(f)
        except DaemonError as e:
            print(f"vllm-x86 daemon: {e}", file=sys.stderr, flush=True)
            return 2
        # Every file the daemon writes is its owner's only; model servers get the
        # caller's umask back (_fork).
        self.umask = os.umask(0o077)
        write_private(f.pid, str(os.getpid()))
        childproc.prctl(childproc.PR_SET_CHILD_SUBREAPER, 1)

        def on_signal(signum, frame):
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        code = 0
        try:
            self.warm_up()
            self._listen()
            write_json_atomic(
                f.state,
                {"pid": os.getpid(), "socket": str(f.socket), "tcp": self.tcp_url,
                 "keyed": self.key is not None, "version": __version__,
                 "started_at": self.started_at, "warm_s": self.warm_s},
            )  # fmt: skip
            where = f"{f.socket} (owner only)"
            if self.tcp_url:
                where += f" and {self.tcp_url} (key required)"
            elif self.key:
                where += ", key required"
            _say(f"listening on {where} (pid {os.getpid()})")
            self._loop()
        except SystemExit:
            pass
        except DaemonError as e:
            print(f"vllm-x86 daemon: {e}", file=sys.stderr, flush=True)
            code = 2
        except OSError as e:  # the TCP port taken, the socket not creatable
            print(f"vllm-x86 daemon: cannot listen: {e}", file=sys.stderr, flush=True)
            code = 2
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            if self.server is not None:
                self.stop_model()
            for srv in self.listeners:
                srv.server_close()
            remove_files(f)
            _say("stopped")
        return code


class _UnixControlServer(socketserver.UnixStreamServer):
    unix = True

    def __init__(self, addr: str, daemon: Daemon):
        self.daemon_obj = daemon
        super().__init__(addr, _Handler)


class _TCPControlServer(socketserver.TCPServer):
    unix = False
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], daemon: Daemon):
        self.daemon_obj = daemon
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        super().__init__(addr, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _UnixControlServer | _TCPControlServer
    timeout = REQUEST_TIMEOUT_S  # a client that stalls does not hold the daemon
    _drained = False

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass

    def address_string(self) -> str:  # a Unix socket's peer has no address
        return str(self.client_address[0]) if self.client_address else "unix"

    def send_error(self, code, message=None, explain=None):
        """http.server's own refusals (a malformed request line, an unknown method), as
        JSON like every other answer."""
        self.close_connection = True
        short = self.responses.get(code, ("error",))[0]
        self._send(code, {"error": f"{message or short} (HTTP {code})"})

    def _drain(self) -> None:
        """Read a body this answer does not use (a refusal before it was looked at): a
        client still sending it would otherwise meet a closed connection, not the answer."""
        if self._drained or self.command not in ("POST", "PUT", "PATCH", "DELETE"):
            return
        self._drained = True
        try:
            n = int(self.headers.get("Content-Length") or 0)
            if 0 < n <= MAX_BODY:
                self.rfile.read(n)
        except (ValueError, OSError):
            pass

    def _send(self, code: int, body: dict) -> None:
        if hasattr(self, "headers"):
            self._drain()
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _allowed(self) -> bool:
        """The peer's uid (on the socket), then the key: 403 or 401, with a message."""
        d = self.server.daemon_obj
        if self.server.unix:
            uid = access.peer_uid(self.connection)
            if not access.peer_allowed(uid):
                self._send(403, {"error": access.forbidden_message(uid)})
                return False
        if not exposure.authorized(self.headers.get("Authorization"), d.key):
            self._send(401, {"error": access.UNAUTHORIZED})
            return False
        return True

    def _body(self) -> dict | None:
        raw_n = self.headers.get("Content-Length") or "0"
        try:
            n = int(raw_n)
            if n < 0:
                raise ValueError
        except ValueError:
            self._send(400, {"error": f"Content-Length {raw_n!r} is not a byte count"})
            return None
        if n > MAX_BODY:
            self._send(
                413, {"error": f"the body is {n} bytes; the daemon takes {MAX_BODY} at most"}
            )
            return None
        self._drained = True
        raw = self.rfile.read(n) if n else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except ValueError as e:
            self._send(400, {"error": f"the body is not JSON: {e}"})
            return None
        if not isinstance(body, dict):
            self._send(400, {"error": "the body must be a JSON object"})
            return None
        return body

    def do_GET(self):  # noqa: N802 (http.server's naming)
        if not self._allowed():
            return
        d = self.server.daemon_obj
        d.poll()
        if self.path.rstrip("/") in ("/status", ""):
            self._send(200, d.status())
        else:
            self._send(404, {"error": f"no such endpoint: GET {self.path} (GET /status)"})

    def do_POST(self):  # noqa: N802
        if not self._allowed():
            return
        d = self.server.daemon_obj
        path = self.path.rstrip("/")
        if path not in ("/serve", "/stop-model", "/shutdown"):
            self._send(
                404,
                {"error": f"no such endpoint: POST {self.path} (POST /serve, /stop-model, "
                 "/shutdown)"},
            )  # fmt: skip
            return
        body = self._body()
        if body is None:
            return
        d.request_socket = self.connection
        try:
            if path == "/serve":
                code, out = d.serve(body)
                self._send(code, out)
            elif path == "/stop-model":
                seq = body.get("seq")
                if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool)):
                    self._send(400, {"error": "'seq' must be a model server's number"})
                    return
                leave = body.get("leave", False)
                if not isinstance(leave, bool) or (leave and seq is None):
                    self._send(400, {"error": "'leave' must be true or false, with 'seq'"})
                    return
                self._send(*(d.leave_model(seq) if leave else d.stop_model(seq)))
            else:
                self._send(200, {"stopping": True})
                d.quit = True
        except Exception as e:  # a bug must not take the daemon down
            traceback.print_exc()
            self._send(500, {"error": f"{type(e).__name__}: {e}"})
        finally:
            d.request_socket = None

    def _no_method(self):
        if self._allowed():
            self._send(405, {"error": f"{self.command} is not a method of this API: use GET "
                             "/status or POST /serve, /stop-model, /shutdown"})  # fmt: skip

    do_PUT = do_DELETE = do_PATCH = _no_method  # noqa: N815


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vllm_x86.tools.daemon")
    p.add_argument("--dir", default=None, help="daemon directory (default: VLLM_X86_DAEMON_DIR)")
    p.add_argument(
        "--host",
        default=None,
        help="also listen on TCP at this address (needs a key: VLLM_API_KEY in the environment)",
    )
    p.add_argument("--port", type=int, default=None, help="the TCP port (0: a free one)")
    ns = p.parse_args(argv)
    host = ns.host if ns.host is not None else ("127.0.0.1" if ns.port else None)
    # The key comes from the environment, never the command line (which any user can read
    # in /proc); `vllm-x86 daemon start --api-key KEY` passes it there.
    key = os.environ.get("VLLM_API_KEY") or None
    return Daemon(files(ns.dir), host, ns.port, key).run()
