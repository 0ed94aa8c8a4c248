"""The plugin's default choices for this machine: thread layout and KV-cache size.

Pure functions of `hardware` and `envs` (no vLLM import), shared by the platform class
(which applies them) and `vllm-x86 doctor` (which shows them).
"""

from __future__ import annotations

import os

from vllm_x86.runtime import envs, hardware
from vllm_x86.runtime.hardware import GiB

# Machines with at most this many cores per NUMA node give the engine loop no core
# of its own (see choose_threads).
SMALL_MACHINE_CORES = 4


def choose_threads(cpu: hardware.CpuInfo | None = None, ranks: int = 1) -> tuple[str | None, str]:
    """The plugin's thread layout: (value for VLLM_CPU_OMP_THREADS_BIND or None, reason).

    `ranks` is the number of model processes on this machine (tensor x pipeline
    parallel); with more than one see _rank_layout.

    None means "keep vLLM's own layout". vLLM CPU runs the model on one OpenMP thread
    per physical core and keeps one core per worker free for the engine loop. On a
    2-core machine that idles half the machine: two threads with the engine loop
    sharing a core decode faster (measured: docs/threads.md, benchmarks/threads.py).
    The same is assumed up to SMALL_MACHINE_CORES cores on one NUMA node. On larger
    machines one reserved core costs little and keeps the busy engine loop off the
    model's threads, so vLLM's layout stays.
    """
    cpu = cpu or hardware.cpu_info()
    wanted = envs.get("VLLM_X86_THREADS").strip().lower()
    if ranks > 1:
        return _rank_layout(cpu, ranks, wanted)
    node = cpu.numa_nodes[0]
    node_cores = [c for c in cpu.core_cpus if c in cpu.cpus_by_node.get(node, [])]
    node_cores = node_cores or cpu.core_cpus or cpu.logical_cpus
    n = _threads_setting(wanted)
    if n is not None:
        chosen = node_cores[: min(n, len(node_cores))]
        return _cpu_list(chosen), (
            f"VLLM_X86_THREADS={n}: {len(chosen)} compute thread(s) on CPUs {_cpu_list(chosen)}"
        )
    if len(cpu.numa_nodes) == 1 and len(node_cores) <= SMALL_MACHINE_CORES:
        return _cpu_list(node_cores), (
            f"{len(node_cores)} core(s): every core runs a model thread and the engine "
            "loop shares a core (faster than reserving one on a small machine)"
        )
    return None, (
        f"{cpu.physical_cores} cores on {len(cpu.numa_nodes)} NUMA node(s): vLLM's "
        "layout (a thread per physical core, one core per worker kept for the engine loop)"
    )


def _threads_setting(wanted: str) -> int | None:
    """VLLM_X86_THREADS as a number of threads, None for 'auto'."""
    if wanted in ("", "auto"):
        return None
    try:
        n = int(wanted)
    except ValueError:
        raise ValueError(
            f"VLLM_X86_THREADS must be 'auto' or a positive number, not {wanted!r}"
        ) from None
    if n < 1:
        raise ValueError("VLLM_X86_THREADS must be at least 1")
    return n


class LayoutError(ValueError):
    """A rank layout this machine cannot run; the message says what would."""


def node_cores(cpu: hardware.CpuInfo) -> dict[int, list[int]]:
    """Each NUMA node's physical cores (one logical CPU each), in node order."""
    out = {}
    for node in cpu.numa_nodes:
        cores = [c for c in cpu.core_cpus if c in cpu.cpus_by_node.get(node, [])]
        if cores:
            out[node] = cores
    if not out:
        out[cpu.numa_nodes[0] if cpu.numa_nodes else 0] = cpu.core_cpus or cpu.logical_cpus
    return out


def rank_cpus(cpu: hardware.CpuInfo, ranks: int) -> list[list[int]]:
    """The physical cores of each of `ranks` model processes on this machine.

    One rank per NUMA node where there are at least as many nodes as ranks (how vLLM
    CPU and SGLang CPU run multi-socket machines: each rank reads its weights from its
    own node's memory). With more ranks than nodes, each node's cores are split evenly
    among the same number of ranks when the ranks divide among the nodes; otherwise the
    cores, in node order, are split evenly (a rank may then span two nodes). Raises
    LayoutError when there are fewer cores than ranks."""
    nodes = node_cores(cpu)
    total = sum(len(c) for c in nodes.values())
    if ranks > total:
        raise LayoutError(
            f"{ranks} ranks need at least {ranks} physical cores, one each; this machine "
            f"lets the server use {total}: use at most {total} ranks "
            "(tensor parallel x pipeline parallel)"
        )
    groups = list(nodes.values())
    if ranks <= len(groups):
        return [list(g) for g in groups[:ranks]]
    if ranks % len(groups) == 0 and all(len(g) >= ranks // len(groups) for g in groups):
        per_node = ranks // len(groups)
        return [part for g in groups for part in _split(g, per_node)]
    return _split([c for g in groups for c in g], ranks)


def _split(cores: list[int], parts: int) -> list[list[int]]:
    size, extra = divmod(len(cores), parts)
    out, start = [], 0
    for i in range(parts):
        n = size + (1 if i < extra else 0)
        out.append(cores[start : start + n])
        start += n
    return out


def _rank_layout(cpu: hardware.CpuInfo, ranks: int, wanted: str) -> tuple[str, str]:
    """choose_threads for several ranks: a "|"-separated list, rank by rank, which is
    what VLLM_CPU_OMP_THREADS_BIND takes for tensor and pipeline parallel. vLLM's own
    "auto" layout needs a NUMA node per rank and keeps a core per rank for the engine
    loop; the plugin's works on any machine with a core per rank. Ranks with more than
    SMALL_MACHINE_CORES cores leave their last core to the engine loop and the
    communicator's threads, as vLLM's layout does; smaller ones use every core."""
    parts = rank_cpus(cpu, ranks)
    limit = _threads_setting(wanted)
    chosen = []
    for part in parts:
        if limit is not None:
            part = part[:limit]
        elif len(part) > SMALL_MACHINE_CORES:
            part = part[:-1]
        chosen.append(part)
    bind = "|".join(_cpu_list(p) for p in chosen)
    nodes = node_cores(cpu)
    where = "one NUMA node each" if ranks <= len(nodes) else f"{len(nodes)} NUMA node(s) shared"
    why = (
        (f"VLLM_X86_THREADS={limit}: " if limit is not None else "")
        + f"{ranks} ranks on {where}: "
        + ", ".join(f"rank {i} on CPUs {_cpu_list(p)}" for i, p in enumerate(chosen))
    )
    return bind, why


# How often an idle OpenMP thread of the model checks for work before it sleeps, where
# every core runs a model thread (omp_env). libgomp's own default is 300,000.
SHARED_LAYOUT_SPINCOUNT = 10000


def omp_env(
    cpu: hardware.CpuInfo | None = None, environ: dict[str, str] | None = None
) -> tuple[dict[str, str], str | None]:
    """OpenMP settings for the processes that run the model: (variables to set, why these
    or why none).

    They must be in a process's environment before torch loads libgomp (it reads them
    once), so `vllm-x86 serve`, the daemon and the platform (for the processes vLLM
    spawns) put them there; see docs/threads.md.

    With the plugin's layout for small machines every core runs a model thread, and
    between parallel regions, also after a decode step ends, libgomp's idle threads
    spin up to 300,000 times before they sleep: meanwhile the engine loop and the API
    server, which must run before the next step starts, wait for a core. Spinning
    10,000 times covers the gaps inside a step and frees the cores soon after it.
    Nothing is set when you set GOMP_SPINCOUNT or OMP_WAIT_POLICY, or choose the thread
    layout yourself (VLLM_CPU_OMP_THREADS_BIND, VLLM_CPU_NUM_OF_RESERVED_CPU), or when
    vLLM's layout keeps a core free for the engine loop.
    """
    env = os.environ if environ is None else environ
    if any(env.get(k) for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")):
        return {}, "your GOMP_SPINCOUNT / OMP_WAIT_POLICY"
    if any(env.get(k) for k in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU")):
        return {}, "libgomp's defaults: you chose the thread layout"
    cpu = cpu or hardware.cpu_info()
    bind, _ = choose_threads(cpu)
    if bind is None or len(hardware._parse_list(bind)) < len(cpu.core_cpus or cpu.logical_cpus):
        return {}, "libgomp's defaults: a core is left to the engine loop"
    return {"GOMP_SPINCOUNT": str(SHARED_LAYOUT_SPINCOUNT)}, (
        f"every core runs a model thread: idle OpenMP threads spin {SHARED_LAYOUT_SPINCOUNT} "
        "times, not libgomp's 300,000, before they sleep, so the engine loop gets a core "
        "between steps"
    )


# Set (to what was set, e.g. "GOMP_SPINCOUNT=10000") by apply_omp_env, so that the
# platform can say in the server's log that the plugin chose it.
OMP_CHOSEN_ENV = "VLLM_X86_OMP_CHOSEN"


def apply_omp_env(environ=None, cpu: hardware.CpuInfo | None = None) -> dict[str, str]:
    """Put omp_env's settings into `environ` (os.environ by default) with a note of
    what was set in OMP_CHOSEN_ENV; the settings set (empty when none apply)."""
    env = os.environ if environ is None else environ
    chosen, _ = omp_env(cpu, environ=env)
    if chosen:
        env.update(chosen)
        env[OMP_CHOSEN_ENV] = " ".join(f"{k}={v}" for k, v in chosen.items())
    return chosen


def apply_layer_name_env(environ=None) -> bool:
    """VLLM_X86_CPP_WRAPPER=1: vLLM's attention ops take their layer as a plain string
    (VLLM_USE_LAYERNAME=0), which Inductor's C++ wrapper can pass; vLLM reads it when
    it is imported, so the plugin's own entry points put it into the environment of the
    server they start (platform._apply_cpp_wrapper checks it). True if the server will
    have it."""
    env = os.environ if environ is None else environ
    if env.get("VLLM_X86_CPP_WRAPPER", "0").strip().lower() not in ("1", "true", "yes", "on"):
        return False
    env.setdefault("VLLM_USE_LAYERNAME", "0")
    return env["VLLM_USE_LAYERNAME"] == "0"


def _cpu_list(cpus: list[int]) -> str:
    if not cpus:
        return ""
    parts, start, prev = [], cpus[0], cpus[0]
    for c in cpus[1:] + [None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
        if c is not None:
            start = prev = c
    return ",".join(parts)


# KV cache for this many full-length sequences, when the model's shape is known.
KV_FULL_SEQUENCES = 4
_BLOCK = 64 << 20


def choose_kv_cache_bytes(
    mem: hardware.MemoryInfo | None = None,
    bytes_per_token: int | None = None,
    max_model_len: int | None = None,
    ranks: int = 1,
) -> tuple[int, str]:
    """KV-cache size of one model process when the user gave none.

    Enough for KV_FULL_SEQUENCES sequences of the model's full context when its shape
    is known, at least 1 GiB, at most a quarter of the memory available now (and
    never so much that less than 2 GiB stay free). vLLM CPU touches the whole KV
    cache at start (about 1.7 s per GiB on the development VM), so a cache far
    larger than the model can use only slows the start.

    `ranks` is the number of model processes (tensor / pipeline parallel ranks) that
    plan with `mem`: vLLM's kv_cache_memory_bytes is per rank, so the quarter, the
    2 GiB left free and the 1 GiB floor are shared among them (each rank holds only its
    layers' and KV heads' part of a token, so the ranks together hold as many tokens as
    one rank would); `bytes_per_token` is
    then one rank's (its layers, its KV heads). parallel_plan.rank_kv_cache_bytes
    says which ranks share which memory.
    """
    ranks = max(1, ranks)
    wanted = envs.get("VLLM_X86_KV_CACHE_GIB").strip().lower()
    mem = mem or hardware.memory_info()
    if wanted not in ("", "auto"):
        try:
            gib = float(wanted)
        except ValueError:
            raise ValueError(
                f"VLLM_X86_KV_CACHE_GIB must be 'auto' or a number of GiB, not {wanted!r}"
            ) from None
        if gib <= 0:
            raise ValueError("VLLM_X86_KV_CACHE_GIB must be positive")
        return int(gib * GiB), f"VLLM_X86_KV_CACHE_GIB={wanted}"
    cap = min(mem.available // 4, 32 * GiB) // ranks
    most = max(mem.available - 2 * GiB, GiB // 2) // ranks
    floor = min(1 * GiB // ranks, most)
    if bytes_per_token and max_model_len:
        need = bytes_per_token * max_model_len * KV_FULL_SEQUENCES
        size = max(min(need, cap), floor)
        why = (
            f"{KV_FULL_SEQUENCES} sequences of {max_model_len} tokens need "
            f"{need / GiB:.2f} GiB; at least 1 GiB, at most a quarter of the "
            f"{mem.available / GiB:.1f} GiB available ({mem.source})"
            + (f", both shared by {ranks} ranks" if ranks > 1 else "")
        )
    else:
        size = max(cap, floor)
        why = (
            f"a quarter of the {mem.available / GiB:.1f} GiB available "
            f"({mem.source}), at least 1 GiB"
            + (f", both shared by {ranks} ranks" if ranks > 1 else "")
        )
    size = min(size, most)
    size = -(-size // _BLOCK) * _BLOCK  # whole 64 MiB blocks
    return size, why


def kv_bytes_per_token_from_hf_config(cfg: dict) -> int | None:
    """The same estimate from a config.json (for doctor, which does not load vLLM)."""
    try:
        text = cfg.get("text_config", cfg)
        layers = int(text["num_hidden_layers"])
        heads = int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
        dtype = str(text.get("dtype") or text.get("torch_dtype") or "bfloat16")
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    itemsize = 4 if "32" in dtype else 2
    return 2 * layers * kv_heads * head * itemsize
