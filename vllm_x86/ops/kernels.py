"""The plugin's C++ kernels (vllm_x86/csrc), as torch ops: torch.ops.vllm_x86.*.

Loading the extension registers the ops; this module adds their fake (meta)
implementations so torch.compile can trace through them, applies VLLM_X86_ISA and
VLLM_X86_QUANT_A8_ROWS, and says which ISA runs. The extension is built at install time
(`make install`); if it is missing, `available()` is False and `load_error()` says why,
and the op table falls back to vLLM's own implementations with a warning
(ops/registry.py).
"""

from __future__ import annotations

import functools
import os

import torch

ISA_ENV = "VLLM_X86_ISA"


@functools.cache
def _load():
    try:
        from vllm_x86 import _C  # noqa: F401  (registers torch.ops.vllm_x86.*)
    except ImportError as e:
        return None, f"the kernel library is not built ({e}); run `make install`"
    wanted = os.environ.get(ISA_ENV, "auto").strip().lower() or "auto"
    _C.set_isa(wanted)  # raises with a clear message for an unknown or unsupported ISA
    _C.set_quant_a8_rows(a8_rows())
    _register_fakes()
    return _C, None


def a8_rows() -> int:
    """VLLM_X86_QUANT_A8_ROWS as a row count (0: never), or a ValueError that says what
    the setting takes."""
    from vllm_x86 import envs

    raw = envs.get("VLLM_X86_QUANT_A8_ROWS").strip()
    try:
        rows = int(raw)
    except ValueError:
        rows = -1
    if rows < 0:
        raise ValueError(
            f"VLLM_X86_QUANT_A8_ROWS={raw!r}: expected a row count (from how many rows the "
            "INT8/INT4 GEMMs take 8-bit activations on AVX-512 VNNI) or 0 for never"
        )
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
    lib = _load()[0]
    return lib.isa() if lib is not None else "none"


def available_isas() -> list[str]:
    lib = _load()[0]
    return list(lib.available_isas()) if lib is not None else []


def set_isa(name: str) -> None:
    """Pick the ISA the kernels run with (tests use this to cover every path)."""
    lib = _load()[0]
    if lib is None:
        raise RuntimeError(load_error())
    lib.set_isa(name)


def ops():
    """torch.ops.vllm_x86, after making sure the library is loaded."""
    if not available():
        raise RuntimeError(load_error())
    return torch.ops.vllm_x86


def _register_fakes() -> None:
    # The ops of the op table write into arguments they are given and return nothing,
    # so their fake implementations have nothing to compute.
    def nothing(*args, **kwargs):
        return None

    for name in (
        "rms_norm",
        "fused_add_rms_norm",
        "rotary_embedding",
        "silu_and_mul",
        "gelu_and_mul",
        "gelu_tanh_and_mul",
        "split_norm_rope_neox",
    ):
        torch.library.register_fake(f"vllm_x86::{name}")(nothing)

    # The quantized GEMMs return [M, N]: N is 16 channels per row of the packed weight.
    @torch.library.register_fake("vllm_x86::int8_w8a16_gemm")
    def _int8_gemm(x, w, scale, bias):
        return x.new_empty((x.shape[0], w.shape[0] * 16))

    @torch.library.register_fake("vllm_x86::int4_w4a16_gemm")
    def _int4_gemm(x, w, scale, zeros, group_size, bias):
        return x.new_empty((x.shape[0], w.shape[0] * 16))
