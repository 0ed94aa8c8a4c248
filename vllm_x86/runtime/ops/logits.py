"""The best logits in float32 (VLLM_X86_FP32_RESIDUAL): a LogitsProcessor that
recomputes the leading candidates of a bf16/fp16 LM head exactly.

vLLM's LM head on CPU is a bf16 GEMM (oneDNN) that accumulates in float32 and rounds
its output to bf16: at the default model's logits (16-32) that is a step of 0.125, so
two tokens whose float32 logits are 0.05 apart can swap, or tie, and the sampler
(which converts the logits to float32 afterwards) picks by rounding. A GEMM with a
float32 output would fix it, but neither oneDNN through vLLM (``onednn_mm``) nor
PyTorch on CPU (``torch.mm(out_dtype=)``) offers one, and writing one means a second
LM-head kernel to keep as fast as oneDNN's. Instead, after the bf16 GEMM, the tokens
whose rounded logit is within ``|max| * 2**-6`` (two bf16 steps, more than the two
half-steps of rounding that could hide the true best) of the row's best are recomputed
from the same bf16 weight rows and hidden state with float32 accumulation, and the
logits come back in float32 with those values. The greedy choice is then the one a
float32-output GEMM would make; the other logits keep their bf16 values. It reads a
few more weight rows (typically 1-8 of 49152 for the default model), and one kernel
pass over the logits that also does the float32 conversion the sampler did anyway: about
7 us more per decode step of the default model (refine_top_logits).

The op table switches the class of a loaded model's LogitsProcessor (a ``module`` row,
``refinable`` says where it applies): an unquantized LM head whose weight vLLM keeps,
no soft cap, scale or logits-as-input, one tensor-parallel rank. An INT8/INT4 LM head
(VLLM_X86_QUANT_LM_HEAD) keeps its own rounding.
"""

from __future__ import annotations

import torch


def refinable(proc) -> str | None:
    """None if the float32 candidates apply to this LogitsProcessor, else why not."""
    from vllm_x86.runtime import envs

    if not envs.get_bool("VLLM_X86_FP32_RESIDUAL"):
        return "VLLM_X86_FP32_RESIDUAL=0"
    if getattr(proc, "logits_as_input", False):
        return "the model hands logits in (logits_as_input)"
    if getattr(proc, "soft_cap", None) is not None or getattr(proc, "scale", 1.0) != 1.0:
        return "the logits are soft-capped or scaled"
    return None


def head_weight(lm_head, hidden: torch.Tensor) -> torch.Tensor | None:
    """The LM head's plain weight rows [vocab, hidden] in the hidden state's dtype, or
    None (a quantized head, a removed weight, tensor parallelism, float32)."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    if hidden.dtype not in (torch.bfloat16, torch.float16):
        return None
    if type(getattr(lm_head, "quant_method", None)) not in (
        UnquantizedEmbeddingMethod,
        UnquantizedLinearMethod,
    ):
        return None
    if getattr(lm_head, "tp_size", 1) != 1:
        return None
    w = getattr(lm_head, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.dtype != hidden.dtype:
        return None
    if w.shape[1] != hidden.shape[-1] or w.shape[0] == 0:
        return None
    return w


# Tokens whose bf16/fp16 logit is within |best| * 2**-6 of the row's best are recomputed:
# bf16 keeps 8 significant bits, so a rounding step is at most |x| * 2**-7.
REFINE_REL = 2.0**-6


def refine_top_logits(
    logits: torch.Tensor,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """float32 logits [M, V]: `logits` (the bf16/fp16 GEMM's output, [M, V]) converted,
    with every token within two rounding steps of its row's best recomputed as
    float32 dot products of `hidden` [M, K] and `weight` rows [>=V, K] (+ `bias`).

    The plugin's kernel (torch.ops.vllm_x86.refine_top_logits) does it in one pass over
    the logits and a dot product per candidate: about 7 us above the float32 conversion
    for a 49,152-token vocabulary, where the same in torch ops (ops/reference.py, the
    reference, run where the kernel cannot) took 68 us (2 threads, the AMX Xeon VM)."""
    from vllm_x86.runtime.ops import kernels, reference
    from vllm_x86.runtime.ops.fallback import warn_fallback

    why = None
    if not kernels.available():
        why = kernels.load_error() or "no kernels"
    elif logits.dtype not in (torch.bfloat16, torch.float16):
        why = f"dtype {logits.dtype}"
    elif logits.stride(-1) != 1 or hidden.stride(-1) != 1 or weight.stride(-1) != 1:
        why = "rows that are not contiguous"
    elif bias is not None and bias.dtype != logits.dtype:
        why = f"a {bias.dtype} bias (the kernel adds one in the logits' dtype)"
    if why is None:
        return torch.ops.vllm_x86.refine_top_logits.default(
            logits, hidden, weight, bias, REFINE_REL
        )
    warn_fallback("refine_top_logits", why)
    return reference.refine_top_logits(logits, hidden, weight, bias, REFINE_REL)


class X86ExactTopLogitsMixin:
    """LogitsProcessor.forward, then the leading candidates recomputed in float32."""

    def forward(
        self,
        lm_head,
        hidden_states: torch.Tensor,
        embedding_bias: torch.Tensor | None = None,
        skip_gather: bool = False,
    ) -> torch.Tensor | None:
        logits = super().forward(lm_head, hidden_states, embedding_bias, skip_gather)
        if logits is None or logits.dtype == torch.float32 or logits.dim() != 2:
            return logits
        if getattr(self, "head_dtype", None) not in (None, hidden_states.dtype):
            return logits
        weight = head_weight(lm_head, hidden_states)
        if weight is None or hidden_states.dim() != 2 or hidden_states.shape[0] != logits.shape[0]:
            return logits
        return refine_top_logits(logits, hidden_states, weight, embedding_bias)
