"""A decode step of a whole Llama / Qwen2 / Qwen3 / Mistral decoder layer in one C++ call.

At one request, a decode step of a small model is mostly fixed cost (docs/overhead.md):
each decoder layer makes about ten calls (two norms, four GEMMs, rotary, the KV-cache
write and attention, the activation), each crossing from Python into torch's dispatcher
and back, with Python between them; Inductor's compiled graph makes the same calls from
its Python wrapper. For SmolLM2 that Python was about a quarter of a compiled step.

The op table's rows for vLLM's ``LlamaDecoderLayer``, ``Qwen2DecoderLayer``,
``Qwen3DecoderLayer`` and ``MistralDecoderLayer`` switch the layers ``fusable`` accepts
to ``X86DecoderLayerMixin``. Its forward, for a decode step
(one new token per sequence, little enough attention work; with speculative decoding,
also a step of a few tokens per sequence, below) of a layer whose four linear
layers run the plugin's INT8 or INT4 kernels, calls one C++ op,
``torch.ops.vllm_x86.decode_layer`` (csrc/ops.cpp), which makes the same kernel calls
that the plugin's eager path makes for the layer, with the same arguments, in the same
order: RMSNorm (or the fused add + RMSNorm, with the float32 residual stream where the
platform chose it), the QKV GEMM, the rotary embedding in place (with Qwen3's q/k norms:
the split, the norms and the rotary embedding in one ``split_norm_rope_neox`` call, as the
plugin's Qwen3 attention makes it, ops/qwen3_attention.py), the plugin's decode
attention (KV-cache write and attention), the output GEMM, the post-attention fused add
+ RMSNorm, the gate/up GEMM, SiLU-and-mul, the down GEMM. So its results are the eager
path's, bit for bit (``reference_decode_layer`` below runs those ops one by one from
Python; tests/unit/test_decoder_layer.py compares the two, and tests/e2e/test_quantized.py
the tokens of whole models with the setting on and off).

Where every layer of a stack (``LlamaModel``, ``Qwen2Model``, ``Qwen3Model``,
``MistralModel``) takes the call, the op table's rows for those classes switch the stack to
``X86FusedDecodeModelMixin``: a decode step then runs one Python loop, the embedding,
the layers' fused calls with the step's metadata looked up once (one
``torch.ops.vllm_x86.decode_stack`` call for all of them where they share the step's
metadata and slot mapping, as the layers of one KV cache group do: decode_layer for each
layer in turn, from C++), the final norm, instead of the stack's forward. In compiled mode that loop replaces the compiled graph
for decode steps, as vLLM itself runs the stack's Python forward for a step whose
forward context says ``skip_compiled``: the graph's Python wrapper makes the same ten
kernel calls per layer, fewer where Inductor fused elementwise ops. Other steps
(prefill, mixed batches, a context long enough that vLLM's attention kernels are the
faster ones, padding rows) run the stack's own code, compiled where the model is.

With speculative decoding the worker lets steps of up to k + 2 tokens per sequence take
the call too (``allow_rows_per_sequence``; ``VLLM_X86_FUSED_VERIFICATION``): the
target's verification of k drafted tokens and a draft model's first step of each round.
Each row then attends as a decode step of its own: its sequence's block-table row and
its position + 1 tokens (``_row_metadata``), the C++ attention writing every row's key
and value before a later row reads them. Without it those steps ran each layer's
per-op code with vLLM's attention (docs/speculative.md has the A/B).

Layers it does not take (bf16 weights, tensor or pipeline parallelism, q/k norms other
than Qwen3's, Mistral's adaptive norm or Llama 4 attention scaling, another activation or
attention backend, ``VLLM_X86_FUSED_DECODE_LAYER=0``) keep vLLM's forward, and the op
table logs why. Measured: docs/overhead.md.
"""

from __future__ import annotations

import torch

from vllm_x86.runtime.ops import kernels

# The quantized kernels the fused call runs (quant/methods.py's names): INT4 with a group
# size, INT8 as group 0.
_KERNELS = ("w4a16", "w8a16")
# A fused decode step takes up to this many times the attention work ops/attention.py
# gives the plugin's decode kernel alone: above that limit vLLM's attention kernels are
# faster per layer, but the fused call also saves the layer's Python.
_WORK_FACTOR = 4
_LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def fusable(layer) -> str | None:
    """None if this decoder layer may take the fused decode call, else why not: all that
    a loaded model answers (its attention's KV cache layout is known from its first
    decode step, when `_prepare` asks)."""
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    from vllm_x86.runtime import envs

    if not envs.get_bool("VLLM_X86_FUSED_DECODE_LAYER"):
        return "VLLM_X86_FUSED_DECODE_LAYER=0"
    if not kernels.available():
        return kernels.load_error() or "the plugin's kernels are not built"
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None or not hasattr(mlp, "gate_up_proj"):
        return "not a self-attention + gated MLP layer"
    if getattr(attn, "qk_norm", False):
        return "q/k norms over the whole projection"
    if getattr(layer, "ada_rms_norm_t_cond", None) is not None:
        return "an adaptive norm (t_cond)"
    if getattr(attn, "do_llama_4_scaling", False):
        return "Llama 4 attention scaling"
    if not isinstance(getattr(mlp, "act_fn", None), SiluAndMul):
        return f"activation {type(getattr(mlp, 'act_fn', None)).__name__}, not SiLU-and-mul"
    for norm in (layer.input_layernorm, layer.post_attention_layernorm):
        if type(norm) is not RMSNorm or not norm.has_weight:
            return "the layer's norms are not weighted RMSNorms"
        if norm.variance_size_override is not None:
            return "a norm over part of the hidden size"
    rope = getattr(attn, "rotary_emb", None)
    if not isinstance(rope, RotaryEmbedding) or not hasattr(type(rope), "_x86_table"):
        return "its rotary embedding is not one the plugin's rotary kernel runs"
    if rope.head_size != attn.head_dim:
        return "rotary head size differs from the attention's"
    if layer.input_layernorm.weight.dtype != torch.bfloat16:
        return f"the model runs in {layer.input_layernorm.weight.dtype} (the INT8/INT4 kernels take bfloat16)"
    if getattr(attn, "q_norm", None) is not None or getattr(attn, "k_norm", None) is not None:
        from vllm_x86.runtime.ops.qwen3_attention import qk_norm_problem

        why = qk_norm_problem(attn)
        if why is not None:
            return why
        if attn.q_norm.weight.dtype != torch.bfloat16:
            return "q_norm/k_norm weights are not bfloat16"
    for name in _LINEARS:
        lin = layer.get_submodule(name)
        if getattr(lin, "tp_size", 1) != 1:
            return "tensor parallelism"
        if getattr(lin, "skip_bias_add", False):
            return "a linear layer returns its bias apart"
        why = _linear_problem(lin)
        if why is not None:
            return f"{name}: {why}"
    from vllm_x86.runtime.ops.attention import (
        direct_attention_problem,
        static_decode_attention_problem,
    )

    why = direct_attention_problem(attn.attn) or static_decode_attention_problem(attn.attn)
    if why is not None:
        return why
    return None


def _linear_problem(lin) -> str | None:
    """None if the fused call can run this linear layer's weights, else why not."""
    if not getattr(lin, "x86_quantized", False) or getattr(lin, "x86_kernel", None) not in _KERNELS:
        return "bf16 or another kernel's weights (the fused call runs the plugin's INT8 and INT4 kernels)"
    return None


def _linear_args(lin) -> tuple[list, int]:
    """(weight, scale, zeros, float32 bias), group size (0: INT8) of a linear layer
    `_linear_problem` accepts."""
    bias = (
        lin.bias.detach().float().contiguous() if getattr(lin, "bias", None) is not None else None
    )
    if lin.x86_kernel == "w8a16":
        return [lin.weight, lin.weight_scale, None, bias], 0
    return [lin.weight, lin.weight_scale, lin.weight_zp, bias], int(lin.x86_group)


def _prepare(layer, hidden: torch.Tensor):
    """The decode_layer arguments that do not change between steps, or why the layer
    cannot take the fused call (asked once per layer, at its first decode step: the
    attention's KV cache layout is known from then)."""
    from vllm_x86.runtime.ops.attention import _DECODE_MAX_WORK, _decode_layout
    from vllm_x86.runtime.ops.layernorm import _f32res_selected

    if hidden.dtype != torch.bfloat16:
        return f"activations in {hidden.dtype} (the INT8/INT4 kernels take bfloat16)"
    attn = layer.self_attn
    layout = _decode_layout(attn.attn, hidden)
    if layout is None:
        return "the plugin's decode attention does not take this layer"
    weights = [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
    groups = []
    for name in _LINEARS:  # accepted by fusable when the model was loaded
        args, group = _linear_args(layer.get_submodule(name))
        weights += args
        groups.append(group)
    rope = attn.rotary_emb
    # the cache in the activations' dtype, as vLLM's rotary layer converts it; once per
    # rotary module, which vLLM shares between the layers (Qwen2.5's is 4 MiB in bf16)
    caches = rope.__dict__.setdefault("_x86_decode_caches", {})
    cache = caches.get(hidden.dtype)
    if cache is None or cache.shape != rope.cos_sin_cache.shape:
        cache = caches[hidden.dtype] = rope.cos_sin_cache.to(hidden.dtype).contiguous()
    weights.append(cache)
    qk = getattr(attn, "q_norm", None) is not None  # accepted by fusable (Qwen3's)
    weights += [attn.q_norm.weight, attn.k_norm.weight] if qk else [None, None]
    ints = groups + [
        attn.num_heads,
        attn.num_kv_heads,
        attn.head_dim,
        int(rope.is_neox_style),
        layout,
        int(_f32res_selected()),
    ]
    floats = [
        layer.input_layernorm.variance_epsilon,
        layer.post_attention_layernorm.variance_epsilon,
        attn.attn.impl.scale,
        attn.q_norm.variance_epsilon if qk else 0.0,
    ]
    return weights, ints, floats, _DECODE_MAX_WORK[layout] * _WORK_FACTOR


_told: set[str] = set()


def _args(layer, hidden: torch.Tensor):
    d = layer.__dict__
    got = d.get("_x86_fused")
    if got is None:
        got = d["_x86_fused"] = _prepare(layer, hidden)
        if isinstance(got, str) and got not in _told:
            from vllm_x86.runtime.log import get_logger

            _told.add(got)
            get_logger("ops").info(
                "vllm-x86: %s decode steps keep the layer's own code: %s",
                type(layer).__name__,
                got,
            )
    return None if isinstance(got, str) else got


# Rows a step may have per sequence and still take the fused call: 1 (decode steps), or
# with speculative decoding k + 2 (a verification's k drafts and the token before them; a
# draft model's first step of a round), where the worker allows it
# (allow_rows_per_sequence).
_rows_per_sequence = 1


def allow_rows_per_sequence(rows: int) -> None:
    """Let steps of up to `rows` new tokens per sequence take the fused call (the worker
    sets k + 2 for a speculative model and its draft, VLLM_X86_FUSED_VERIFICATION)."""
    global _rows_per_sequence
    _rows_per_sequence = max(1, int(rows))


def _decode_rows(md, rows: int) -> bool:
    """Whether a step with this attention metadata and `rows` input rows is one the fused
    call takes: a causal step with no padding rows, one new token per sequence (a decode
    step) or, where allowed, a few (a speculative step's verification)."""
    n = md.num_actual_tokens
    if rows != n or not md.causal or md.dynamic_causal is not None:
        return False
    if md.max_query_len == 1:
        return md.seq_lens.shape[0] == n
    return md.max_query_len <= _rows_per_sequence


def _row_metadata(md, positions: torch.Tensor):
    """(block table, sequence lengths) with a row per input row, as the fused call reads
    them. A decode step's are vLLM's. In a step of several tokens per sequence each row is
    a decode step of its own: its sequence's block-table row, and its position + 1 tokens
    (its own key and value the last: the C++ attention writes every row's before a later
    row reads it). Built once per step and kept on the metadata."""
    if md.max_query_len == 1:
        return md.block_table, md.seq_lens
    got = getattr(md, "_x86_rows", None)
    if got is None:
        qsl = md.query_start_loc
        reqs = qsl.shape[0] - 1
        per_seq = (qsl[1:] - qsl[:-1]).long()
        table = md.block_table[:reqs].repeat_interleave(per_seq, dim=0)
        lens = (positions[: md.num_actual_tokens] + 1).to(torch.int32)
        got = (table, lens)
        md._x86_rows = got
    return got


def _small_attention(md, attn, limit: int) -> bool:
    """Whether the step's attention work (sequences x longest sequence x query heads x
    head size) in vLLM's Attention module `attn` is within the fused call's `limit`."""
    return md.num_actual_tokens * md.max_seq_len * attn.num_heads * attn.head_size <= limit


def fused_step(layer, positions: torch.Tensor, hidden: torch.Tensor, residual):
    """The layer's decode step through torch.ops.vllm_x86.decode_layer, or None where
    this step or layer does not take it."""
    from vllm.forward_context import get_forward_context

    attn = layer.self_attn.attn
    ctx = get_forward_context()
    md = ctx.attn_metadata
    if isinstance(md, dict):
        md = md.get(attn.layer_name)
    elif isinstance(md, list):
        md = md[0].get(attn.layer_name)
    if md is None or hidden.dim() != 2 or not _decode_rows(md, hidden.shape[0]):
        return None
    slot_mapping = ctx.slot_mapping.get(attn.layer_name)
    if slot_mapping is None:
        return None
    args = _args(layer, hidden)
    if args is None:
        return None
    weights, ints, floats, max_work = args
    if not _small_attention(md, attn, max_work):
        return None
    pos = positions.flatten().long()
    table, lens = _row_metadata(md, pos)
    return torch.ops.vllm_x86.decode_layer.default(
        hidden, residual, pos, weights, ints, floats, attn.kv_cache, slot_mapping, table, lens,
    )  # fmt: skip


class X86DecoderLayerMixin:
    """vLLM's Llama / Qwen2 / Qwen3 / Mistral decoder layer with a fused decode step
    (module docstring)."""

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        residual: torch.Tensor | None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Mistral's layer takes t_cond (None unless the layer has its adaptive norm,
        # which fusable refuses)
        if not torch.compiler.is_compiling() and all(v is None for v in kwargs.values()):
            out = fused_step(self, positions, hidden_states, residual)
            if out is not None:
                return out
        return super().forward(positions, hidden_states, residual, **kwargs)


def all_layers_fusable(model) -> str | None:
    """The op table's check for a decoder stack (Llama, Qwen2, Qwen3, Mistral): None if every
    decoder layer takes the fused decode call, else why not."""
    layers = getattr(model, "layers", None)
    if layers is None or len(layers) == 0:
        return "no decoder layers"
    for layer in layers:
        why = fusable(layer) if hasattr(layer, "self_attn") else "a layer of another rank"
        if why is not None:
            return why
    return None


class X86FusedDecodeModelMixin:
    """vLLM's Llama / Qwen2 / Qwen3 / Mistral decoder stack, whose decode steps run each layer as one fused
    call from one Python loop (module docstring); other steps run the stack's own code,
    compiled where the model is."""

    def __call__(
        self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs
    ):
        if (
            not kwargs
            and intermediate_tensors is None
            and not getattr(self, "aux_hidden_state_layers", ())
        ):
            steps = _decode_step(self, positions)
            if steps is not None:
                return _fused_forward(self, input_ids, positions, inputs_embeds, *steps)
        return super().__call__(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)


def _stack(model):
    """(attention layer name, attention module, weights, ints, floats) for every layer,
    once every layer's fused call is prepared; None while one is not (or cannot be)."""
    got = model.__dict__.get("_x86_fused_stack")
    if got is not None:
        return got
    stack, limits = [], []
    for layer in model.layers:
        args = _args(layer, layer.input_layernorm.weight)
        if args is None:
            return None
        attn = layer.self_attn.attn
        stack.append((attn.layer_name, attn, *args[:3]))
        limits.append(args[3])
    model.__dict__["_x86_fused_stack"] = stack
    model.__dict__["_x86_fused_limit"] = min(limits)
    # decode_stack's arguments: every layer's weights, ints and floats, one after another
    model.__dict__["_x86_fused_flat"] = tuple(
        [x for _, _, *args in stack for x in args[i]] for i in range(3)
    )
    return stack


def _decode_step(model, positions):
    """(stack, metadata by layer, slot mappings by layer, whether every layer has the
    same metadata and slot mapping) for a decode step the fused layers take (no padding
    rows, little enough attention work: fused_step's test, for every layer at once),
    else None."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return None
    ctx = get_forward_context()
    mds = ctx.attn_metadata
    if isinstance(mds, list):
        mds = mds[0]
    if not isinstance(mds, dict):
        return None
    md = mds.get(model.layers[0].self_attn.attn.layer_name)
    if md is None or positions is None or positions.dim() != 1:
        return None  # no metadata (a dummy run), or M-RoPE positions
    if not _decode_rows(md, positions.shape[0]):
        return None
    stack = _stack(model)  # prepared at the first decode step (the KV cache layout is known)
    if stack is None or not _small_attention(md, stack[0][1], model.__dict__["_x86_fused_limit"]):
        return None
    slots = ctx.slot_mapping
    if slots is None:
        return None  # a step that writes no KV cache: the layers' own code
    slot = slots.get(stack[0][0])
    uniform = True
    for name, *_ in stack:
        other, its = mds.get(name), slots.get(name)
        if other is not md and (other is None or not _decode_rows(other, positions.shape[0])):
            return None
        if its is None:
            return None
        uniform = uniform and other is md and its is slot
    return stack, mds, slots, uniform


def _fused_forward(model, input_ids, positions, inputs_embeds, stack, mds, slots, uniform):
    """The stack's forward (LlamaModel's) for a decode step on one rank, no auxiliary hidden
    states: the embedding, the layers' fused calls (all in one decode_stack call where
    they share the step's metadata and slot mapping, as one KV cache group does), the
    final norm."""
    hidden = inputs_embeds if inputs_embeds is not None else model.embed_input_ids(input_ids)
    pos = positions if positions.dtype == torch.long else positions.long()
    if uniform:
        name = stack[0][0]
        table, lens = _row_metadata(mds[name], pos)
        hidden, residual = torch.ops.vllm_x86.decode_stack.default(
            hidden, pos, *model.__dict__["_x86_fused_flat"],
            [attn.kv_cache for _, attn, *_ in stack], slots[name], table, lens,
        )  # fmt: skip
    else:
        residual = None
        op = torch.ops.vllm_x86.decode_layer.default
        for name, attn, weights, ints, floats in stack:
            table, lens = _row_metadata(mds[name], pos)
            hidden, residual = op(
                hidden, residual, pos, weights, ints, floats, attn.kv_cache, slots[name],
                table, lens,
            )  # fmt: skip
    hidden, _ = model.norm(hidden, residual)
    return hidden


def reference_decode_layer(
    hidden, residual, positions, weights, ints, floats, kv_cache, slot_mapping, block_table,
    seq_lens,
):  # fmt: skip
    """torch.ops.vllm_x86.decode_layer's reference: the plugin's ops of the eager path,
    called one by one (the kernels' own references are in ops/reference.py)."""
    ops = torch.ops.vllm_x86
    nq, nk, hd, neox, layout, f32res = ints[4:]

    def linear(x, i, group):
        w, s, z, b = weights[i : i + 4]
        if group == 0:
            return ops.int8_w8a16_gemm(x, w, s, b)
        return ops.int4_w4a16_gemm(x, w, s, z, group, b)

    if residual is None:
        x = torch.empty_like(hidden)
        ops.rms_norm(x, hidden, weights[0], floats[0])
        res = hidden if f32res else hidden.clone()
    else:
        x = hidden.clone()
        if f32res:
            res = residual.clone() if residual.dtype == torch.float32 else residual.float()
            ops.fused_add_rms_norm_f32res(x, res, weights[0], floats[0])
        else:
            res = residual.clone()
            ops.fused_add_rms_norm(x, res, weights[0], floats[0])
    qkv = linear(x, 2, ints[0])
    if weights[19] is not None:  # Qwen3's q/k norms, as ops/qwen3_attention.py runs them
        q, k, v = (qkv.new_empty((qkv.shape[0], n * hd)) for n in (nq, nk, nk))
        ops.split_norm_rope_neox(
            q, k, v, qkv, positions, weights[19], weights[20], weights[18], nq, nk, hd, floats[3]
        )
    else:
        q, k, v = qkv.split([nq * hd, nk * hd, nk * hd], dim=-1)
        ops.rotary_embedding(positions, q, k, hd, weights[18], bool(neox))
    attn = torch.empty((hidden.shape[0], nq * hd), dtype=hidden.dtype)
    ops.decode_attention(
        attn, q, k, v, kv_cache, slot_mapping, block_table, seq_lens, floats[2], layout
    )
    o = linear(attn, 6, ints[1])
    if f32res:
        res = res if res.dtype == torch.float32 else res.float()
        ops.fused_add_rms_norm_f32res(o, res, weights[1], floats[1])
    else:
        ops.fused_add_rms_norm(o, res, weights[1], floats[1])
    gate_up = linear(o, 10, ints[2])
    act = torch.empty((gate_up.shape[0], gate_up.shape[1] // 2), dtype=gate_up.dtype)
    ops.silu_and_mul(act, gate_up)
    return linear(act, 14, ints[3]), res


def reference_decode_stack(
    hidden, positions, weights, ints, floats, kv_caches, slot_mapping, block_table, seq_lens
):
    """torch.ops.vllm_x86.decode_stack's reference: reference_decode_layer for each layer
    in turn (21 weights, 10 ints and 4 floats a layer), the first without a residual."""
    residual = None
    for i, kv_cache in enumerate(kv_caches):
        hidden, residual = reference_decode_layer(
            hidden, residual, positions, weights[21 * i : 21 * (i + 1)],
            ints[10 * i : 10 * (i + 1)], floats[4 * i : 4 * (i + 1)], kv_cache, slot_mapping,
            block_table, seq_lens,
        )  # fmt: skip
    return hidden, residual
