"""X86Platform: vLLM's CPU platform with defaults chosen for the machine it runs on.

It stays a CPU platform for vLLM (``_enum`` is ``PlatformEnum.CPU``): vLLM has many
``current_platform.is_cpu()`` branches (CPU attention, OpenMP thread binding, the CPU
worker and model runner) and the plugin wants all of them. CustomOps therefore
dispatch to ``forward_cpu``; the plugin's op overrides (``ops/registry.py``) implement
``forward_cpu``.

What the plugin changes, each logged once at INFO with its reason, and each skipped
when the user set the corresponding vLLM setting:

* thread layout: on small machines all cores run model threads (stock vLLM keeps one
  core per worker for the engine loop, which idles half of a 2-core machine);
* KV-cache size: an explicit size that fits this machine's real memory, instead of a
  fraction of a NUMA node's memory (which fails at start on VMs that report a small
  node);
* the worker class: ``X86Worker`` plans memory with ``hardware.memory_info()``;
* MLA attention in float32: vLLM's own reference backend ``CPU_MLA`` where vLLM would
  pick ``AMX_MLA``, whose kernels take bf16 only (``mla_attention_backend``).
"""

from __future__ import annotations

import gc
import os

from vllm.platforms.cpu import CpuPlatform

from vllm_x86.runtime import defaults, envs, hardware
from vllm_x86.runtime.defaults import choose_kv_cache_bytes, choose_threads
from vllm_x86.runtime.hardware import GiB
from vllm_x86.runtime.log import get_logger

logger = get_logger("platform")

STOCK_WORKER = "vllm.v1.worker.cpu_worker.CPUWorker"
X86_WORKER = "vllm_x86.runtime.worker.X86Worker"
# vLLM's CacheConfig default; another value means the user asked for a fraction.
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.92

# Which defaults this process tree's first process chose, so that the engine and
# worker processes (which inherit the environment and the config) neither choose
# again nor report the plugin's own choice as a user setting.
CHOSEN_ENV = "VLLM_X86_CHOSEN"
KV_CHOSEN_ENV = "VLLM_X86_KV_BYTES_CHOSEN"

_logged: set[str] = set()


def _mark_chosen(what: str) -> None:
    items = [x for x in os.environ.get(CHOSEN_ENV, "").split(",") if x]
    if what not in items:
        os.environ[CHOSEN_ENV] = ",".join(items + [what])


def _info_once(key: str, msg: str, *args) -> None:
    if key not in _logged:
        _logged.add(key)
        logger.info(msg, *args)


def _warn_once(key: str, msg: str, *args) -> None:
    if key not in _logged:
        _logged.add(key)
        logger.warning(msg, *args)


def _local_ranks(vllm_config) -> int:
    """Model processes on this machine: tensor x pipeline parallel ranks, times the
    data-parallel engines started here (vLLM takes their thread lists in that order)."""
    if vllm_config is None:
        return 1
    parallel = vllm_config.parallel_config
    dp_local = getattr(parallel, "data_parallel_size_local", 1) or 1
    return max(1, parallel.local_world_size) * max(1, dp_local)


def _user_set(name: str) -> bool:
    return os.environ.get(name, "") != ""


def _kv_bytes_per_token(vllm_config) -> tuple[int | None, int | None]:
    """KV bytes one token takes in this model (all layers, K and V), and the model's
    context length; (None, None) when the config does not say (no model, or a shape
    vLLM cannot describe this way), and the plugin falls back to a share of memory."""
    model = vllm_config.model_config
    if model is None:
        return None, None
    try:
        import torch

        parallel = vllm_config.parallel_config
        layers = model.get_num_layers(parallel)
        kv_heads = model.get_num_kv_heads(parallel)
        head = model.get_head_size()
        cache_dtype = vllm_config.cache_config.cache_dtype
        if cache_dtype in (None, "auto"):
            itemsize = torch.empty((), dtype=model.dtype).element_size()
        else:
            itemsize = 1 if "fp8" in str(cache_dtype) else 2
        per_token = 2 * layers * kv_heads * head * itemsize
    except Exception as e:  # the shape is only a sizing hint
        logger.debug("vllm-x86: no KV size per token for this model: %s", e)
        return None, None
    return per_token, model.max_model_len


def mla_attention_backend(vllm_config) -> str | None:
    """The MLA attention backend the plugin picks for this config, or None to leave
    vLLM's choice alone.

    vLLM CPU picks ``AMX_MLA`` for every MLA model on an AMX machine
    (``CpuPlatform.get_attn_backend_cls``, vllm/platforms/cpu.py), whatever the dtype,
    although ``AMXMLABackend.supported_dtypes`` is bf16 only
    (v1/attention/backends/mla/amx_mla.py): in float32 its weight packing
    (``_C.convert_weight_packed``) stops the model at load with "expect weight to be
    bfloat16, float16, int8". vLLM's reference MLA backend ``CPU_MLA``
    (v1/attention/backends/mla/cpu_mla.py: SDPA prefill, ``mla_decode_kvcache_cpu``
    decode) runs float32, so float32 MLA models get it; vLLM's platform then sets its
    block size (16) and turns chunked prefill and prefix caching off, as it does for
    CPU_MLA on any machine. Other dtypes, a backend the user chose, sparse MLA and
    DeepSeek-V4 (their own backends) keep vLLM's choice."""
    import torch

    model = vllm_config.model_config
    if model is None or not getattr(model, "use_mla", False) or model.dtype != torch.float32:
        return None
    hf = model.hf_config
    if getattr(hf, "model_type", None) == "deepseek_v4" or hasattr(hf, "index_topk"):
        return None  # DeepSeek-V4 and sparse MLA (indexer): backends of their own
    if vllm_config.attention_config.backend is not None:
        return None  # the user's choice
    if not torch.cpu._is_amx_tile_supported():
        return None  # vLLM picks CPU_MLA itself
    return "CPU_MLA"


class X86Platform(CpuPlatform):
    """vLLM's CPU platform plus the plugin's defaults; see the module docstring."""

    # Read by the op table (ops/registry.py), which must not import this module: the
    # platform installs the table, not the other way round.
    is_vllm_x86 = True

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "cpu"

    _triton_overrides_registered = False

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        """vLLM CPU's C++ stand-ins for its Triton kernels, registered once per process
        *tree*. vLLM's registration rebinds every module attribute that holds one of
        those kernels, in one scan over every attribute of every module in sys.modules:
        0.3-0.45 s in a worker forked from the standby daemon, which has imported much.
        The daemon registers them before it forks (tools/daemon/server.py), and the
        processes it forks inherit the rebound modules, so they skip the scan (ledger:
        triton_kernel_overrides_once). A spawned process starts with the flag unset
        and registers as vLLM does.

        The slot mapping's stand-in is the plugin's (ops/slot_mapping.py: the same
        slots without an OpenMP region), in the same registration call;
        VLLM_X86_SLOT_MAPPING=0 keeps vLLM CPU's (ledger: slot_mapping_without_openmp)."""
        if cls._triton_overrides_registered:
            return
        if envs.get_bool("VLLM_X86_SLOT_MAPPING"):
            from vllm_x86.runtime.ops import slot_mapping

            with slot_mapping.in_vllm_registration():
                super().register_triton_kernel_overrides()
        else:
            super().register_triton_kernel_overrides()
        X86Platform._triton_overrides_registered = True

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return hardware.memory_info().total

    @classmethod
    def get_current_memory_usage(cls, device=None) -> float:
        mem = hardware.memory_info()
        return float(mem.total - mem.available)

    @classmethod
    def pre_register_and_update(cls, parser=None) -> None:
        # before vLLM parses --quantization: x86_int8 and x86_int4 must be known
        from vllm_x86.runtime import quant

        quant.register()

    @classmethod
    def import_ir_kernels(cls) -> None:
        super().import_ir_kernels()
        from vllm_x86.runtime.ops import registry

        registry.ir_providers()  # registers the plugin's `x86` IR implementations

    @classmethod
    def get_default_ir_op_priority(cls, vllm_config):
        """The plugin's IR kernels first in eager mode. With Inductor compiling the
        model, vLLM's native implementations stay first: Inductor fuses them with their
        neighbours, which an opaque kernel would prevent; with VLLM_X86_FP32_RESIDUAL
        fused_add_rms_norm's float32-residual version is PyTorch code for the same reason
        (registry.ir_providers)."""
        from vllm.config import CompilationMode
        from vllm.config.kernel import IrOpPriorityConfig

        from vllm_x86.runtime.ops import registry

        cc = vllm_config.compilation_config
        inductor = cc.mode not in (None, CompilationMode.NONE) and cc.backend == "inductor"
        # compiled: native, except a float32 residual stream (VLLM_X86_FP32_RESIDUAL)
        # in PyTorch, which Inductor fuses all the same (ops/layernorm.py)
        prio = registry.ir_providers(vllm_config, inductor)
        return IrOpPriorityConfig.with_default(["native"], **prio)

    @classmethod
    def validate_environ(cls, hard_fail: bool) -> None:
        # The plugin's own VLLM_X86_* settings are not vLLM's; hide them from the check
        # (ledger: validate_environ_hides_plugin_settings).
        hidden = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("VLLM_X86_")}
        try:
            super().validate_environ(hard_fail)
        finally:
            os.environ.update(hidden)

    @classmethod
    def _apply_async_scheduling(cls, vllm_config, decided) -> None:
        """VLLM_X86_ASYNC_SCHEDULING=1 keeps vLLM's asynchronous scheduling where vLLM
        had chosen it; vLLM CPU always runs synchronous steps."""
        if not envs.get_bool("VLLM_X86_ASYNC_SCHEDULING"):
            return
        if decided:
            vllm_config.scheduler_config.async_scheduling = True
            _info_once(
                "async", "vllm-x86: asynchronous scheduling on (VLLM_X86_ASYNC_SCHEDULING=1)"
            )
        else:
            _info_once(
                "async",
                "vllm-x86: VLLM_X86_ASYNC_SCHEDULING=1, but vLLM did not choose asynchronous "
                "scheduling for this configuration (pooling model, speculative decoding or "
                "--no-async-scheduling): steps stay synchronous",
            )

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        if "active" not in os.environ.get(CHOSEN_ENV, "").split(","):
            from vllm_x86._version import __version__

            _mark_chosen("active")
            _info_once(
                "active",
                "vllm-x86 %s: platform plugin active on %s (set VLLM_X86_DISABLE=1 for "
                "stock vLLM CPU)",
                __version__,
                hardware.plugin_supported()[1],
            )
        cls._apply_omp_env()  # before the layout sets VLLM_CPU_OMP_THREADS_BIND itself
        cls._check_layout(vllm_config)  # a layout that cannot run: refused before any start
        cls._apply_thread_layout(vllm_config)
        cls._apply_kv_cache_size(vllm_config)
        cls._apply_mla_backend(vllm_config)
        # what vLLM decided before vLLM CPU switches it off
        async_sched = vllm_config.scheduler_config.async_scheduling
        backend = vllm_config.parallel_config.distributed_executor_backend
        super().check_and_update_config(vllm_config)  # sets vLLM CPU's "spawn"
        cls._apply_async_scheduling(vllm_config, async_sched)
        cls._warn_without_compiler(vllm_config)
        cls._apply_cpp_wrapper(vllm_config)
        cls._apply_engine_start()
        cls._apply_worker_in_engine(vllm_config, backend)
        from vllm_x86.runtime.startup import compile_cache

        compile_cache.apply(vllm_config)
        parallel = vllm_config.parallel_config
        if parallel.worker_cls == STOCK_WORKER:
            parallel.worker_cls = X86_WORKER
        # The op table is installed in every process that builds a model; the general
        # plugin hook does it there. Importing it here also covers in-process engines.
        from vllm_x86.runtime.ops import registry

        registry.register_all()

    @classmethod
    def _check_layout(cls, vllm_config) -> None:
        """Tensor / pipeline parallel layouts that cannot run (heads or layers that do
        not divide, more ranks than cores, weights over the memory) raise LayoutError, a
        ValueError with the sentence of parallel_plan, before any worker starts. vLLM
        checks the attention heads against TP itself, earlier (VllmConfig.__post_init__),
        so that one case still shows vLLM's message here; `vllm-x86 serve` refuses it
        with the plugin's before vLLM starts. Checked once per layout, in the first
        process: its children, which inherit the mark, would count the memory their
        siblings already took as missing."""
        model = vllm_config.model_config
        if model is None:
            return
        parallel = vllm_config.parallel_config
        tp, pp = parallel.tensor_parallel_size, parallel.pipeline_parallel_size
        mark = f"layout-{tp}x{pp}"
        if mark in os.environ.get(CHOSEN_ENV, "").split(","):
            return
        from vllm_x86.runtime import parallel_plan

        cache = vllm_config.cache_config
        kv = cache.kv_cache_memory_bytes
        if _user_set("VLLM_CPU_KVCACHE_SPACE"):
            kv = int(float(os.environ["VLLM_CPU_KVCACHE_SPACE"]) * GiB)
        elif kv is None and (
            abs(cache.gpu_memory_utilization - VLLM_DEFAULT_GPU_MEMORY_UTILIZATION) > 1e-9
        ):
            kv = 0  # a fraction of memory, sized by the worker: weights checked alone
        try:
            path = model.model if os.path.isdir(model.model) else None
            facts = parallel_plan.model_facts(
                path,
                cfg=model.hf_config.to_dict(),
                name=str(model.served_model_name or model.model).rstrip("/").split("/")[-1],
                dtype=str(model.dtype),
                quantization=model.quantization,
                kv_cache_dtype=str(cache.cache_dtype),
            )
        except Exception as e:  # an unusual config: no plan, vLLM's own checks remain
            (logger.info if tp * pp > 1 else logger.debug)(
                "vllm-x86: no plan per rank for this model (%s); vLLM's own checks apply", e
            )
            _mark_chosen(mark)
            return
        auto_len = getattr(model, "original_max_model_len", None) == -1  # vLLM fits it
        plan = parallel_plan.refuse(
            facts,
            tp,
            pp,
            max_model_len=-1 if auto_len else model.max_model_len,
            kv_cache_bytes=kv,
            local=_local_ranks(vllm_config) == tp * pp,
        )  # a LayoutError leaves no mark: the same layout is refused again
        _mark_chosen(mark)
        if plan is not None and tp * pp > 1:
            _info_once("layout", "vllm-x86: the plan per rank\n%s", plan.render())

    @classmethod
    def _warn_without_compiler(cls, vllm_config) -> None:
        """Compiled mode with Inductor on a machine without a C++ compiler fails at the
        first request (Inductor compiles C++ while serving). `vllm-x86 serve` chooses
        eager mode itself there (tools/cli/common.py); vLLM's own entry points get this
        warning before they start."""
        from vllm.config import CompilationMode

        cc = vllm_config.compilation_config
        if cc.mode == CompilationMode.NONE or cc.backend != "inductor":
            return
        if hardware.cxx_compiler() is None:
            logger.warning(
                "vllm-x86: no C++ compiler found ($CXX, g++, c++ or clang++ on PATH): "
                "vLLM's compiled mode will fail at the first request; use --enforce-eager "
                "(or `vllm-x86 serve`, which does) or install g++"
            )

    @classmethod
    def _apply_cpp_wrapper(cls, vllm_config) -> None:
        """VLLM_X86_CPP_WRAPPER=1: Inductor's C++ wrapper for the compiled model
        (docs/overhead.md). Inductor's C++ wrapper cannot pass vLLM's LayerName objects
        (a Python object per attention layer, the custom ops' layer argument) to the
        attention ops; with VLLM_USE_LAYERNAME=0 vLLM registers those ops with a plain
        string, which it can. That choice is made when vLLM is imported, so here it can
        only be checked."""
        from vllm.config import CompilationMode

        if not envs.get_bool("VLLM_X86_CPP_WRAPPER"):
            return
        cc = vllm_config.compilation_config
        if cc.mode in (None, CompilationMode.NONE) or cc.backend != "inductor":
            return
        from vllm.utils import torch_utils

        if getattr(torch_utils, "LayerNameType", str) is not str:  # LayerName objects
            _warn_once(
                "cpp_wrapper",
                "vllm-x86: VLLM_X86_CPP_WRAPPER=1, but vLLM was imported with "
                "VLLM_USE_LAYERNAME on, whose layer objects Inductor's C++ wrapper cannot "
                "pass: compiling with the Python wrapper. Set VLLM_USE_LAYERNAME=0 in the "
                "environment before vLLM starts (`vllm-x86 serve` does)",
            )
            return
        cc.inductor_compile_config["cpp_wrapper"] = True
        _info_once(
            "cpp_wrapper",
            "vllm-x86: compiled model with Inductor's C++ wrapper (VLLM_X86_CPP_WRAPPER=1)",
        )

    @classmethod
    def _apply_mla_backend(cls, vllm_config) -> None:
        backend = mla_attention_backend(vllm_config)
        if backend is None:
            return
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        vllm_config.attention_config.backend = AttentionBackendEnum[backend]
        _info_once(
            "mla_backend",
            "vllm-x86: MLA attention in float32 runs vLLM's %s backend (vLLM's AMX_MLA "
            "kernels take bf16 only; %s keeps chunked prefill and prefix caching off)",
            backend,
            backend,
        )

    @classmethod
    def _apply_engine_start(cls) -> None:
        """How vLLM starts its engine-core and worker processes. vLLM CPU always spawns
        them: each is a fresh interpreter that imports torch and vLLM again (about 5 s
        each on a development machine). Forked, they inherit this process's imports
        instead (docs/startup.md: the cold start halves). A fork is only safe while the
        parent has never run an OpenMP parallel region (the child would deadlock), which
        the plugin can vouch for only in its own server: `vllm-x86 serve` and the standby
        daemon, which set VLLM_X86_SERVE_DEFAULTS=1, where no user code runs before the
        engine starts.
        The LLM class and other entry points keep vLLM's spawn. (vLLM CPU sets spawn
        whatever VLLM_WORKER_MULTIPROC_METHOD says, and vLLM's server sets it when unset,
        so the plugin's own setting, VLLM_X86_ENGINE_FORK, is the one that decides.)

        With fork, the server also freezes its garbage collector's heap (gc.freeze(),
        as the standby daemon does after its imports): the forked processes inherit
        the objects of every import, and each full collection there (vLLM's model
        loader runs two) would walk all of them again, about 0.4 s each on the
        development VM; frozen, a collection walks only what was made since.

        Setting fork after vLLM CPU set spawn is a ledger record
        (engine_processes_forked)."""
        chosen = os.environ.get(CHOSEN_ENV, "").split(",")
        if "fork" in chosen:  # chosen by the process that started this one
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
            return
        if "spawn" in chosen or not envs.serve_defaults():
            return
        if not envs.get_bool("VLLM_X86_ENGINE_FORK"):
            _mark_chosen("spawn")
            _info_once(
                "engine_start",
                "vllm-x86: engine processes start by spawn (VLLM_X86_ENGINE_FORK=0)",
            )
            return
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
        _mark_chosen("fork")
        gc.freeze()
        _info_once(
            "engine_start",
            "vllm-x86: engine-core and worker processes start by fork, inheriting this "
            "process's imports (VLLM_X86_ENGINE_FORK=0: vLLM CPU's spawn)",
        )

    @classmethod
    def _apply_worker_in_engine(cls, vllm_config, backend_before) -> None:
        """One worker runs inside the engine-core process (vLLM's UniProcExecutor)
        instead of a process of its own (VLLM_X86_WORKER_IN_ENGINE).

        vLLM CPU always starts its worker as a separate process ("mp"), because it binds
        the worker's OpenMP threads through the environment that process starts with.
        With one worker that costs a third process beside the API server and the engine
        core: a shared-memory hand-off each way per step, a polling loop, and one more
        copy of torch and vLLM in memory. Where the plugin starts the engine itself
        (`vllm-x86 serve` and its daemon: VLLM_X86_SERVE_DEFAULTS=1) the engine-core
        process is forked from a server that has run no OpenMP region, and the plugin
        pins the worker's threads itself (worker.py, _pin_forked_threads), so the worker
        can live in the engine core. Only when vLLM chose "uni" for one worker and vLLM
        CPU replaced it: an explicit --distributed-executor-backend, several ranks, or
        data parallel keep vLLM's choice (ledger: worker_in_engine_process)."""
        parallel = vllm_config.parallel_config
        mode = envs.get("VLLM_X86_WORKER_IN_ENGINE").strip().lower()
        if mode in ("0", "false", "no", "off"):
            return
        if mode == "auto" and not envs.serve_defaults():
            return
        if os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") != "fork" and mode == "auto":
            return  # a spawned engine core gets no thread pinning from the plugin
        if parallel.world_size_across_dp > 1:
            _info_once(
                "worker_in_engine",
                "vllm-x86: %d ranks (tensor x pipeline x data parallel): each keeps its own "
                "worker process, as in vLLM (the worker in the engine process is for one "
                "worker)",
                parallel.world_size_across_dp,
            )
            return
        if (
            backend_before != "uni"
            or parallel.distributed_executor_backend != "mp"
            or os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "1"
        ):
            return
        parallel.distributed_executor_backend = "uni"
        _info_once(
            "worker_in_engine",
            "vllm-x86: the worker runs inside the engine-core process (one process fewer "
            "per step and in memory; VLLM_X86_WORKER_IN_ENGINE=0: vLLM CPU's worker process)",
        )

    @classmethod
    def _apply_thread_layout(cls, vllm_config=None) -> None:
        chosen_here = os.environ.get(CHOSEN_ENV, "")
        bind_now = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "")
        plugin_chose = "threads" in chosen_here.split(",")
        if plugin_chose and (
            vllm_config is None
            or not bind_now
            or bind_now.count("|") + 1 == _local_ranks(vllm_config)
        ):
            # chosen (and logged) by the process that started this one; a second engine
            # of this process with another rank count (LLM(tp=1), then LLM(tp=2)) chooses
            # again
            return
        if not plugin_chose and (
            _user_set("VLLM_CPU_OMP_THREADS_BIND") or _user_set("VLLM_CPU_NUM_OF_RESERVED_CPU")
        ):
            _info_once(
                "threads",
                "vllm-x86: thread layout from your settings "
                "(VLLM_CPU_OMP_THREADS_BIND=%r, VLLM_CPU_NUM_OF_RESERVED_CPU=%r)",
                os.environ.get("VLLM_CPU_OMP_THREADS_BIND", ""),
                os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", ""),
            )
            return
        bind, reason = choose_threads(ranks=_local_ranks(vllm_config))
        _mark_chosen("threads")
        if bind is not None:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind
            _info_once("threads", "vllm-x86: compute threads on CPUs %s: %s", bind, reason)
        else:
            _info_once("threads", "vllm-x86: thread layout: %s", reason)

    @classmethod
    def _apply_omp_env(cls) -> None:
        """OpenMP settings for the model's processes (defaults.omp_env). `vllm-x86
        serve` and the daemon set them before torch loads; here they reach the processes
        vLLM spawns from this one (vLLM's own server, the LLM class)."""
        if "omp" in os.environ.get(CHOSEN_ENV, "").split(","):
            return  # chosen (and logged) by the process that started this one
        _mark_chosen("omp")
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
            return  # the model runs in this process, whose libgomp has read its settings
        defaults.apply_omp_env()
        chosen = os.environ.get(defaults.OMP_CHOSEN_ENV)
        if chosen:
            _info_once(
                "omp",
                "vllm-x86: %s for the model's OpenMP threads: every core runs one, so "
                "idle ones sleep sooner than libgomp's default and leave the engine loop a "
                "core between steps (set GOMP_SPINCOUNT or OMP_WAIT_POLICY to choose)",
                chosen,
            )

    @classmethod
    def _apply_kv_cache_size(cls, vllm_config) -> None:
        cache = vllm_config.cache_config
        if cache.kv_cache_memory_bytes is not None and str(
            cache.kv_cache_memory_bytes
        ) == os.environ.get(KV_CHOSEN_ENV):
            return  # the plugin's own choice, made (and logged) by the parent process
        if _user_set("VLLM_CPU_KVCACHE_SPACE"):
            _info_once(
                "kv",
                "vllm-x86: KV cache from VLLM_CPU_KVCACHE_SPACE=%s GiB",
                os.environ["VLLM_CPU_KVCACHE_SPACE"],
            )
            return
        if cache.kv_cache_memory_bytes is not None:
            _info_once(
                "kv",
                "vllm-x86: KV cache from --kv-cache-memory-bytes (%.2f GiB)",
                cache.kv_cache_memory_bytes / GiB,
            )
            return
        if abs(cache.gpu_memory_utilization - VLLM_DEFAULT_GPU_MEMORY_UTILIZATION) > 1e-9:
            _info_once(
                "kv",
                "vllm-x86: KV cache from --gpu-memory-utilization=%s (a fraction of "
                "this machine's memory, %s)",
                cache.gpu_memory_utilization,
                hardware.memory_info().source,
            )
            return
        per_token, max_len = _kv_bytes_per_token(vllm_config)
        ranks = _local_ranks(vllm_config)
        if ranks > 1:  # kv_cache_memory_bytes is per rank: ranks on one memory share it
            from vllm_x86.runtime.parallel_plan import rank_kv_cache_bytes

            size, reason = rank_kv_cache_bytes(per_token, max_len, ranks)
        else:
            size, reason = choose_kv_cache_bytes(bytes_per_token=per_token, max_model_len=max_len)
        cache.kv_cache_memory_bytes = size
        os.environ[KV_CHOSEN_ENV] = str(size)
        _info_once("kv", "vllm-x86: KV cache %.2f GiB: %s", size / GiB, reason)
