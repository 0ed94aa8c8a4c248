"""RMSNorm and fused-add-RMSNorm through vLLM IR: the plugin's `x86` implementations.

vLLM's RMSNorm layer calls the IR ops `rms_norm` and `fused_add_rms_norm`; a platform
lists which implementation each dispatches to (X86Platform.get_default_ir_op_priority:
["x86", "native"]). These call the C++ kernels (csrc, rounding as the native
implementation does) when the arguments suit them and otherwise let the native one run,
with a warning (ops/fallback.py).
"""

import torch
from torch import Tensor

from vllm_x86.runtime.ops import kernels
from vllm_x86.runtime.ops.fallback import warn_fallback

PROVIDER = "x86"
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _why_not(x: Tensor, weight, variance_size, two_d: bool = False) -> str | None:
    if x.dtype not in _DTYPES:
        return f"dtype {x.dtype} is not float32/bfloat16/float16"
    if variance_size is not None:
        return "variance_size (a norm over part of the hidden size) is not implemented"
    if weight is not None and (weight.dtype != x.dtype or not weight.is_contiguous()):
        return "the weight's dtype differs from the input's"
    if x.stride(-1) != 1:
        return "the input is not contiguous in its last dimension"
    if two_d and x.dim() > 2 and not x.is_contiguous():
        return "a non-contiguous input of more than two dimensions"
    return None


def _supports_rms(x, weight, epsilon, variance_size=None) -> bool:
    why = _why_not(x, weight, variance_size)
    if why is not None:
        warn_fallback("rms_norm", why)
    return why is None


def _supports_add_rms(x, x_residual, weight, epsilon, variance_size=None) -> bool:
    why = _why_not(x, weight, variance_size, two_d=True)
    if why is None and (x_residual.dtype != x.dtype or x_residual.stride(-1) != 1):
        why = "the residual's dtype or layout differs from the input's"
    if why is not None:
        warn_fallback("fused_add_rms_norm", why)
    return why is None


# Annotated (no postponed annotations in this file): vLLM IR infers a torch schema
# from these signatures, which must match the native implementation's.
def rms_norm_x86(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    torch.ops.vllm_x86.rms_norm(out, x, weight, epsilon)
    return out


def fused_add_rms_norm_x86(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    torch.ops.vllm_x86.fused_add_rms_norm(x, x_residual, weight, epsilon)
    return x, x_residual


_registered = False


def register() -> bool:
    """Register the `x86` providers with vLLM IR (idempotent). False if the kernels are
    not available, in which case the platform keeps vLLM's native priority."""
    global _registered
    if _registered:
        return True
    if not kernels.available():
        warn_fallback("rms_norm and fused_add_rms_norm", kernels.load_error() or "no kernels")
        return False
    from vllm import ir

    ir.ops.rms_norm.register_impl(PROVIDER, supports_args=_supports_rms)(rms_norm_x86)
    ir.ops.fused_add_rms_norm.register_impl(
        PROVIDER, supports_args=_supports_add_rms, inplace=True
    )(fused_add_rms_norm_x86)
    _registered = True
    return True
