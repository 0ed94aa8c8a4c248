"""The engine core as a thread of the server (patches/engine_thread.py): which engines
the launcher's context turns into a thread, and that a thread reads to vLLM's own
manager and shutdown code as a process would (its sentinel, exit code, no pid to kill)."""

from __future__ import annotations

import queue
import threading
from multiprocessing import connection
from types import SimpleNamespace

import pytest

from vllm_x86.runtime.patches import engine_thread
from vllm_x86.runtime.patches.ledger import MARK


class _Parallel:
    def __init__(self, ranks=1, dp=1):
        self.world_size_across_dp = ranks
        self.data_parallel_size = dp
        self.reconfigured = False

    def reconfigure_for_independent_dp_rank(self):
        self.reconfigured = True


def _config(ranks=1, dp=1):
    return SimpleNamespace(parallel_config=_Parallel(ranks, dp))


class _RealContext:
    def __init__(self):
        self.asked = []

    def Process(self, *args, **kwargs):  # noqa: N802
        self.asked.append(kwargs)
        return "a process"

    def Queue(self):  # noqa: N802
        return "a queue"


@pytest.fixture
def served(monkeypatch):
    monkeypatch.setenv("VLLM_X86_SERVE_DEFAULTS", "1")
    monkeypatch.setenv("VLLM_X86_ENGINE_IN_SERVER", "1")
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")


def test_the_launcher_gets_a_thread_only_where_it_applies(served, monkeypatch):
    from vllm.v1.engine.core import EngineCoreProc
    from vllm.v1.executor import UniProcExecutor
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    real = _RealContext()
    ctx = engine_thread._Context(real)
    core = EngineCoreProc.run_engine_core

    def ask(config, executor, target=core):
        return ctx.Process(target=target, name="EngineCore",
                           kwargs={"vllm_config": config, "executor_class": executor})  # fmt: skip

    assert isinstance(ask(_config(), UniProcExecutor), engine_thread.EngineThread)
    # everything else is vLLM's process
    assert ask(_config(), MultiprocExecutor) == "a process"  # a worker process of its own
    assert ask(_config(ranks=2), UniProcExecutor) == "a process"
    assert ask(_config(dp=2), UniProcExecutor) == "a process"
    assert ask(_config(), UniProcExecutor, target=print) == "a process"
    assert ctx.Queue() == "a queue"  # the rest of the context is the real one
    monkeypatch.setenv("VLLM_X86_ENGINE_IN_SERVER", "0")
    assert ask(_config(), UniProcExecutor) == "a process"
    monkeypatch.setenv("VLLM_X86_ENGINE_IN_SERVER", "1")
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    assert ask(_config(), UniProcExecutor) == "a process"
    assert len(real.asked) == 6

    # apply() installs the context where vLLM's launcher looks it up, once
    import vllm.v1.engine.utils as utils

    monkeypatch.setattr(utils, "get_mp_context", utils.get_mp_context)
    engine_thread.apply()
    engine_thread.apply()
    assert getattr(utils.get_mp_context, MARK)
    assert not getattr(utils.get_mp_context.__wrapped__, MARK, False)
    assert isinstance(utils.get_mp_context(), engine_thread._Context)


class _Engine:
    """What the thread uses of vLLM's EngineCoreProc."""

    made: list = []
    fail_init = False
    fail_loop = False

    def __init__(self, vllm_config, executor_class, engine_index):
        from vllm.v1.engine.core import EngineShutdownState

        if _Engine.fail_init:
            raise RuntimeError("no model")
        self.config = vllm_config
        self.shutdown_state = EngineShutdownState.RUNNING
        self.input_queue = queue.Queue()
        self.shut = False
        self.dead_sent = False
        _Engine.made.append(self)

    def run_busy_loop(self):
        from vllm.v1.engine.core import EngineShutdownState

        while True:
            self.input_queue.get()
            if _Engine.fail_loop:
                raise RuntimeError("the model failed")
            if self.shutdown_state != EngineShutdownState.RUNNING:
                raise SystemExit

    def _send_engine_dead(self):
        self.dead_sent = True

    def shutdown(self):
        self.shut = True


@pytest.fixture
def fake_engine(monkeypatch):
    import vllm.v1.engine.core as core

    monkeypatch.setattr(core, "EngineCoreProc", _Engine)
    _Engine.made, _Engine.fail_init, _Engine.fail_loop = [], False, False
    return _Engine


def _thread(config):
    t = engine_thread.EngineThread(
        "EngineCore", {"vllm_config": config, "executor_class": None, "dp_rank": 0,
                       "local_dp_rank": 0})  # fmt: skip
    t.start()
    return t


def _ended(t, timeout=10.0) -> bool:
    return bool(connection.wait([t.sentinel], timeout=timeout))


def _made(engine_class) -> object:
    for _ in range(1000):
        if engine_class.made:
            return engine_class.made[0]
        threading.Event().wait(0.01)
    raise AssertionError("the thread made no engine in 10 s")


def test_vllms_shutdown_stops_the_thread_and_kills_nothing(fake_engine):
    from vllm.v1.utils import shutdown

    config = _config()
    t = _thread(config)
    assert t.pid is None  # vLLM's shutdown kills the process tree of a lingering pid
    engine = _made(fake_engine)
    assert t.is_alive() and t.exitcode is None and not _ended(t, 0.1)
    assert engine.config is not config  # the engine's own copy, as in a process
    assert engine.config.parallel_config.reconfigured
    shutdown([t], timeout=10)  # vLLM's: terminate, join, kill what has a pid
    assert not t.is_alive() and t.exitcode == 0 and _ended(t)
    assert engine.shut and not engine.dead_sent


def test_a_thread_that_fails_reads_as_a_dead_process(fake_engine):
    fake_engine.fail_init = True
    t = _thread(_config())
    assert _ended(t)  # vLLM's start-up wait and liveness monitor poll the sentinel
    t.join(5)
    assert t.exitcode == 1 and not fake_engine.made

    fake_engine.fail_init, fake_engine.fail_loop = False, True
    t = _thread(_config())
    engine = _made(fake_engine)
    engine.input_queue.put("a request")
    assert _ended(t)
    t.join(5)
    assert t.exitcode == 1 and engine.dead_sent and engine.shut  # the client is told
