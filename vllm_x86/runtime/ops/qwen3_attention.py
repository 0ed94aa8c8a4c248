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
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    rope = getattr(attn, "rotary_emb", None)
    if not isinstance(rope, RotaryEmbedding) or not rope.is_neox_style:
        return "the rotary embedding is not a plain neox one"
    if getattr(attn, "dual_chunk_attention_config", None):
        return "dual-chunk attention"
    if not type(rope).enabled():
        return "vLLM's rotary_embedding CustomOp is disabled (compiled mode lets Inductor fuse)"
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
    if not kernels.available():
        return kernels.load_error() or "no kernels"
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
        direct = self.__dict__.get("_x86_direct")
        if direct is None:
            why = direct_attention_problem(self.attn)
            direct = self._x86_direct = why is None
            if why is not None:
                _log_once(why)
        if direct and not torch.compiler.is_compiling():  # a compiled graph keeps vLLM's ops
            attn_output = direct_attention(self.attn, q, k, v)
        else:
            attn_output = self.attn(q, k, v)
        output, _ = self.o_proj(attn_output)
        return output


_logged: set[str] = set()


def _log_once(why: str) -> None:
    if why not in _logged:
        _logged.add(why)
        from vllm_x86.runtime.log import get_logger

        get_logger("ops").info("vllm-x86: Qwen3 attention goes through vLLM's layer: %s", why)


def direct_attention_problem(attn) -> str | None:
    """None if `direct_attention` may replace this vLLM Attention layer's call, else why
    not. It does exactly what the layer's forward does for a decoder layer on vLLM CPU's
    attention backend with an unquantized KV cache and no KV transfer."""
    from vllm.distributed.kv_transfer import has_kv_transfer_group
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    from vllm_x86.runtime import envs

    if not envs.get_bool("VLLM_X86_DIRECT_ATTENTION"):
        return "VLLM_X86_DIRECT_ATTENTION=0"
    impl = getattr(attn, "impl", None)
    if type(impl) is not CPUAttentionBackendImpl:
        return f"attention backend {type(impl).__name__}, not vLLM CPU's"
    if attn.attn_type != AttentionType.DECODER or impl.attn_type != AttentionType.DECODER:
        return "not decoder self-attention"
    if attn.kv_cache_dtype != "auto" or impl.kv_cache_dtype != "auto" or attn.query_quant:
        return f"KV cache dtype {attn.kv_cache_dtype}"
    if attn.kv_sharing_target_layer_name is not None:
        return "the layer shares another layer's KV cache"
    if attn.attn_backend.forward_includes_kv_cache_update:
        return "the backend writes the KV cache in its forward"
    if impl.sinks is not None:
        return "attention sinks"
    if has_kv_transfer_group():
        return "a KV transfer connector is configured"
    return None


def direct_attention(attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """vLLM's Attention.forward for the layers direct_attention_problem accepts, without
    its two Python custom ops (unified_kv_cache_update, unified_attention_with_output):
    the same two kernels (cpu_attn_reshape_and_cache, cpu_attention_with_kv_cache) with
    the same arguments, about 60 us less Python per layer and step (kernels.md)."""
    from vllm.forward_context import get_forward_context

    impl = attn.impl
    heads, head, head_v, kv_heads = (
        attn.num_heads,
        attn.head_size,
        attn.head_size_v,
        attn.num_kv_heads,
    )
    out = torch.empty((q.shape[0], heads * head_v), dtype=q.dtype, device=q.device)
    ctx = get_forward_context()
    md = ctx.attn_metadata
    if isinstance(md, dict):
        md = md[attn.layer_name]
    elif isinstance(md, list):
        md = md[0][attn.layer_name]
    if md is None:
        return out  # warm-up and profile runs, as vLLM's layer
    kv_cache = attn.kv_cache
    views = attn.__dict__.get("_x86_kv_views")
    if views is None or views[0] is not kv_cache:
        blocks, _, block_size, _ = kv_cache.size()
        kc, vc = kv_cache.view((blocks, kv_heads, block_size * 2, -1)).chunk(2, dim=2)
        views = attn._x86_kv_views = (kv_cache, kc, vc)
    _, key_cache, value_cache = views
    key = k.view(-1, kv_heads, head)
    value = v.view(-1, kv_heads, head_v)
    slot_mapping = ctx.slot_mapping.get(attn.layer_name)
    if slot_mapping is not None:
        torch.ops._C.cpu_attn_reshape_and_cache(
            key, value, key_cache, value_cache, slot_mapping, attn.isa,
            attn._k_scale_float, attn._v_scale_float, "auto",
        )  # fmt: skip
    n = md.num_actual_tokens
    torch.ops._C.cpu_attention_with_kv_cache(
        q.view(-1, heads, head)[:n], key_cache, value_cache, out.view(-1, heads, head_v)[:n],
        md.query_start_loc, md.seq_lens, impl.scale, md.causal, impl.alibi_slopes,
        impl.sliding_window, md.block_table, impl.logits_soft_cap, md.scheduler_metadata,
        None, md.dynamic_causal, attn._k_scale_float, attn._v_scale_float, "auto",
    )  # fmt: skip
    return out
