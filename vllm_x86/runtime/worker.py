"""X86Worker: vLLM's CPU worker, planning memory with what the machine really has.

vLLM's ``CPUWorker`` budgets memory from the NUMA node's meminfo. On VMs whose single
node reports a fraction of the machine's memory (and a number that moves as memory
is hot-plugged), that budget is wrong: stock vLLM refuses to start
("Available memory on node 0 (7.54/8.96 GiB) ... is less than desired CPU memory
utilization") or sizes the KV cache from the wrong total. This worker is the same
worker with ``hardware.memory_info()`` as the memory source; see that function for
when node numbers are trusted. In compiled mode it also warms a cached compiled model up
with a short run (below) and, with nothing in the cache, serves eagerly while a
background process compiles (staged.py). Everything else is inherited.

Where this class repeats vLLM's steps or uses its private hooks (the constructor,
``determine_available_memory``, ``_maybe_get_memory_pool_context``, the short warm-up),
each is a record of the patch ledger (runtime/patches/ledger.py, docs/patches.md), which
checks it against the installed vLLM.
"""

from __future__ import annotations

import math
import os
import time

import psutil
import torch
from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_visible_memory_node
from vllm.utils.mem_utils import format_gib
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm.v1.worker.gpu_worker import Worker

from vllm_x86.runtime import envs, hardware
from vllm_x86.runtime.log import get_logger
from vllm_x86.runtime.startup import staged

logger = get_logger("worker")


class X86Worker(CPUWorker):
    def __init__(
        self,
        vllm_config,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        is_driver_worker: bool = False,
    ):
        # Same steps as CPUWorker.__init__ (vLLM 0.32.0), with the plugin's memory source
        # (ledger: x86_worker_constructor, which fails when vLLM's constructor changes).
        allowed_memory_nodes = get_visible_memory_node()
        cpu_core = get_allowed_cpu_list()[0]
        if cpu_core.numa_node in allowed_memory_nodes:
            memory_node = cpu_core.numa_node
        else:
            memory_node = allowed_memory_nodes[0] if allowed_memory_nodes else 0
        torch.ops._C.init_cpu_memory_env([memory_node])
        self._memory_node = memory_node

        mem = hardware.memory_info(memory_node)
        fraction = vllm_config.cache_config.gpu_memory_utilization
        self.requested_cpu_memory = math.ceil(mem.total * fraction)
        if (
            vllm_config.cache_config.kv_cache_memory_bytes is None
            and self.requested_cpu_memory > mem.available
        ):
            raise ValueError(
                f"--gpu-memory-utilization={fraction} asks for "
                f"{format_gib(self.requested_cpu_memory)} GiB of this machine's "
                f"{format_gib(mem.total)} GiB, but only {format_gib(mem.available)} GiB "
                f"are available ({mem.source}). On CPU this flag is the fraction of "
                "memory for the whole worker; lower it, or set the KV cache size "
                "directly with VLLM_CPU_KVCACHE_SPACE (GiB)."
            )
        Worker.__init__(
            self,
            vllm_config,
            local_rank,
            rank,
            distributed_init_method,
            is_driver_worker=is_driver_worker,
        )
        self.parallel_config.disable_custom_all_reduce = True

    def init_device(self) -> None:
        from vllm.config import CompilationMode

        if self.vllm_config.compilation_config.mode != CompilationMode.NONE:
            # Before the threads are pinned: the checks' thread and subprocesses may use
            # the other cores while the weights load (startup/inductor_checks.py).
            from vllm_x86.runtime.startup import inductor_checks

            inductor_checks.start()
        if self.parallel_config.distributed_executor_backend == "uni":
            _pin_threads_in_engine(self.vllm_config, self.local_rank)
        elif os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") == "fork":
            _pin_forked_threads()
        import torch

        threads = torch.get_num_threads()
        super().init_device()
        _keep_threads_after_ngram(self.vllm_config, threads)
        if self.parallel_config.world_size > 1:
            logger.info("vllm-x86: %s", rank_report(self.rank, self.parallel_config))

    def load_model(self, *args, **kwargs) -> None:
        from vllm_x86.runtime.ops import registry

        registry.register_layers()  # the op table's layer rows, before the model is built
        t0 = time.perf_counter()
        super().load_model(*args, **kwargs)
        # vLLM's CPU runner logs no total; this one covers reading the weights and
        # processing them after loading (quantizing, packing). vllm_x86/tools/bench/micro/quant_load.py
        # reads it.
        logger.info("model weights loaded in %.2f s", time.perf_counter() - t0)
        from vllm.config import set_current_vllm_config

        draft = _draft_model(self.model_runner)
        _fused_verification(self.vllm_config)
        with set_current_vllm_config(self.vllm_config):
            registry.apply_module_overrides(self.model_runner.get_model())
            if draft is not None:
                # vLLM loads a speculative draft model inside the runner's load_model:
                # it gets the same module rows (fused decode layers, the plugin's
                # attention) as the model it drafts for
                logger.info("vllm-x86: the speculative draft model (%s):", type(draft).__name__)
                registry.apply_module_overrides(draft)
        from vllm_x86.runtime.quant.lm_head import release_unshared_weights

        release_unshared_weights(self.model_runner.get_model())
        if draft is not None:
            release_unshared_weights(draft)
        from vllm_x86.runtime.ops import file_embedding

        file_embedding.attach(self.model_runner.get_model(), self.vllm_config)
        if self.parallel_config.world_size > 1:
            logger.info(
                "vllm-x86: rank %d: %s",
                self.rank,
                plugin_modules_report(self.model_runner.get_model()),
            )

    _staged: staged.StagedCompile | None = None

    def execute_model(self, *args, **kwargs):
        if self._staged is None:
            return super().execute_model(*args, **kwargs)
        self._staged.poll()
        out = super().execute_model(*args, **kwargs)
        self._staged.after_step()
        return out

    def compile_or_warm_up_model(self, *args, **kwargs):
        out = super().compile_or_warm_up_model(*args, **kwargs)
        from vllm_x86.runtime.startup import compile_cache

        compile_cache.seal_after_warmup(self.vllm_config)  # see compile_cache.py
        from vllm_x86.runtime import heap

        heap.return_freed_memory("after loading and warm-up")
        return out

    def _maybe_get_memory_pool_context(self, tag: str):
        # vLLM enters this context around its KV cache allocation (tag "kv_cache"):
        # the cache comes from fresh zero pages instead of a start-up memset
        # (kv_alloc.py; ledger: kv_cache_pool_context).
        if tag == "kv_cache" and envs.get_bool("VLLM_X86_KV_ZERO_PAGES"):
            from vllm_x86.runtime.startup.kv_alloc import fresh_zero_pages

            return fresh_zero_pages()
        return super()._maybe_get_memory_pool_context(tag)

    def determine_available_memory(self) -> int:
        # CPUWorker's steps with the plugin's memory source and warm-ups (ledger:
        # x86_worker_available_memory)
        if self._should_warm_up_model():
            from vllm_x86.runtime.startup import inductor_checks

            inductor_checks.wait()
            if cached_compiled_model(self.model_runner, self.vllm_config):
                _short_warm_up(self.model_runner)
            else:
                in_cache = staged.compiled_model_in_cache(self.model_runner, self.vllm_config)
                if in_cache is False and staged.enabled():
                    self._staged = staged.StagedCompile.start(self)
                if self._staged is None:
                    if in_cache is False:
                        logger.info(
                            "vllm-x86: compiling the model: no compiled model for these "
                            "settings in the cache yet. This can take minutes on a CPU; "
                            "later starts with the same settings load it (--enforce-eager "
                            "starts without compiling)"
                        )
                    self.model_runner.warming_up_model()
        _pp_stage_buffers(self.model_runner)
        mem = hardware.memory_info(self._memory_node)
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit is not None:
            if explicit > mem.available:
                raise ValueError(
                    f"The KV cache needs {format_gib(explicit)} GiB but only "
                    f"{format_gib(mem.available)} GiB of memory are available "
                    f"({mem.source}). Lower VLLM_CPU_KVCACHE_SPACE, "
                    "--kv-cache-memory-bytes or VLLM_X86_KV_CACHE_GIB, or free memory."
                )
            logger.info(
                "KV cache: %s GiB (%s GiB available, %s).",
                format_gib(explicit),
                format_gib(mem.available),
                mem.source,
            )
            return explicit
        consumed = psutil.Process(os.getpid()).memory_info().rss
        kv = int(self.requested_cpu_memory - consumed)
        if kv <= 0 or kv > mem.available:
            raise ValueError(
                f"--gpu-memory-utilization leaves {format_gib(max(kv, 0))} GiB for the "
                f"KV cache after the model's {format_gib(consumed)} GiB "
                f"({format_gib(mem.available)} GiB available, {mem.source}). Raise "
                "--gpu-memory-utilization or set VLLM_CPU_KVCACHE_SPACE (GiB)."
            )
        logger.info(
            "KV cache: %s GiB (%s GiB requested for the worker, %s GiB used by the "
            "model and runtime; %s).",
            format_gib(kv),
            format_gib(self.requested_cpu_memory),
            format_gib(consumed),
            mem.source,
        )
        return kv


def _fused_verification(vllm_config) -> None:
    """With speculative decoding, let steps of up to k + 2 tokens per sequence take the
    fused decode call (ops/decoder_layer.py; VLLM_X86_FUSED_VERIFICATION=0: not): the
    target's verification of k drafted tokens has k + 1, and a draft model's first step
    of each round up to k + 2 (the tokens the target accepted and the one it added)."""
    from vllm_x86.runtime import envs
    from vllm_x86.runtime.ops import decoder_layer

    spec = vllm_config.speculative_config
    k = getattr(spec, "num_speculative_tokens", None) if spec is not None else None
    if not k or not envs.get_bool("VLLM_X86_FUSED_VERIFICATION"):
        decoder_layer.allow_rows_per_sequence(1)
        return
    decoder_layer.allow_rows_per_sequence(k + 2)
    logger.info(
        "vllm-x86: speculative steps of up to %d tokens per sequence take the fused decode "
        "call where the layers do (VLLM_X86_FUSED_VERIFICATION=0: the layers' own code)",
        k + 2,
    )


def _draft_model(model_runner):
    """The speculative draft model vLLM's runner loaded beside the model (a draft model's
    proposer keeps it as ``drafter.model``), or None: no speculation, n-gram lookup
    (no model), or a proposer whose model is the target's own layers (MTP, EAGLE)."""
    import torch

    drafter = getattr(model_runner, "drafter", None)
    model = getattr(drafter, "model", None)
    if not isinstance(model, torch.nn.Module) or model is model_runner.get_model():
        return None
    return model


def _keep_threads_after_ngram(vllm_config, threads: int) -> None:
    """Keep the model's OpenMP threads from vLLM's n-gram proposer.

    The proposer (vllm/v1/spec_decode/ngram_proposer.py) runs numba code on the
    worker's main thread. numba sizes its OpenMP pool from that thread's CPU affinity when it is imported, and vLLM's thread
    binding has pinned that thread to one CPU, so numba's first parallel call (the
    proposer's first request) runs ``omp_set_num_threads(1)`` on it: from then on every
    OpenMP region of the model on that thread (PyTorch's, vLLM's and the plugin's
    kernels) runs one thread whatever the thread layout says (measured: a 2-core server
    with n-gram speculation decoded as fast as one with VLLM_X86_THREADS=1;
    docs/speculative.md). So numba's pool is started here, at once (its public
    ``get_num_threads`` starts it, as the proposer's first call would), and the count
    the worker had before vLLM's ``init_device`` is set again; later proposer calls do
    not shrink it (the pool exists; numba's ``set_num_threads`` leaves OpenMP's count
    alone)."""
    if getattr(vllm_config.speculative_config, "method", None) != "ngram":
        return
    import torch

    try:
        import numba
    except ImportError:
        return
    numba.get_num_threads()  # starts numba's OpenMP pool on this thread, now
    now = torch.get_num_threads()
    if now < threads:
        torch._C.set_num_threads(threads)  # vLLM CPU replaced torch.set_num_threads
        logger.info(
            "vllm-x86: speculative decoding: the n-gram proposer's numba left the model "
            "%d OpenMP thread(s) of %d; set back to %d",
            now,
            threads,
            torch.get_num_threads(),
        )


def _cpu_ids(spec: str) -> list[int]:
    """CPU ids of GOMP_CPU_AFFINITY ("0 1", "0-3 8") or OMP_PLACES ("{0,1}")."""
    import re

    cpus: list[int] = []
    for a, b in re.findall(r"(\d+)(?:-(\d+))?", spec):
        cpus.extend(range(int(a), int(b or a) + 1))
    return cpus


def _pin_forked_threads() -> None:
    """Pin this worker's OpenMP threads as vLLM's thread binding would have.

    vLLM CPU binds a worker's threads through the environment it starts the process
    with (GOMP_CPU_AFFINITY, or OMP_PLACES and OMP_PROC_BIND, and OMP_NUM_THREADS:
    vllm/utils/ompmultiprocessing.py); the OpenMP runtime reads them when it loads. A
    forked worker (VLLM_X86_ENGINE_FORK) inherits a runtime its parent loaded before
    those variables were set, so nothing is pinned and the model threads drift between
    cores: decode measured 30 % slower (docs/startup.md). Here thread t of the team is
    pinned to the t-th CPU of that list, which is what a spawned worker ends up with."""
    spec = os.environ.get("GOMP_CPU_AFFINITY") or os.environ.get("OMP_PLACES")
    cpus = _cpu_ids(spec or "")
    if not cpus:
        logger.info(
            "vllm-x86: forked worker: vLLM's thread binding gave no CPU list "
            "(GOMP_CPU_AFFINITY, OMP_PLACES); threads left as they are"
        )
        return
    _bind_threads(cpus, "forked worker", "VLLM_X86_ENGINE_FORK=0")


def _bind_threads(cpus: list[int], who: str, instead: str) -> None:
    """Pin OpenMP thread t of the team to cpus[t] with the plugin's kernel, or say why
    not (`instead`: the setting that avoids needing it)."""
    from vllm_x86.runtime.ops import kernels

    if not kernels.available():
        logger.warning(
            "vllm-x86: %s: the plugin's kernels did not load (%s), so its threads cannot "
            "be pinned to CPUs %s and decode will be slower; set %s or run `make install`",
            who,
            kernels.load_error(),
            cpus,
            instead,
        )
        return
    import vllm_x86.runtime._C as C

    got = C.bind_threads(cpus)
    logger.info("vllm-x86: %s: OpenMP threads pinned to CPUs %s", who, got)


def _pin_threads_in_engine(vllm_config, local_rank: int) -> None:
    """A worker inside the engine-core process (VLLM_X86_WORKER_IN_ENGINE, platform.py)
    gets no worker process, so nothing hands it vLLM's thread binding through the
    environment. The CPUs are vLLM's own choice for this rank (its OMPProcessManager,
    from VLLM_CPU_OMP_THREADS_BIND), and the threads are pinned here as for a forked
    worker."""
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    manager = OMPProcessManager(vllm_config)
    if manager.skip_setup or not manager.cpu_lists:
        logger.info("vllm-x86: worker in the engine process: threads left unbound (nobind)")
        return
    cpus = [int(c) for c in manager.cpu_lists[local_rank]]
    _bind_threads(cpus, "worker in the engine process", "VLLM_X86_WORKER_IN_ENGINE=0")


# A compiled model loaded from vLLM's cache needs no full-size warm-up run.
SHORT_WARMUP_TOKENS = 16


def cached_compiled_model(runner, vllm_config) -> bool:
    """True when the short warm-up applies: VLLM_X86_SHORT_WARMUP is on and vLLM will
    load this model's compiled form from its cache (``compiled_model_in_cache``)."""
    return envs.get_bool("VLLM_X86_SHORT_WARMUP") and bool(
        staged.compiled_model_in_cache(runner, vllm_config)
    )


def _short_warm_up(runner) -> None:
    """vLLM's CPU warm-up is its profile run at the engine's maximum batch: a dummy
    forward pass of max_num_batched_tokens tokens and a dummy sampler run
    (cpu_model_runner.warming_up_model). When vLLM compiles, the first call traces
    and compiles with those shapes; when it loads the compiled model from its cache
    there is nothing to compile, and a short run does the same job: the load, the
    first call of every compiled kernel, the sampler. Same settings context as vLLM's.
    (If vLLM recompiles after all, e.g. a changed source file, it compiles from this
    run's shapes: the graph is dynamic in the token count either way.) vLLM's private
    dummy runs: ledger record short_warm_up."""
    from vllm.v1.worker.cpu_model_runner import _set_global_compilation_settings

    n = min(SHORT_WARMUP_TOKENS, runner.max_num_tokens)
    logger.info(
        "vllm-x86: compiled model found in vLLM's cache: warming up with %d tokens "
        "instead of vLLM's %d-token profile run (VLLM_X86_SHORT_WARMUP=0: vLLM's)",
        n,
        runner.max_num_tokens,
    )
    with _set_global_compilation_settings(runner.vllm_config):
        hidden_states, last_hidden_states = runner._dummy_run(n, is_profile=True)
        if runner.is_pooling_model:
            runner._dummy_pooler_run(hidden_states)
        else:
            runner._dummy_sampler_run(last_hidden_states)
    logger.info("Warming up done.")


def _pp_stage_buffers(runner) -> None:
    """A later pipeline stage receives the previous stage's hidden states into a
    buffer, ``runner.intermediate_tensors``, that only vLLM's dummy run allocates. vLLM
    CPU runs it in its warm-up, which it skips in eager mode (``warming_up_model``
    returns at once for CompilationMode.NONE; with an explicit KV-cache size
    ``_should_warm_up_model`` is False as well), so an eager ``--pipeline-parallel-size
    2`` fails at the first request in the second stage ("assert
    self.intermediate_tensors is not None" in sync_and_gather_intermediate_tensors;
    stock vLLM 0.32.0 CPU too, with VLLM_PLUGINS= and VLLM_CPU_OMP_THREADS_BIND=0|1).
    Here a stage after the first whose buffer is missing runs one dummy token of
    vLLM's own dummy run, which allocates it (max_num_tokens rows) as on GPU; the
    dummy run does not communicate between stages. Ledger: pp_stage_buffers."""
    if runner.intermediate_tensors is not None:
        return
    from vllm.distributed.parallel_state import get_pp_group

    if get_pp_group().is_first_rank:
        return
    from vllm.v1.worker.cpu_model_runner import _set_global_compilation_settings

    with _set_global_compilation_settings(runner.vllm_config):
        runner._dummy_run(1, is_profile=True)
    logger.info(
        "vllm-x86: pipeline stage %d: buffers for the previous stage's hidden states "
        "allocated with a one-token dummy run (vLLM CPU's eager start skips it)",
        get_pp_group().rank_in_group,
    )


def communicator_name(group) -> str:
    """Which communicator vLLM's CPU group uses: the shared-memory one
    (``_CPUSHMDistributed``, vLLM's C++ shm_allreduce and friends) or plain
    torch.distributed over gloo (what vLLM falls back to when the ranks do not share a
    shared-memory group name)."""
    comm = getattr(group, "device_communicator", None)
    module = getattr(comm, "dist_module", None)
    if module is None:
        return "none"
    name = type(module).__name__
    if name == "_CPUSHMDistributed":
        return "shared memory (vLLM's _CPUSHMDistributed)"
    return f"torch.distributed ({group.cpu_group.__class__.__name__}, gloo)"


def rank_report(rank: int, parallel_config) -> str:
    """One line per rank: its place, its CPUs and the communicator of each group."""
    from vllm.distributed.parallel_state import get_pp_group, get_tp_group

    tp, pp = get_tp_group(), get_pp_group()
    cpus = sorted(os.sched_getaffinity(0))
    import torch

    parts = [
        f"rank {rank} of {parallel_config.world_size}: tensor-parallel rank "
        f"{tp.rank_in_group} of {tp.world_size}, pipeline stage {pp.rank_in_group} of "
        f"{pp.world_size}, {torch.get_num_threads()} OpenMP thread(s), main thread on CPUs {cpus}"
    ]
    for label, group in (("tensor parallel", tp), ("pipeline parallel", pp)):
        if group.world_size > 1:
            parts.append(f"{label} communicator: {communicator_name(group)}")
    return "; ".join(parts)


def plugin_modules_report(model) -> str:
    """How many of the model's modules (and their quantization methods) are the op
    table's or the plugin's quantization classes (its module path is vllm_x86's, or the
    op table named it X86...)."""
    counts: dict[str, int] = {}
    for m in model.modules():
        for cls in (type(m), type(getattr(m, "quant_method", None))):
            if cls.__module__.startswith("vllm_x86") or cls.__name__.startswith("X86"):
                counts[cls.__name__] = counts.get(cls.__name__, 0) + 1
    if not counts:
        return "no module runs the plugin's ops (op table off or kernels missing)"
    listed = ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))
    return f"the op table's classes in this rank's model: {listed}"
