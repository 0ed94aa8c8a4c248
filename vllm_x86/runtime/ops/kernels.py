"""The plugin's C++ kernels (vllm_x86/runtime/csrc), as torch ops: torch.ops.vllm_x86.*.

The ops' schemas and fakes are ops/schemas.py's (imported here); loading the extension
registers their C++ implementations. Loading also tells the library what this CPU and
process can run (hardware.usable_isas(): the library probes nothing itself), then
applies VLLM_X86_ISA, VLLM_X86_QUANT_A8_ROWS and VLLM_X86_QUANT_VNNI_ROWS. The extension is built at install time
(`make install`); if it is missing, `available()` is False and `load_error()` says why,
and the op table falls back to vLLM's own implementations with a warning
(ops/registry.py).
"""

from __future__ import annotations

import functools

import torch

from vllm_x86.runtime import hardware
from vllm_x86.runtime.ops import schemas  # noqa: F401  (declares torch.ops.vllm_x86.*)

ISA_ENV = "VLLM_X86_ISA"


@functools.cache
def _load():
    try:
        from vllm_x86.runtime import _C  # registers the ops' C++ implementations
    except ImportError as e:
        return (
            None,
            f"the kernel library is not built ({e}); run `make install` in a checkout, or reinstall the vllm_x86 wheel",
        )
    _C.set_cpu_isas(list(hardware.usable_isas()))
    _C.set_isa(wanted_isa())  # raises with a clear message for an unknown or unusable ISA
    _C.set_quant_a8_rows(a8_rows())
    _C.set_quant_vnni_rows(
        _rows_setting(
            "VLLM_X86_QUANT_VNNI_ROWS",
            "up to how many rows INT4 GEMMs run the AVX-512 VNNI kernel on an AMX CPU",
        )
    )
    return _C, None


def wanted_isa() -> str:
    """VLLM_X86_ISA: auto, or the elementwise ISA the kernels should run."""
    from vllm_x86.runtime import envs

    return envs.get(ISA_ENV).strip().lower() or "auto"


def a8_rows() -> int:
    """VLLM_X86_QUANT_A8_ROWS as a row count (0: never), or a ValueError that says what
    the setting takes."""
    return _rows_setting(
        "VLLM_X86_QUANT_A8_ROWS",
        "from how many rows the INT8/INT4 GEMMs take 8-bit activations on AVX-512 VNNI",
    )


def _rows_setting(name: str, what: str) -> int:
    """A row-count setting (0: never), or a ValueError that says what it takes."""
    from vllm_x86.runtime import envs

    raw = envs.get(name).strip()
    try:
        rows = int(raw)
    except ValueError:
        rows = -1
    if rows < 0:
        raise ValueError(f"{name}={raw!r}: expected a row count ({what}) or 0 for never")
    return rows


# The ops' forward_cpu methods ask these while torch.compile traces them (with vLLM's
# CustomOps on in compiled mode): constants to Dynamo, which would otherwise trace into
# _load and stop at the extension's set_isa.
@torch.compiler.assume_constant_result
def available() -> bool:
    return _load()[0] is not None


@torch.compiler.assume_constant_result
def load_error() -> str | None:
    return _load()[1]


def isa() -> str:
    """The ISA the elementwise kernels run with now ("none" without the library)."""
    lib = _load()[0]
    return lib.isa() if lib is not None else "none"


def available_isas() -> list[str]:
    """The elementwise ISAs this CPU can run, lowest first (hardware.KERNEL_ISAS);
    empty without the library."""
    if _load()[0] is None:
        return []
    usable = hardware.usable_isas()
    return [isa for isa in hardware.KERNEL_ISAS if isa in usable]


def set_isa(name: str) -> None:
    """Pick the ISA the elementwise kernels run with: auto, or one of available_isas()
    (tests use this to cover every path); another is refused with a RuntimeError."""
    lib = _load()[0]
    if lib is None:
        raise RuntimeError(load_error())
    lib.set_isa(name)


def available_quant_isas() -> list[str]:
    """The INT8/INT4 GEMM ISAs this CPU and process can run, lowest first
    (hardware.QUANT_ISAS); empty without the library."""
    if _load()[0] is None:
        return []
    usable = hardware.usable_isas()
    return [isa for isa in hardware.QUANT_ISAS if isa in usable]


def quant_isa() -> str:
    """The INT8/INT4 GEMM kernels that run now: "amx", "avx512_vnni", or "" (none can
    run here, or the library is not built)."""
    lib = _load()[0]
    return lib.quant_isa() if lib is not None else ""


def set_quant_isa(name: str) -> None:
    """Pick the INT8/INT4 GEMM kernels: auto, amx or avx512_vnni (one this CPU can run:
    hardware.usable_isas()); tests use this to cover both on an AMX machine."""
    lib = _load()[0]
    if lib is None:
        raise RuntimeError(load_error())
    lib.set_quant_isa(name)


def ops():
    """torch.ops.vllm_x86, after making sure the library is loaded."""
    if not available():
        raise RuntimeError(load_error())
    return torch.ops.vllm_x86
