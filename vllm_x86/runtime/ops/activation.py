"""SiluAndMul and GeluAndMul on CPU: the plugin's C++ kernels.

Stock vLLM CPU runs the native PyTorch code for these on x86 (a separate activation
and multiply, each a pass over memory); the kernels do both in one pass with the same
rounding points (the activation's result is rounded to the model dtype before the
multiply, as in the native code).
"""

from __future__ import annotations

import torch

from vllm_x86.runtime.ops import kernels
from vllm_x86.runtime.ops.fallback import warn_fallback

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _usable(op: str, x: torch.Tensor) -> bool:
    if not kernels.available():
        warn_fallback(op, kernels.load_error() or "no kernels")
        return False
    if x.dtype not in _DTYPES:
        warn_fallback(op, f"dtype {x.dtype} is not float32/bfloat16/float16")
        return False
    if not x.is_contiguous() and not (x.dim() == 2 and x.stride(-1) == 1):
        warn_fallback(op, "the input's rows are not contiguous")
        return False
    return True


def _act_and_mul(op_name: str, x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    out = torch.empty(x.shape[:-1] + (d,), dtype=x.dtype, device=x.device)
    getattr(torch.ops.vllm_x86, op_name)(out, x)
    return out


class X86SiluAndMulMixin:
    def forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
        if not _usable("silu_and_mul", x):
            return self.forward_native(x)
        return _act_and_mul("silu_and_mul", x)


class X86GeluAndMulMixin:
    def forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
        if not _usable("gelu_and_mul", x):
            return self.forward_native(x)
        op = "gelu_tanh_and_mul" if self.approximate == "tanh" else "gelu_and_mul"
        return _act_and_mul(op, x)
