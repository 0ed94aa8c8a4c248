"""xIELU (Apertus) in float32: the activation's parameters in float32.

vLLM's ``XIELU`` creates its parameters ``alpha_p``, ``alpha_n`` and buffers ``beta``,
``eps`` in bfloat16 whatever the model's dtype (``XIELU.__init__(..., dtype=
torch.bfloat16)`` in vllm/model_executor/layers/activation.py; ``ApertusMLP`` builds
``XIELU()`` without a dtype, vllm/model_executor/models/apertus.py). A float32 model
therefore loads the checkpoint's float32 values rounded to bfloat16 and computes
``softplus(alpha)`` in bfloat16: the activation's quadratic and exponential
coefficients are off by up to 2^-9 relative, and the tiny Apertus checkpoint's fp32
log-probs differed from transformers (whose ``XIELUActivation`` holds the loaded
float32 values) by 4.2e-3. Built inside a float32 model (torch's default dtype while
vLLM builds the model is the model dtype), the plugin's class makes them float32;
other dtypes keep vLLM's bfloat16. The math is vLLM's (``forward_native``, the formula
of ``reference.xielu``).
"""

from __future__ import annotations

import torch


class X86XIELUMixin:
    def __init__(
        self,
        alpha_p_init: float = 0.8,
        alpha_n_init: float = 0.8,
        beta: float = 0.5,
        eps: float = -1e-6,
        dtype: torch.dtype | None = None,
        with_vector_loads: bool = False,
    ) -> None:
        if dtype is None:  # vLLM's default is bfloat16 for every model dtype
            dtype = torch.float32 if torch.get_default_dtype() == torch.float32 else torch.bfloat16
        super().__init__(alpha_p_init, alpha_n_init, beta, eps, dtype, with_vector_loads)
