"""What this machine is: ISA flags, cores, NUMA nodes, memory.

Everything here reads /proc and /sys (Linux), plus one system call (``amx_permitted``),
and nothing else: no torch, no vLLM, so `register()` and `vllm-x86 doctor` can call it
cheaply. Results are cached per process.

This is the one place the plugin asks what the CPU can run: ``usable_isas()`` (the
flags each ISA of the kernels needs, ``ISA_NEEDS``, and for AMX Linux's permission).
ops/kernels.py hands its answer to the C++ library, which probes nothing itself, and
the kernel choice of the quantized layers (ops/registry.py) reads it too.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import re
import shutil
from dataclasses import dataclass, field

GiB = 1 << 30

# cpuinfo flag -> the name users know. Order is the order doctor prints them in.
ISA_FLAGS: dict[str, str] = {
    "avx2": "AVX2",
    "fma": "FMA",
    "avx_vnni": "AVX-VNNI",
    "avx512f": "AVX-512F",
    "avx512bw": "AVX-512BW",
    "avx512vl": "AVX-512VL",
    "avx512_vnni": "AVX512-VNNI",
    "avx512_bf16": "AVX512-BF16",
    "avx512_fp16": "AVX512-FP16",
    "amx_tile": "AMX-TILE",
    "amx_bf16": "AMX-BF16",
    "amx_int8": "AMX-INT8",
    "amx_fp16": "AMX-FP16",
}


@dataclass(frozen=True)
class CpuInfo:
    arch: str
    model_name: str
    flags: frozenset[str]
    logical_cpus: list[int]  # CPUs this process may run on
    physical_cores: int  # distinct (node, core) among them
    numa_nodes: list[int]
    cpus_by_node: dict[int, list[int]] = field(default_factory=dict)
    # the lowest-numbered logical CPU of each physical core (SMT siblings left out)
    core_cpus: list[int] = field(default_factory=list)

    def has(self, flag: str) -> bool:
        return flag in self.flags

    @property
    def isa_level(self) -> str:
        """Best vector ISA for the plugin's kernels: amx > avx512 > avx2 > none
        (usable_isas)."""
        isas = usable_isas(self)
        for level in ("amx", "avx512", "avx2"):
            if level in isas:
                return level
        return "none"


# The ISAs of the plugin's kernels, each with the CPU flags (/proc/cpuinfo's names) its
# code is compiled for (the `#pragma GCC target` of its csrc file; Linux drops these
# flags when it runs with the extended register state off).
_AVX2 = ("avx2", "fma", "f16c")
_AVX512 = (*_AVX2, "avx512f", "avx512bw", "avx512vl", "avx512dq")
ISA_NEEDS: dict[str, tuple[str, ...]] = {
    # the builds of the elementwise kernels (csrc/isa_*.cpp; VLLM_X86_ISA picks one)
    "avx2": _AVX2,
    "avx512": _AVX512,
    "avx512_bf16": (*_AVX512, "avx512_bf16"),
    # the INT8/INT4 GEMMs: csrc/vnni_gemm.cpp, and csrc/amx_gemm.cpp, which also needs
    # Linux's permission to use the tile registers (amx_permitted)
    "avx512_vnni": (*_AVX512, "avx512_vnni"),
    "amx": (*_AVX512, "amx_tile", "amx_int8"),
}
KERNEL_ISAS = ("avx2", "avx512", "avx512_bf16")  # elementwise kernels, lowest first
QUANT_ISAS = ("avx512_vnni", "amx")  # INT8/INT4 GEMMs, lowest first

_ARCH_PRCTL = 158  # x86-64 system call number
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


@functools.cache
def amx_permitted() -> bool:
    """Whether Linux lets this process use the AMX tile registers.

    Linux (5.16 and later) hands the tile data state to a process only when asked
    (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)); until then the first AMX
    instruction kills it. The permission is the process's: every thread has it, and a
    forked child inherits it (a new program asks again: the cache is per process). Asking
    is the only way to know, so this asks, here, once: this module is where the plugin
    learns what the CPU can run, before the C++ library (which probes nothing) runs an
    AMX instruction; torch's oneDNN makes the same request for its own AMX kernels."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64", "amd64"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        args = (_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)
        return libc.syscall(*(ctypes.c_long(a) for a in args)) == 0
    except (OSError, AttributeError):  # pragma: no cover - no libc syscall()
        return False


def usable_isas(info: CpuInfo | None = None) -> tuple[str, ...]:
    """The ISAs of ISA_NEEDS this CPU (``info``, this machine's by default) and process
    can run, in ISA_NEEDS' order: the CPU has every flag, and for AMX Linux granted the
    tile state (amx_permitted). The one answer to "can the kernels run X here?"."""
    info = cpu_info() if info is None else info
    out = [isa for isa, flags in ISA_NEEDS.items() if all(info.has(f) for f in flags)]
    if "amx" in out and not amx_permitted():
        out.remove("amx")
    return tuple(out)


def best_isa(family: tuple[str, ...], info: CpuInfo | None = None) -> str | None:
    """The highest ISA of `family` (KERNEL_ISAS or QUANT_ISAS) usable here, or None."""
    isas = usable_isas(info)
    return next((isa for isa in reversed(family) if isa in isas), None)


@dataclass(frozen=True)
class MemoryInfo:
    total: int  # bytes the plugin plans with
    available: int
    source: str  # where the numbers come from, for doctor and logs
    node_total: int | None = None  # what the NUMA node reports, if any
    node_available: int | None = None
    cgroup_limit: int | None = None

    @property
    def node_info_unreliable(self) -> bool:
        return self.source.startswith("system")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _parse_list(s: str) -> list[int]:
    out: list[int] = []
    for part in s.strip().split(","):
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def _meminfo(text: str) -> dict[str, int]:
    """Parse /proc/meminfo or a node meminfo into bytes."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"(?:Node \d+ )?([\w()]+):\s+(\d+)(?: kB)?", line.strip())
        if m:
            out[m.group(1)] = int(m.group(2)) * 1024
    return out


@functools.cache
def cpu_info() -> CpuInfo:
    arch = platform.machine()
    text = _read("/proc/cpuinfo") or ""
    flags: set[str] = set()
    model = "unknown"
    for line in text.splitlines():
        if line.startswith("flags") and not flags:
            flags = set(line.split(":", 1)[1].split())
        elif line.startswith("model name") and model == "unknown":
            model = line.split(":", 1)[1].strip()
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        allowed = list(range(os.cpu_count() or 1))

    nodes: dict[int, list[int]] = {}
    node_root = "/sys/devices/system/node"
    if os.path.isdir(node_root):
        for name in sorted(os.listdir(node_root)):
            if re.fullmatch(r"node\d+", name):
                cpus = _parse_list(_read(f"{node_root}/{name}/cpulist") or "")
                nodes[int(name[4:])] = [c for c in cpus if c in allowed]
    if not nodes:
        nodes = {0: list(allowed)}
    nodes = {n: c for n, c in nodes.items() if c} or {0: list(allowed)}

    cores: dict[tuple[int, str], int] = {}
    for cpu in allowed:
        topo = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        core_id = (_read(f"{topo}/core_id") or str(cpu)).strip()
        pkg = (_read(f"{topo}/physical_package_id") or "0").strip()
        key = (int(pkg) if pkg.lstrip("-").isdigit() else 0, core_id)
        cores.setdefault(key, cpu)
    return CpuInfo(
        arch=arch,
        model_name=model,
        flags=frozenset(flags),
        logical_cpus=allowed,
        physical_cores=max(1, len(cores)),
        numa_nodes=sorted(nodes),
        cpus_by_node=nodes,
        core_cpus=sorted(cores.values()),
    )


def _cgroup_limit() -> int | None:
    v2 = _read("/sys/fs/cgroup/memory.max")
    if v2 is not None:
        v2 = v2.strip()
        return None if v2 == "max" else int(v2)
    v1 = _read("/sys/fs/cgroup/memory/memory.limit_in_bytes")
    if v1 is not None and int(v1.strip()) < (1 << 62):
        return int(v1.strip())
    return None


def memory_info(node: int | None = None) -> MemoryInfo:
    """Memory the plugin plans with (not cached: availability changes).

    vLLM CPU budgets memory per NUMA node from /sys/devices/system/node/nodeN/meminfo.
    Some VMs report a node far smaller than the machine (here: a 5-9 GB node 0 on a
    24 GB, single-node VM, with numbers that move as memory is hot-plugged). When the
    machine has a single node, or the nodes together report much less than the
    machine, the node numbers are not a budget, and the system-wide numbers are used.
    """
    system = _meminfo(_read("/proc/meminfo") or "")
    sys_total = system.get("MemTotal", 0)
    sys_avail = system.get("MemAvailable", system.get("MemFree", 0))
    cg = _cgroup_limit()

    node_ids = cpu_info().numa_nodes
    node = node_ids[0] if node is None else node
    node_mem = _meminfo(_read(f"/sys/devices/system/node/node{node}/meminfo") or "")
    node_total = node_mem.get("MemTotal")
    node_avail = None
    if node_total is not None:
        node_avail = (
            node_mem.get("MemFree", 0)
            + node_mem.get("Active(file)", 0)
            + node_mem.get("Inactive(file)", 0)
            + node_mem.get("SReclaimable", 0)
        )
    nodes_sum = 0
    for n in node_ids:
        m = _meminfo(_read(f"/sys/devices/system/node/node{n}/meminfo") or "")
        nodes_sum += m.get("MemTotal", 0)

    if node_total is None:
        total, avail, source = sys_total, sys_avail, "system (no NUMA node info)"
    elif len(node_ids) == 1 or nodes_sum < 0.9 * sys_total:
        total, avail = sys_total, sys_avail
        if len(node_ids) == 1:
            source = "system (single NUMA node: node and machine are the same memory)"
        else:
            source = (
                f"system (NUMA nodes report {nodes_sum / GiB:.1f} GiB of {sys_total / GiB:.1f} GiB)"
            )
    else:
        total, avail, source = node_total, node_avail or 0, f"NUMA node {node}"
    if cg is not None and cg < total:
        total = cg
        avail = min(avail, cg)
        source += ", clamped to the cgroup limit"
    return MemoryInfo(
        total=total,
        available=avail,
        source=source,
        node_total=node_total,
        node_available=node_avail,
        cgroup_limit=cg,
    )


def cxx_compiler() -> str | None:
    """The C++ compiler that torch's Inductor would run (``$CXX``, else the first of g++,
    c++, clang++ on PATH), or None. vLLM's compiled mode generates and compiles C++ while
    it serves; without a compiler it fails at the first request."""
    names = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "c++", "clang++"]
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def plugin_supported() -> tuple[bool, str]:
    """Whether the platform plugin should load on this machine, and why."""
    info = cpu_info()
    if info.arch not in ("x86_64", "AMD64", "amd64"):
        return False, f"not an x86-64 CPU (machine is {info.arch})"
    if not info.has("avx2"):
        return False, "this x86-64 CPU has no AVX2; the plugin needs AVX2 or better"
    return True, f"x86-64 with {info.isa_level.upper()} ({info.model_name})"
