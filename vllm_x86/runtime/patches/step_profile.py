"""Patch ``step_profile`` (a monkey-patch; ledger.py): where a decode step's time goes.

Only with ``VLLM_X86_STEP_PROFILE=<directory>`` (the harness's profiling mode,
``python -m vllm_x86.tools.bench.overhead``, sets it for the server it starts); without
it ``apply()`` returns before importing anything, and nothing of vLLM changes.

With it, timing wrappers go around the places of vLLM that one decode step passes
through, in the three processes of a server, each wrapper calling vLLM's method
unchanged and noting ``time.perf_counter()`` spans and a ``time.monotonic()`` start
(CLOCK_MONOTONIC is one clock for every process of the machine, so the harness can put
the records of the three processes and its own client on one time line):

- API server: ``OutputProcessor.process_outputs`` (``v1/engine/output_processor.py``:
  the front end's output processing and detokenization), and how long after the engine
  core made the outputs (``engine_core_timestamp``, vLLM's own ``time.monotonic()`` of
  ``EngineCoreOutputs``) it runs: the engine-core -> API-server hand-off;
- engine core: ``EngineCoreProc._process_engine_step`` (``v1/engine/core.py``: one step
  of the busy loop, with putting its outputs on the output queue), ``Scheduler.schedule``
  and ``Scheduler.update_from_output`` (``v1/core/sched/scheduler.py``), and the wait for
  the worker: from ``MultiprocExecutor.execute_model`` being called to
  ``MultiprocExecutor.sample_tokens`` returning (``v1/executor/multiproc_executor.py``;
  the same on ``UniProcExecutor``, where the worker runs in the engine core's process);
- worker: ``GPUModelRunner.execute_model`` (which vLLM CPU's ``CPUModelRunner``
  inherits: the input and metadata preparation, the forward, the LM head),
  ``GPUModelRunner._model_forward`` (the forward alone), ``LogitsProcessor.forward``
  (``model_executor/layers/logits_processor.py``: the LM head, called from
  ``compute_logits`` in ``execute_model`` after the forward) and
  ``GPUModelRunner.sample_tokens`` (the sampler).

Each process keeps its records in memory and a daemon thread writes them to
``<directory>/<role>-<pid>.json`` once the process has had no new record for 0.3 s (so
nothing is written while a request decodes). Op self-times come from torch's profiler,
in the worker only and only when asked: when ``<directory>/ops-request`` exists
(holding a number of decode steps N), the next step starts ``torch.profiler.profile``
(CPU activity, no shapes or stacks), each forward runs inside a
``record_function("vllm_x86.step_profile: forward")`` scope, and after N decode steps
the profiler stops and the forward's top-level ops (those directly under the scope, or
under the scopes torch.compile adds) are summed by name into
``<directory>/ops-<pid>.json``; steps run under the profiler are marked so the timing
figures leave them out. The harness (tools/bench/overhead.py) turns all this into the
breakdown of docs/overhead.md.

Why timing wrappers and not vLLM's own profiler hooks: vLLM's ``--profiler-config``
torch profiler traces whole steps into a trace file per process, with its overhead on
every op of the steps it measures; the wall time of the parts of a step, without that
overhead, and the hand-offs between processes need a clock read at both ends, which is
all the wrappers do (about 1 us each).

Upstream change that removes it: none needed; it is a measuring tool, off by default.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time

from vllm_x86.runtime import envs
from vllm_x86.runtime.log import get_logger
from vllm_x86.runtime.patches.ledger import MARK

logger = get_logger("patches")

SETTING = "VLLM_X86_STEP_PROFILE"
OPS_REQUEST = "ops-request"
FORWARD_SCOPE = "vllm_x86.step_profile: forward"
IDLE_WRITE_S = 0.3

# (module, class, attribute): every attribute the patch replaces, for the tests
TARGETS = (
    ("vllm.v1.engine.output_processor", "OutputProcessor", "process_outputs"),
    ("vllm.v1.engine.core", "EngineCoreProc", "_process_engine_step"),
    ("vllm.v1.core.sched.scheduler", "Scheduler", "schedule"),
    ("vllm.v1.core.sched.scheduler", "Scheduler", "update_from_output"),
    ("vllm.v1.executor.multiproc_executor", "MultiprocExecutor", "execute_model"),
    ("vllm.v1.executor.multiproc_executor", "MultiprocExecutor", "sample_tokens"),
    ("vllm.v1.executor.uniproc_executor", "UniProcExecutor", "execute_model"),
    ("vllm.v1.executor.uniproc_executor", "UniProcExecutor", "sample_tokens"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "execute_model"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_model_forward"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "sample_tokens"),
    ("vllm.model_executor.layers.logits_processor", "LogitsProcessor", "forward"),
)


def out_dir() -> str | None:
    """The directory VLLM_X86_STEP_PROFILE names, or None (the patch is off)."""
    value = envs.get(SETTING).strip()
    return os.path.expanduser(value) if value else None


def enabled() -> bool:
    return out_dir() is not None


# ----------------------------------------------------------------------------- records


class Recorder:
    """One process's records, written by a daemon thread while the process is idle."""

    def __init__(self, role: str, directory: str):
        self.role = role
        self.pid = os.getpid()
        self.path = os.path.join(directory, f"{role}-{self.pid}.json")
        self.records: list[dict] = []
        self.current: dict | None = None  # the step being recorded (engine, worker)
        self.last = 0.0
        self.written = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._writer, name=f"step-profile-{role}", daemon=True).start()

    def add(self, record: dict) -> None:
        with self.lock:
            self.records.append(record)
            self.last = time.monotonic()

    def _writer(self) -> None:
        while True:
            time.sleep(IDLE_WRITE_S / 2)
            with self.lock:
                idle = time.monotonic() - self.last >= IDLE_WRITE_S
                if not idle or len(self.records) == self.written:
                    continue
                snapshot = list(self.records)
            self.write(snapshot)
            self.written = len(snapshot)

    def write(self, records: list[dict]) -> None:
        data = {"role": self.role, "pid": self.pid, "records": records}
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(data, f)
            os.replace(tmp, self.path)
        except OSError as e:  # a measuring aid: never a reason to fail a server
            logger.warning("vllm-x86: step profile not written to %s: %s", self.path, e)


_RECORDERS: dict[tuple[str, int], Recorder] = {}


def _wraps(original):
    """functools.wraps, keeping the wrapper's own ``__module__`` (vllm_x86...), so the
    ledger's test finds it as the plugin's code on vLLM's class."""
    return functools.wraps(original, assigned=("__name__", "__qualname__", "__doc__"))


def recorder(role: str) -> Recorder | None:
    directory = out_dir()
    if directory is None:
        return None
    key = (role, os.getpid())  # a forked child gets its own
    rec = _RECORDERS.get(key)
    if rec is None:
        os.makedirs(directory, exist_ok=True)
        rec = _RECORDERS[key] = Recorder(role, directory)
    return rec


def _timed(into: str):
    """A wrapper that adds the wall time of the call to the current step's ``into``."""

    def deco(original, role):
        @_wraps(original)
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                rec = recorder(role)
                if rec is not None and rec.current is not None:
                    cur = rec.current
                    cur[into] = cur.get(into, 0.0) + time.perf_counter() - t0

        return wrapper

    return deco


# ----------------------------------------------------------------------------- API server


def _process_outputs(original):
    @_wraps(original)
    def process_outputs(self, engine_core_outputs, engine_core_timestamp=None, *args, **kwargs):
        start = time.monotonic()
        t0 = time.perf_counter()
        try:
            return original(self, engine_core_outputs, engine_core_timestamp, *args, **kwargs)
        finally:
            rec = recorder("api")
            if rec is not None:
                rec.add(
                    {
                        "t": start,
                        "process_outputs": time.perf_counter() - t0,
                        "from_engine": (start - engine_core_timestamp)
                        if engine_core_timestamp
                        else None,
                        "outputs": len(engine_core_outputs),
                    }
                )

    return process_outputs


# ----------------------------------------------------------------------------- engine core


def _engine_step(original):
    @_wraps(original)
    def _process_engine_step(self, *args, **kwargs):
        rec = recorder("engine")
        if rec is None:
            return original(self, *args, **kwargs)
        cur = rec.current = {"t": time.monotonic(), "tokens": 0}
        t0 = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            cur["step"] = time.perf_counter() - t0
            rec.current = None
            rec.add(cur)

    return _process_engine_step


def _schedule(original):
    timed = _timed("schedule")(original, "engine")

    @_wraps(original)
    def schedule(self, *args, **kwargs):
        out = timed(self, *args, **kwargs)
        rec = recorder("engine")
        if rec is not None and rec.current is not None:
            rec.current["tokens"] = int(getattr(out, "total_num_scheduled_tokens", 0) or 0)
        return out

    return schedule


def _execute_start(original):
    @_wraps(original)
    def execute_model(self, *args, **kwargs):
        rec = recorder("engine")
        if rec is not None and rec.current is not None:
            rec.current["_wait_start"] = time.perf_counter()
        return original(self, *args, **kwargs)

    return execute_model


def _sample_end(original):
    @_wraps(original)
    def sample_tokens(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        finally:
            rec = recorder("engine")
            cur = rec.current if rec is not None else None
            if cur is not None and "_wait_start" in cur:
                cur["worker_wait"] = time.perf_counter() - cur.pop("_wait_start")

    return sample_tokens


# ----------------------------------------------------------------------------- worker


class _Ops:
    """The worker's op profiler: started when ops-request appears, stopped after N
    decode steps."""

    def __init__(self):
        self.prof = None
        self.steps_left = 0
        self.seen_mtime = None

    def maybe_start(self, directory: str) -> None:
        if self.prof is not None:
            return
        path = os.path.join(directory, OPS_REQUEST)
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return
        if mtime == self.seen_mtime:
            return
        self.seen_mtime = mtime
        try:
            with open(path) as f:
                self.steps_left = max(1, int(f.read().strip() or "16"))
        except (OSError, ValueError):
            self.steps_left = 16
        import torch

        self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self.prof.__enter__()

    def after_step(self, decode: bool, directory: str) -> None:
        if self.prof is None or not decode:
            return
        self.steps_left -= 1
        if self.steps_left > 0:
            return
        prof, self.prof = self.prof, None
        prof.__exit__(None, None, None)
        summary = summarize_ops(prof.events())
        summary["pid"] = os.getpid()
        path = os.path.join(directory, f"ops-{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(summary, f)
        os.replace(path + ".tmp", path)


_OPS: dict[int, _Ops] = {}


def _ops() -> _Ops:
    return _OPS.setdefault(os.getpid(), _Ops())


def _runner_execute(original):
    @_wraps(original)
    def execute_model(self, scheduler_output, *args, **kwargs):
        rec = recorder("worker")
        if rec is None:
            return original(self, scheduler_output, *args, **kwargs)
        ops = _ops()
        tokens = int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0)
        if tokens == 1:  # op profiles of decode steps at 1 request only
            ops.maybe_start(out_dir() or "")
        cur = rec.current = {"t": time.monotonic(), "tokens": tokens}
        if ops.prof is not None:
            cur["profiled"] = True
        t0 = time.perf_counter()
        try:
            return original(self, scheduler_output, *args, **kwargs)
        finally:
            cur["execute"] = time.perf_counter() - t0

    return execute_model


def _model_forward(original):
    timed = _timed("forward")(original, "worker")

    @_wraps(original)
    def _model_forward(self, *args, **kwargs):
        if _ops().prof is None:
            return timed(self, *args, **kwargs)
        import torch

        with torch.profiler.record_function(FORWARD_SCOPE):
            return timed(self, *args, **kwargs)

    return _model_forward


def _runner_sample(original):
    @_wraps(original)
    def sample_tokens(self, *args, **kwargs):
        rec = recorder("worker")
        cur = rec.current if rec is not None else None
        t0 = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            if cur is not None:
                cur["sample"] = time.perf_counter() - t0
                rec.current = None
                rec.add(cur)
                _ops().after_step(cur.get("tokens") == 1, out_dir() or "")

    return sample_tokens


def _logits_forward(original):
    return _timed("lm_head")(original, "worker")


# ----------------------------------------------------------------------------- op summary

GEMM, ATTENTION, OTHER = "gemm", "attention", "other"


def op_category(name: str) -> str:
    """gemm, attention or other, from an operator's (or an Inductor kernel's) name."""
    import re

    n = name.split("::")[-1].lower()
    if "cpp_fused" in n:
        # an Inductor kernel, named after the nodes it fuses: elementwise work around
        # the GEMMs (which Inductor leaves to extern calls: aten, _C, vllm_x86 ops)
        return OTHER
    if any(k in n for k in ("attention", "attn", "reshape_and_cache", "paged", "kv_cache")):
        return ATTENTION
    if any(k in n for k in ("linear", "gemm", "matmul")) or re.search(
        r"(^|_)(mm|addmm|bmm|baddbmm|addmv|mv)(_|$)", n
    ):
        return GEMM
    return OTHER


def is_op(name: str) -> bool:
    """An operator (``ns::name``) or an Inductor C++ kernel (its kernel-profile
    label); anything else (``Torch-Compiled Region``, ``## Call CompiledFxGraph ##``,
    other record_function scopes) is a scope whose children are looked into."""
    return "::" in name or "cpp_fused" in name or name.startswith("graph_")


def top_ops(event):
    """The ops directly under ``event``, looking through scopes that are not ops."""
    for child in event.cpu_children:
        if is_op(child.name):
            yield child
        else:
            yield from top_ops(child)


def summarize_ops(events) -> dict:
    """Per op name: the total CPU time (us, its children included) and the self time of
    the top-level ops of the forwards (FORWARD_SCOPE scopes), with the forwards' count
    and wall time."""
    by_name: dict[str, dict] = {}
    forward_us = 0.0
    forwards = 0
    for ev in events:
        if ev.name != FORWARD_SCOPE:
            continue
        forwards += 1
        forward_us += ev.cpu_time_total
        for op in top_ops(ev):
            e = by_name.setdefault(op.name, {"us": 0.0, "self_us": 0.0, "calls": 0})
            e["us"] += op.cpu_time_total
            e["self_us"] += op.self_cpu_time_total  # a Python custom op: its Python
            e["calls"] += 1
    return {"forwards": forwards, "forward_us": forward_us, "ops": by_name}


# ----------------------------------------------------------------------------- install


_WRAPPERS = {
    "process_outputs": _process_outputs,
    "_process_engine_step": _engine_step,
    "schedule": _schedule,
    "update_from_output": lambda o: _timed("update_from_output")(o, "engine"),
    ("MultiprocExecutor", "execute_model"): _execute_start,
    ("MultiprocExecutor", "sample_tokens"): _sample_end,
    ("UniProcExecutor", "execute_model"): _execute_start,
    ("UniProcExecutor", "sample_tokens"): _sample_end,
    ("GPUModelRunner", "execute_model"): _runner_execute,
    "_model_forward": _model_forward,
    ("GPUModelRunner", "sample_tokens"): _runner_sample,
    "forward": _logits_forward,
}


def apply() -> None:
    """Install the wrappers when VLLM_X86_STEP_PROFILE is set (idempotent)."""
    if not enabled():
        return
    import importlib

    for module, cls_name, attr in TARGETS:
        cls = getattr(importlib.import_module(module), cls_name)
        original = vars(cls).get(attr)
        if original is None or getattr(original, MARK, False):
            continue
        make = _WRAPPERS.get((cls_name, attr)) or _WRAPPERS[attr]
        wrapper = make(original)
        setattr(wrapper, MARK, True)
        setattr(cls, attr, wrapper)
    logger.info("vllm-x86: step profile on (%s=%s)", SETTING, out_dir())
