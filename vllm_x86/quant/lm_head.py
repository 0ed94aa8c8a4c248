"""The LM head in INT8, on request (`VLLM_X86_QUANT_LM_HEAD=1`, or a prepacked
checkpoint written with `vllm-x86 quantize --lm-head`).

Decoding a token reads the LM head whole: for models with large vocabularies it is a
large share of the bytes (Qwen3-0.6B: 156 M of its 596 M weights read per token), so
with only the decoder layers quantized, INT8 can gain at most 1.6x over bf16 on that
model. The LM head is quantized like the INT8 Linear layers (symmetric, a float32 scale
per vocabulary entry, the same kernel) after the weights are loaded. The input
embedding keeps its bf16 table: a lookup reads one row per token, and with tied
embeddings the two share that table, so the INT8 copy is extra memory (1 byte per
weight), not a replacement.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

from vllm_x86.quant import methods as m


class Int8LMHeadMethod(UnquantizedEmbeddingMethod):
    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if getattr(layer, "x86_done", False):
            return
        layer.x86_done = True
        w = layer.weight.data
        n, k = w.shape
        kernel = m.int8_kernel()
        problem = m.lm_head_bf16_reason(n, k, kernel)
        layer.x86_lm_head = problem is None
        if not layer.x86_lm_head:
            m._warn_once("lmhead", "vllm-x86: the LM head stays in bf16: %s", problem)
            super().process_weights_after_loading(layer)
            return
        q, scale = m.quantize_int8(w)
        layer.x86_lm_kernel = kernel
        layer.x86_lm_weight = m.pack_int8_for(kernel, q)
        layer.x86_lm_scale = scale
        m.logger.info("vllm-x86: LM head (%d x %d) in INT8", n, k)

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if not getattr(layer, "x86_lm_head", False):
            return super().apply(layer, x, bias)
        x2 = x.reshape(-1, x.shape[-1])
        out = m.int8_matmul(
            layer.x86_lm_kernel,
            x2,
            layer.x86_lm_weight,
            layer.x86_lm_scale,
            None if bias is None else bias.float(),
        )
        return out.reshape(*x.shape[:-1], out.shape[-1])
