"""Patch ``engine_core_in_server_thread`` (a monkey-patch; ledger.py).

vLLM's OpenAI server always runs its engine core in a process of its own: its async
engine client talks to it over ZMQ, and ``EngineCoreClient.make_client`` refuses an
engine in the server's process ("Running EngineCore in asyncio without multiprocessing
is not currently supported"). On a machine with few cores that process costs memory
and time: a second Python heap beside the server's (the pages the forked engine
writes to are copied), and a hand-off between two processes each way per step. Run as
a thread, the engine of SmolLM2 INT4 left a tree of 745 MiB of PSS against 927 (the KV
cache's pages apart; AMD EPYC VM, docs/threads.md), at 10-13 % of the decode speed of
one request, where the server's Python and the engine's now share one interpreter lock.

With ``VLLM_X86_ENGINE_IN_SERVER`` the engine core runs as a thread of the server
instead. Nothing of vLLM's engine, client or protocol changes: the server's engine
manager (``CoreEngineProcManager``) asks its multiprocessing context for a process to
run ``EngineCoreProc.run_engine_core``, and where the patch applies, it gets an
``EngineThread``: an object with the parts of ``multiprocessing.Process`` that vLLM's
manager, start-up wait and shutdown use (``start``, ``is_alive``, ``join``,
``terminate``, ``exitcode``, ``name``, ``sentinel``: a pipe whose write end closes when
the thread ends, so vLLM's liveness monitor sees an engine that died, and ``pid`` None,
so vLLM's shutdown never kills the server's own process tree). The thread builds
vLLM's ``EngineCoreProc`` with the same arguments and runs its busy loop; the client
reaches it over the same ZMQ sockets (an IPC socket within one process).

Why not vLLM's ``run_engine_core`` itself: it is written for a process of its own; in
a thread it would install signal handlers (only the main thread may), rename the
process (``set_process_title``) and prefix every line the server prints
(``decorate_logs``). The thread does the rest of its steps: the config serialisation,
the data-parallel index, the engine, the busy loop, a shutdown asked for through the
engine's state and a wake-up on its input queue (what its signal handler does), and
the engine's ``shutdown`` at the end. The engine gets its own deep copy of the config,
as a spawned or forked process would.

Where it applies: the plugin's own servers (``VLLM_X86_SERVE_DEFAULTS=1``: `vllm-x86
serve` and its daemon), engine processes forked (``VLLM_X86_ENGINE_FORK``: the server
has run no OpenMP region, so the engine thread's OpenMP team is the first), one engine
(no data parallel) whose one worker runs inside it (vLLM's ``UniProcExecutor``,
``VLLM_X86_WORKER_IN_ENGINE``). Anything else gets vLLM's process.

Upstream change that removes it: vLLM's async engine client with an in-process
engine core.
"""

from __future__ import annotations

import atexit
import copy
import importlib
import os
import threading

from vllm_x86.runtime import envs
from vllm_x86.runtime.log import get_logger
from vllm_x86.runtime.patches.ledger import MARK

logger = get_logger("engine_thread")

UTILS_MODULE = "vllm.v1.engine.utils"
EXIT_WAIT_S = 30.0  # at the server's exit, how long the engine's teardown may take


def wanted() -> bool:
    """The setting asks for the engine in the server's process, in a plugin server."""
    return (
        envs.serve_defaults()
        and envs.get_bool("VLLM_X86_ENGINE_IN_SERVER")
        and os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") == "fork"
    )


def _why_not(kwargs: dict) -> str | None:
    """None where this engine can run as a thread; else why not, in words."""
    from vllm.v1.executor import UniProcExecutor

    config = kwargs.get("vllm_config")
    if config is None:
        return "no engine config"
    parallel = config.parallel_config
    if parallel.data_parallel_size > 1 or parallel.world_size_across_dp > 1:
        return f"{parallel.world_size_across_dp} ranks"
    executor = kwargs.get("executor_class")
    if not (isinstance(executor, type) and issubclass(executor, UniProcExecutor)):
        return "its worker runs in a process of its own"
    return None


class EngineThread:
    """The parts of ``multiprocessing.Process`` that vLLM's engine manager, start-up
    wait and shutdown use, for an engine core run by a thread of this process."""

    def __init__(self, name: str, kwargs: dict):
        self.name = name
        self.pid = None  # vLLM's shutdown kills the process tree of a pid that lingers
        self.exitcode: int | None = None
        self._kwargs = kwargs
        self._read, self._write = os.pipe()
        self.sentinel = self._read
        self._engine = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()
        atexit.register(self._finish_at_exit)

    def _finish_at_exit(self) -> None:
        """At the interpreter's exit, an engine thread told to stop may still be in its
        teardown (vLLM's shutdown with a timeout of 0 does not wait for it): the process
        then ended in native code under it ("terminate called without an active
        exception", SIGABRT; 2 stops in 9 on the tiny model). Stop it and wait for it,
        as a process's parent would."""
        if self._thread.is_alive():
            self.terminate()
            self._thread.join(EXIT_WAIT_S)
            if self._thread.is_alive():
                logger.warning(
                    "vllm-x86: the engine thread did not end within %.0f s of the exit",
                    EXIT_WAIT_S,
                )

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def terminate(self) -> None:
        """What the engine process's SIGTERM handler does: ask the busy loop to stop,
        and wake it if it waits for input."""
        self._stop.set()
        engine = self._engine
        if engine is None:
            return
        from vllm.v1.engine import EngineCoreRequestType
        from vllm.v1.engine.core import EngineShutdownState

        if engine.shutdown_state == EngineShutdownState.RUNNING:
            engine.shutdown_state = EngineShutdownState.REQUESTED
        engine.input_queue.put_nowait((EngineCoreRequestType.WAKEUP, None))

    def _run(self) -> None:
        from vllm.transformers_utils.config import maybe_register_config_serialize_by_value
        from vllm.v1.engine.core import EngineCoreProc, EngineShutdownState

        code = 1
        engine = None
        try:
            kwargs = dict(self._kwargs)
            dp_rank = kwargs.pop("dp_rank", 0)
            kwargs.pop("local_dp_rank", None)
            config = copy.deepcopy(kwargs["vllm_config"])
            kwargs["vllm_config"] = config
            maybe_register_config_serialize_by_value()
            config.parallel_config.data_parallel_index = dp_rank
            config.parallel_config.reconfigure_for_independent_dp_rank()
            engine = EngineCoreProc(engine_index=dp_rank, **kwargs)
            self._engine = engine
            if self._stop.is_set():
                engine.shutdown_state = EngineShutdownState.REQUESTED
            engine.run_busy_loop()
        except SystemExit as e:
            code = 0 if e.code in (None, 0) else 1
        except BaseException:
            if engine is None:
                logger.exception("EngineCore failed to start.")
            else:
                logger.exception("EngineCore encountered a fatal error.")
                try:
                    engine._send_engine_dead()
                except Exception:
                    pass
        finally:
            if engine is not None:
                try:
                    engine.shutdown()
                except Exception:
                    logger.exception("vllm-x86: the engine thread's shutdown failed")
            self.exitcode = code
            os.close(self._write)


class _Context:
    """vLLM's multiprocessing context, but an engine core that can run as a thread of
    this process gets an ``EngineThread``."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def Process(self, *args, target=None, name=None, kwargs=None, **rest):  # noqa: N802
        from vllm.v1.engine.core import EngineCoreProc

        if target is EngineCoreProc.run_engine_core and not args and wanted():
            why = _why_not(kwargs or {})
            if why is None:
                logger.info(
                    "vllm-x86: the engine core runs as a thread of the server process "
                    "(one process and one Python heap fewer; VLLM_X86_ENGINE_IN_SERVER=0: "
                    "its own process)"
                )
                return EngineThread(name or "EngineCore", dict(kwargs or {}))
            logger.info("vllm-x86: the engine core keeps its own process (%s)", why)
        return self._real.Process(*args, target=target, name=name, kwargs=kwargs, **rest)


def apply() -> None:
    """Install the context in vLLM's engine launcher, in the plugin's own server
    (idempotent; see above)."""
    if not envs.serve_defaults():
        return
    utils = importlib.import_module(UTILS_MODULE)  # already imported in a server
    original = getattr(utils, "get_mp_context", None)
    if original is None or getattr(original, MARK, False):
        return

    def get_mp_context():
        return _Context(original())

    setattr(get_mp_context, MARK, True)
    get_mp_context.__wrapped__ = original
    utils.get_mp_context = get_mp_context
