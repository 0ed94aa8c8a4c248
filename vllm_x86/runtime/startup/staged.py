"""Staged warm-up: serve eagerly at once, switch to the compiled model when it is ready.

In compiled mode vLLM compiles the model before the server answers anything: on a CPU
with an empty compile cache that is most of a minute or more (73 s for the Qwen3-0.6B
shape on the development VM). With staged warm-up (``VLLM_X86_STAGED_WARMUP``: on by
default for servers started by ``vllm-x86 serve`` or its daemon, which set
``VLLM_X86_SERVE_DEFAULTS=1``; ``1`` anywhere), when
the worker finds no compiled model for its settings in vLLM's cache:

1. It forks a compile process from itself once the model is loaded (before the KV cache
   exists): same model objects, same configuration, so the same cache key. That
   process lowers its priority (nice 19, so requests come first on a busy CPU), runs
   vLLM's own compile path on a 16-token dummy batch (the graph is dynamic in the
   token count), which saves the compiled model to vLLM's cache, records it in the
   plugin's cache manifest (compile_cache.py) and exits.
2. The worker itself marks its compiled modules ``do_not_compile`` (vLLM's own switch
   in ``support_torch_compile``: the module's Python ``forward`` runs) and serves
   eagerly meanwhile.
3. Before each step it asks whether the compile process has exited (a ``waitpid``
   that does not block). When it succeeded and the artifact is where vLLM looks for
   it, the worker clears ``do_not_compile``; at its next call vLLM finds the artifact
   and loads it as on any start with a filled cache (the one step that loads it takes
   0.1-0.2 s longer on the development VM), and the model runs compiled from then on.

A compile process that fails is reported in the log with its exit code and the worker
keeps serving eagerly; the next start compiles again (or set
``VLLM_X86_STAGED_WARMUP=0`` to compile in the foreground, as vLLM does, and see the
error at start-up). The eager stage runs vLLM's native ops, as the compiled
configuration asks (the plugin's eager kernels are chosen for eager mode only), and its
greedy text can part from the compiled model's where bf16 rounding makes a near tie
(docs/correctness.md): a request running during the switch may see both. Models
with more than one compiled module, and runs with more than one worker (tensor,
pipeline or data parallel), compile before serving, as in vLLM.

What this relies on in vLLM (``do_not_compile``, ``save_aot_compiled_function``, the AOT
cache path and its private hash functions, the private dummy run) is in the patch
ledger, records staged_compile and compiled_model_cache_path (runtime/patches/ledger.py).
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback

from vllm_x86.runtime import envs
from vllm_x86.runtime.log import get_logger
from vllm_x86.runtime.startup import childproc

logger = get_logger("staged")

# The compile process's dummy batch (tokens): enough to trace and compile every kernel.
COMPILE_TOKENS = 16


def compiled_modules(model) -> list:
    """The modules vLLM's ``support_torch_compile`` compiles in this model."""
    return [
        m
        for m in model.modules()
        if hasattr(m, "was_aot_compile_fn_loaded_from_disk")
        and not getattr(m, "do_not_compile", True)
    ]


class StagedCompile:
    """The worker's side: the compile process and the switch."""

    def __init__(self, worker, pid: int, modules: list):
        self.worker = worker
        self.pid = pid
        self.modules = modules
        self.t0 = time.monotonic()
        self.done = False
        self.switched_at: float | None = None

    @classmethod
    def start(cls, worker) -> StagedCompile | None:
        """Fork the compile process and switch this worker to eager; None (nothing
        forked, nothing changed) for a model without exactly one compiled module or a
        run with more than one worker."""
        runner = worker.model_runner
        modules = compiled_modules(runner.model)
        if len(modules) != 1:  # none, or several (an encoder and a decoder): vLLM's way
            return None
        if worker.vllm_config.parallel_config.world_size_across_dp > 1:
            # Several workers: a compile process must not touch their process groups.
            logger.info(
                "vllm-x86: staged warm-up is for one worker; %d workers compile before "
                "serving, as in vLLM",
                worker.vllm_config.parallel_config.world_size_across_dp,
            )
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _compile_child(worker)  # never returns
        for m in modules:
            m.do_not_compile = True
        logger.info(
            "vllm-x86: staged warm-up: no compiled model in the cache for these settings; "
            "serving eagerly now and compiling in the background (pid %d, nice 19). The "
            "server switches to the compiled model when it is ready "
            "(VLLM_X86_STAGED_WARMUP=0: compile before serving, as vLLM does)",
            pid,
        )
        return cls(worker, pid, modules)

    def after_step(self) -> None:
        """After a step: report the one that loaded the compiled model."""
        if self.switched_at is not None:
            logger.info(
                "vllm-x86: staged warm-up: serving the compiled model (the step that "
                "loaded it took %.2f s)",
                time.monotonic() - self.switched_at,
            )
            self.switched_at = None

    def poll(self) -> None:
        """Before a step: switch to the compiled model once the compile process is done."""
        if self.done:
            return
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere: the cache check below decides
            pid, status = self.pid, None
        if pid == 0:
            return
        self.done = True
        secs = time.monotonic() - self.t0
        code = os.waitstatus_to_exitcode(status) if status is not None else 0
        if code != 0:
            logger.warning(
                "vllm-x86: staged warm-up: the background compile failed (exit code %s, "
                "after %.0f s; its error is above in this log); serving eagerly. "
                "VLLM_X86_STAGED_WARMUP=0 compiles before serving instead.",
                code,
                secs,
            )
            return

        for m in self.modules:  # vLLM compiles (here: loads) them from now on
            m.do_not_compile = False
        if not compiled_model_in_cache(self.worker.model_runner, self.worker.vllm_config):
            for m in self.modules:
                m.do_not_compile = True
            logger.warning(
                "vllm-x86: staged warm-up: the background compile finished after %.0f s "
                "but its compiled model is not in vLLM's cache; serving eagerly",
                secs,
            )
            return
        logger.info(
            "vllm-x86: staged warm-up: compiled model ready after %.0f s; switching to it",
            secs,
        )
        self.switched_at = time.monotonic()


class _Saved(Exception):
    """Raised in the compile process once vLLM has saved the compiled model."""


def compiled_model_in_cache(runner, vllm_config) -> bool | None:
    """Whether every module vLLM compiles in this model has its AOT artifact at the
    path vLLM will load it from (vllm/compilation/decorators.py, the ``__call__`` of
    ``support_torch_compile``: VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/
    <sha256 of aot_compile_hash_factors + _model_hash_key(forward)>/rank_<r>_<dp>/model),
    computed with vLLM's own functions. None where the question does not apply or
    cannot be answered (eager, no AOT mode, cache disabled, a multimodal model or
    pipeline stages, whose warm-up does more; no compiled module; a vLLM that hashes
    otherwise): vLLM's full warm-up then."""
    import hashlib
    from pathlib import Path

    from vllm import envs as vllm_envs
    from vllm.config import CompilationMode

    try:
        if vllm_config.compilation_config.mode == CompilationMode.NONE:
            return None
        if not vllm_envs.VLLM_USE_AOT_COMPILE or vllm_envs.VLLM_DISABLE_COMPILE_CACHE:
            return None
        # vLLM's profile run also warms a multimodal encoder and pipeline stages
        if runner.supports_mm_inputs or vllm_config.parallel_config.pipeline_parallel_size > 1:
            return None
        from vllm.compilation.caching import aot_compile_hash_factors
        from vllm.compilation.decorators import _model_hash_key

        compiled = compiled_modules(runner.model)
        if not compiled:
            return None
        pc = vllm_config.parallel_config
        for m in compiled:
            factors = aot_compile_hash_factors(vllm_config)
            factors.append(_model_hash_key(m.forward))
            digest = hashlib.sha256(str(factors).encode()).hexdigest()
            path = (
                Path(vllm_envs.VLLM_CACHE_ROOT)
                / "torch_compile_cache"
                / "torch_aot_compile"
                / digest
                / f"rank_{pc.rank}_{pc.data_parallel_index}"
                / "model"
            )
            if not path.is_file():
                return False
        return True
    except Exception as e:  # vLLM's full warm-up, as without the plugin
        logger.info("vllm-x86: full warm-up (could not look for a cached model: %s)", e)
        return None


def _compile_child(worker) -> None:
    """In the forked compile process: compile, save, record, exit."""
    code = 1
    try:
        childproc.die_with_parent(signal.SIGKILL)
        os.nice(19)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        t0 = time.monotonic()
        runner = worker.model_runner
        from vllm.v1.worker.cpu_model_runner import _set_global_compilation_settings

        # Stop right after vLLM saved the compiled model, before it runs it: this
        # process was forked from a worker whose OpenMP threads it does not have, and
        # a parallel region here (every compiled kernel opens one) would wait for them
        # forever. Tracing and compiling compute nothing.
        (module,) = compiled_modules(runner.model)
        save = module.save_aot_compiled_function

        def save_and_stop():
            save()
            raise _Saved

        module.save_aot_compiled_function = save_and_stop
        n = min(COMPILE_TOKENS, runner.max_num_tokens)
        try:
            with _set_global_compilation_settings(runner.vllm_config):
                runner._dummy_run(n, is_profile=True)
        except _Saved:
            pass
        else:
            raise RuntimeError("vLLM ran the model without compiling and saving it")
        from vllm_x86.runtime.startup import compile_cache

        compile_cache.seal_after_warmup(runner.vllm_config)
        logger.info(
            "vllm-x86: staged warm-up: background compile done in %.0f s",
            time.monotonic() - t0,
        )
        code = 0
    except BaseException:
        traceback.print_exc()
        logger.error("vllm-x86: staged warm-up: the background compile failed (above)")
    finally:
        childproc.exit_now(code)


def enabled() -> bool:
    """VLLM_X86_STAGED_WARMUP: auto means the plugin's own servers
    (VLLM_X86_SERVE_DEFAULTS, set by `vllm-x86 serve` and its daemon), where time to the
    first answer is what a user waits for; an offline run of the LLM class would spend
    its short life eager beside a compile it never uses."""
    if envs.get("VLLM_X86_STAGED_WARMUP").strip().lower() == "auto":
        return envs.serve_defaults()
    return envs.get_bool("VLLM_X86_STAGED_WARMUP")
