"""Synthetic machines for the tests of the plugin's layout and plan choices."""

from __future__ import annotations

from vllm_x86.runtime import hardware


def cpu(cores: int, nodes: int = 1, smt: int = 1) -> hardware.CpuInfo:
    """`cores` physical cores (with `smt` logical CPUs each), split evenly over `nodes`
    NUMA nodes, numbered as Linux numbers them here (siblings adjacent)."""
    logical = list(range(cores * smt))
    per_node = len(logical) // nodes
    return hardware.CpuInfo(
        arch="x86_64",
        model_name="test",
        flags=frozenset({"avx2", "fma"}),
        logical_cpus=logical,
        physical_cores=cores,
        numa_nodes=list(range(nodes)),
        cpus_by_node={n: logical[n * per_node : (n + 1) * per_node] for n in range(nodes)},
        core_cpus=logical[::smt],
    )
