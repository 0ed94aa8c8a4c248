"""Qwen3 and Qwen3-MoE attention with the fused `split_norm_rope_neox` kernel.

vLLM's Qwen3 attention runs, between the QKV projection and attention: a split of the
fused projection into q, k, v, an RMSNorm over every q head and every k head (q_norm,
k_norm), and the rotary embedding of q and k. ``torch.ops.vllm_x86.split_norm_rope_neox``
does all of it in one pass over the projection's output, with the same results as the
plugin's separate ops, bit for bit (tests/unit/test_ops.py).

The op table applies this to a loaded model by switching the class of each attention
module to a subclass with the mixin below (``registry.apply_module_overrides``); the
modules keep their weights and state. The fused path is taken when its conditions
hold (checked once per module): a plain neox rotary embedding, q/k norms with weights
and the same epsilon, and vLLM's rotary CustomOp enabled (eager mode, or
`custom_ops: ["+rotary_embedding"]`); otherwise vLLM's forward runs unchanged.
"""

from __future__ import annotations

import torch

from vllm_x86.runtime.ops import kernels


def fusable(attn) -> str | None:
    """None if the fused path applies to this attention module, else why not."""
    why = qk_norm_problem(attn)
    if why is not None:
        return why
    if not type(attn.rotary_emb).enabled():
        return "vLLM's rotary_embedding CustomOp is disabled (compiled mode lets Inductor fuse)"
    if not kernels.available():
        return kernels.load_error() or "no kernels"
    return None


def qk_norm_problem(attn) -> str | None:
    """None if split_norm_rope_neox can run this attention module's split, q/k norms and
    rotary embedding, else why not (also asked by ops/decoder_layer.py)."""
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    rope = getattr(attn, "rotary_emb", None)
    if not isinstance(rope, RotaryEmbedding) or not rope.is_neox_style:
        return "the rotary embedding is not a plain neox one"
    if getattr(attn, "dual_chunk_attention_config", None):
        return "dual-chunk attention"
    for norm in (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)):
        if not isinstance(norm, RMSNorm) or not norm.has_weight:
            return "q_norm/k_norm are not weighted RMSNorms"
        if norm.variance_size_override is not None:
            return "q_norm/k_norm normalise over part of the head"
    if attn.q_norm.variance_epsilon != attn.k_norm.variance_epsilon:
        return "q_norm and k_norm have different epsilons"
    dtypes = {attn.q_norm.weight.dtype, attn.k_norm.weight.dtype}
    if len(dtypes) != 1 or dtypes.pop() not in (torch.bfloat16, torch.float16, torch.float32):
        return "q_norm/k_norm weights are not all bfloat16, float16 or float32"
    return None


class X86QkNormRopeAttentionMixin:
    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        t = qkv.shape[0]
        q = torch.empty((t, self.q_size), dtype=qkv.dtype, device=qkv.device)
        k = torch.empty((t, self.kv_size), dtype=qkv.dtype, device=qkv.device)
        v = torch.empty((t, self.kv_size), dtype=qkv.dtype, device=qkv.device)
        cache = self.rotary_emb._match_cos_sin_cache_dtype(qkv)
        torch.ops.vllm_x86.split_norm_rope_neox(
            q,
            k,
            v,
            qkv,
            positions.flatten().long(),
            self.q_norm.weight,
            self.k_norm.weight,
            cache,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.q_norm.variance_epsilon,
        )
        # the op table's Attention row (ops/attention.py) makes this one call per layer
        attn_output = self.attn(q, k, v)
        output, _ = self.o_proj(attn_output)
        return output
