"""RMSNorm and fused-add-RMSNorm through vLLM IR: the plugin's `x86` implementations.

vLLM's RMSNorm layer calls the IR ops `rms_norm` and `fused_add_rms_norm`; a platform
lists which implementation each dispatches to (X86Platform.get_default_ir_op_priority:
["x86", "native"]). These call the C++ kernels (csrc, rounding as the native
implementation does) when the arguments suit them and otherwise let the native one run,
with a warning (ops/fallback.py).

VLLM_X86_FP32_RESIDUAL (on by default) keeps the residual stream of bf16/fp16 models in
float32: vLLM's fused_add_rms_norm rounds the running sum of the residual connections
back to the model's dtype at every layer (twice per layer), which moves the logits of
the default model by up to ~0.7 from the float32 model's (docs/correctness.md). Two
more providers of fused_add_rms_norm return the sum in float32, unrounded, and the
normalised output in the model's dtype (the next GEMM's input, as before):
``x86_f32res`` (C++ kernel, eager mode) and ``x86_f32res_torch`` (PyTorch, which
Inductor fuses in compiled mode, and the fallback). Their first call (layer 0) gets the
bf16 embedding as residual and returns a float32 one; every later call gets that back,
since decoder layers only hand the residual from norm to norm. The platform picks them
(X86Platform.get_default_ir_op_priority, ``fp32_residual_applies``) for the decoder
families listed in FP32_RESIDUAL_ARCHS, whose layers do exactly that; the op's fake
then says the residual is float32 (``_fake_fused_add_rms_norm``).
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


PROVIDER_F32RES = "x86_f32res"
PROVIDER_F32RES_TORCH = "x86_f32res_torch"
# Decoder families whose layers pass the residual only from one fused_add_rms_norm to
# the next (and to the final norm), so a float32 residual never meets a GEMM or a plain
# `hidden + residual` (Granite's residual multiplier, post-norm models and hybrids do).
FP32_RESIDUAL_ARCHS = frozenset(
    {
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
    }
)


def fused_add_rms_norm_f32res_torch(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """vLLM's native fused_add_rms_norm without rounding the residual sum: returns (the
    norm in x's dtype, rounded where the native one rounds; the sum in float32)."""
    orig_dtype = x.dtype
    s = x.to(torch.float32) + x_residual.to(torch.float32)
    s_var = s if variance_size is None else s[..., :variance_size]
    y = s * torch.rsqrt(s_var.pow(2).mean(dim=-1, keepdim=True) + epsilon)
    if weight is not None:
        y = y.to(weight.dtype) * weight
    return y.to(orig_dtype), s


def _why_not_f32res(x, x_residual, weight, variance_size) -> str | None:
    if x.dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {x.dtype} is not bfloat16/float16"
    why = _why_not(x, weight, variance_size, two_d=True)
    if why is None and x_residual.stride(-1) != 1:
        why = "the residual is not contiguous in its last dimension"
    if why is None and x_residual.dtype == torch.float32 and x_residual.dim() > 2:
        if not x_residual.is_contiguous():
            why = "a non-contiguous residual of more than two dimensions"
    return why


def _supports_add_rms_f32res(x, x_residual, weight, epsilon, variance_size=None) -> bool:
    why = _why_not_f32res(x, x_residual, weight, variance_size)
    if why is not None:  # x86_f32res_torch runs: same results, PyTorch's speed
        warn_fallback("fused_add_rms_norm (float32 residual)", why)
    return why is None


def fused_add_rms_norm_f32res_x86(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    # layer 0's residual is the bf16 embedding: a float32 copy, written in place later
    residual = x_residual if x_residual.dtype == torch.float32 else x_residual.float()
    torch.ops.vllm_x86.fused_add_rms_norm_f32res(x, residual, weight, epsilon)
    return x, residual


def fp32_residual_applies(vllm_config) -> str | None:
    """None if the float32 residual stream applies to this model, else why not."""
    from vllm_x86.runtime import envs

    if not envs.get_bool("VLLM_X86_FP32_RESIDUAL"):
        return "VLLM_X86_FP32_RESIDUAL=0"
    mc = getattr(vllm_config, "model_config", None)
    if mc is None:
        return "no model"
    if mc.dtype not in (torch.bfloat16, torch.float16):
        return f"the model runs in {mc.dtype}"
    archs = set(getattr(mc, "architectures", None) or ())
    if not archs & FP32_RESIDUAL_ARCHS:
        return f"{sorted(archs)} is not one of {sorted(FP32_RESIDUAL_ARCHS)}"
    return None


def _f32res_selected() -> bool:
    from vllm import ir

    prio = ir.ops.fused_add_rms_norm.get_priority()
    return bool(prio) and prio[0] in (PROVIDER_F32RES, PROVIDER_F32RES_TORCH)


def _fake_fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None):
    """The op's fake (what torch.compile traces with): vLLM's native implementation,
    or the float32-residual one where the platform selected it."""
    from vllm import ir

    if _f32res_selected():
        return fused_add_rms_norm_f32res_torch(x, x_residual, weight, epsilon, variance_size)
    return ir.ops.fused_add_rms_norm.impls["native"].impl_fn(
        x, x_residual, weight, epsilon, variance_size
    )


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
    ir.ops.fused_add_rms_norm.register_impl(
        PROVIDER_F32RES, supports_args=_supports_add_rms_f32res, inplace=True
    )(fused_add_rms_norm_f32res_x86)
    ir.ops.fused_add_rms_norm.register_impl(PROVIDER_F32RES_TORCH)(fused_add_rms_norm_f32res_torch)
    # ledger: fp32_residual_fake
    ir.ops.fused_add_rms_norm.register_fake(_fake_fused_add_rms_norm)
    _registered = True
    return True
