"""vLLM's Attention layer on vLLM CPU's attention backend in one call per layer.

For a decoder layer, vLLM's ``Attention.forward`` on CPU makes two Python custom ops
(``unified_kv_cache_update``, ``unified_attention_with_output``), each of which looks up
the forward context, re-derives the key and value cache views from the layer's KV cache
(a view and a chunk) and then calls one C++ kernel of vLLM CPU
(``_C.cpu_attn_reshape_and_cache``, ``_C.cpu_attention_with_kv_cache``). Per layer and
decode step that Python costs several times the two kernels on a small model
(docs/overhead.md). The op table's ``Attention`` row switches the layers that
``direct_attention_problem`` accepts to ``X86AttentionMixin``, whose forward calls the
same two kernels with the same arguments from one place, the cache views computed once:

- in eager mode, directly (``direct_attention``);
- inside a compiled graph, through one opaque op, ``torch.ops.vllm_x86.attention``
  (its schema and fake in ops/schemas.py), instead of vLLM's two.

The layers keep their weights, KV cache and every attribute; a layer this does not
accept (another backend, encoder attention, a quantized KV cache, KV sharing, sinks, a
KV transfer connector, or ``VLLM_X86_DIRECT_ATTENTION=0``) keeps vLLM's forward, and the
op table logs why. Reference: vLLM's own layer, the same kernels; the tests compare the
greedy tokens of both (tests/models/test_qwen3_fused_attention.py) and against
transformers.
"""

from __future__ import annotations

import torch


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
    if attn.head_size_v != attn.head_size:
        return "values and keys have different head sizes"
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


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_name: str) -> torch.Tensor:
    """torch.ops.vllm_x86.attention: direct_attention for the layer named, found in the
    forward context as vLLM's own ops find it. Opaque to torch.compile (the graph holds
    the call; ops/schemas.py's fake gives the output's shape)."""
    from vllm.forward_context import get_forward_context

    return direct_attention(get_forward_context().no_compile_layers[layer_name], q, k, v)


torch.library.impl("vllm_x86::attention", "CPU")(attention)


class X86AttentionMixin:
    """vLLM's Attention with forward in one call (see the module docstring)."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        output_shape: torch.Size | None = None,
        output_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        width = self.num_heads * self.head_size
        if (
            output_shape is not None
            or (output_dtype is not None and output_dtype != query.dtype)
            or key is None
            or value is None
            or query.dim() != 2
            or query.shape[1] != width
        ):
            return super().forward(query, key, value, output_shape, output_dtype)
        if torch.compiler.is_compiling():
            return torch.ops.vllm_x86.attention(query, key, value, self.layer_name)
        return direct_attention(self, query, key, value)
