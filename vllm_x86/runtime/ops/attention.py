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

With VLLM_X86_DECODE_ATTENTION=1 (the default), decode steps (every sequence brings one new token) with little attention work go
further: one C++ op, ``torch.ops.vllm_x86.decode_attention``, writes the new keys and
values into vLLM's paged cache in the layout vLLM's attention ISA uses and attends in
float32 (reference: ops/reference.decode_attention; tests/unit/test_decode_attention.py
checks the cache bytes and the output against vLLM's two kernels and the reference). It
saves the Python between vLLM's two kernels and their fixed cost: at one request on
SmolLM2's shapes (9 heads, 3 KV heads, head 64, 100 tokens) 6.0 us against vLLM's
10.1 us for the two kernels alone, on an AMX Xeon. vLLM's AMX attention kernel is faster
on long contexts and large batches, so above `_DECODE_MAX_WORK` multiply-adds per layer
the step keeps vLLM's kernels (measured per layer on the same Xeon: 0.95x at 300 tokens
with 14 heads, 0.6x at 1,000 tokens with 9; the "vec" layout of CPUs without AMX stays
level or ahead up to about four times that work).

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


# Above this many multiply-adds per layer and step (sequences x longest sequence x query
# heads x head size) a decode step runs vLLM's attention kernels, by the KV cache layout
# (0: vLLM's "vec"/"vec16", 1: "amx"); see the module docstring for the measurements.
_DECODE_MAX_WORK = {0: 1 << 22, 1: 1 << 20}
_DECODE_LAYOUTS = {"vec": 0, "vec16": 0, "amx": 1}
_decode_told: set[str] = set()


def decode_attention_problem(attn, dtype: torch.dtype) -> str | None:
    """None if this layer's decode steps may run torch.ops.vllm_x86.decode_attention,
    else why not (asked once per layer; direct_attention_problem has accepted it)."""
    from vllm_x86.runtime.ops import kernels

    why = static_decode_attention_problem(attn)
    if why is not None:
        return why
    layout = _DECODE_LAYOUTS.get(getattr(attn, "isa", None))
    if layout is None:
        return f"vLLM's attention ISA {getattr(attn, 'isa', None)!r} has a KV cache layout the kernel does not read"
    if layout == 1 and (dtype != torch.bfloat16 or kernels.isa() == "avx2"):
        return "the amx KV cache layout needs bfloat16 and the AVX-512 kernels"
    if attn.kv_cache.dtype != dtype or dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"KV cache dtype {attn.kv_cache.dtype} with {dtype} activations"
    return None


def static_decode_attention_problem(attn) -> str | None:
    """The part of decode_attention_problem that a loaded model already answers (before
    its KV cache and attention ISA exist)."""
    from vllm_x86.runtime import envs
    from vllm_x86.runtime.ops import kernels

    impl = attn.impl
    if not envs.get_bool("VLLM_X86_DECODE_ATTENTION"):
        return "VLLM_X86_DECODE_ATTENTION=0"
    if not kernels.available():
        return kernels.load_error() or "the plugin's kernels are not built"
    if impl.alibi_slopes is not None:
        return "ALiBi"
    if impl.sliding_window not in (None, -1):
        return "a sliding window"
    if impl.logits_soft_cap:
        return "a logits soft cap"
    if attn.head_size % 16:
        return f"head size {attn.head_size} (a multiple of 16 is needed)"
    return None


def _decode_layout(attn, q: torch.Tensor) -> int | None:
    """The layer's KV cache layout for decode_attention, or None (and why, logged once)."""
    d = attn.__dict__
    if "_x86_decode_layout" not in d:
        why = decode_attention_problem(attn, q.dtype)
        d["_x86_decode_layout"] = None if why else _DECODE_LAYOUTS[attn.isa]
        say = why or f"layout {attn.isa}"
        if say not in _decode_told:
            from vllm_x86.runtime.log import get_logger

            _decode_told.add(say)
            if why:
                get_logger("ops").info(
                    "vllm-x86: decode attention stays on vLLM's kernels: %s", why
                )
            else:
                get_logger("ops").info(
                    "vllm-x86: decode attention runs the plugin's kernel (vLLM's %s KV cache "
                    "layout) up to %d multiply-adds per layer and step, vLLM's kernels above",
                    attn.isa,
                    _DECODE_MAX_WORK[_DECODE_LAYOUTS[attn.isa]],
                )
    return d["_x86_decode_layout"]


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
    slot_mapping = ctx.slot_mapping.get(attn.layer_name)
    n = md.num_actual_tokens
    if (
        md.max_query_len == 1  # decode: one new token per sequence, no padding rows
        and md.seq_lens.shape[0] == n
        and slot_mapping is not None
        and md.causal
        and md.dynamic_causal is None
        and k.dim() == 2
    ):
        layout = _decode_layout(attn, q)
        if layout is not None and n * md.max_seq_len * heads * head <= _DECODE_MAX_WORK[layout]:
            torch.ops.vllm_x86.decode_attention.default(
                out, q, k, v, kv_cache, slot_mapping, md.block_table, md.seq_lens,
                impl.scale, layout,
            )  # fmt: skip
            return out
    views = attn.__dict__.get("_x86_kv_views")
    if views is None or views[0] is not kv_cache:
        blocks, _, block_size, _ = kv_cache.size()
        kc, vc = kv_cache.view((blocks, kv_heads, block_size * 2, -1)).chunk(2, dim=2)
        views = attn._x86_kv_views = (kv_cache, kc, vc)
    _, key_cache, value_cache = views
    key = k.view(-1, kv_heads, head)
    value = v.view(-1, kv_heads, head_v)
    if slot_mapping is not None:
        torch.ops._C.cpu_attn_reshape_and_cache(
            key, value, key_cache, value_cache, slot_mapping, attn.isa,
            attn._k_scale_float, attn._v_scale_float, "auto",
        )  # fmt: skip
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
