"""Gated DeltaNet linear attention on CPU where vLLM has no kernel for it: Qwen3-Next /
Qwen3.5 (and Qwen4-Exp's linear layers) in float32, OLMo-Hybrid in every dtype.

vLLM's CPU path for ``QwenGatedDeltaNetAttention`` (``forward_cpu`` ->
``vllm.cpu_gdn_attention_core``, ``model_executor/layers/mamba/ops/cpu/
gdn_attention.py``) runs bf16 only: it asserts ``mixed_qkv.dtype == torch.bfloat16``
("CPU GDN attention requires BF16"), and its C++ kernels (``fused_gdn_gating_cpu``,
``chunk_gated_delta_rule_cpu``, ``fused_sigmoid_gating_delta_rule_update_cpu``)
reject float32 ("Unsupported floating data type"). A float32 model therefore stops at
its first linear-attention layer.

The plugin's layer (a ``PluggableLayer`` out-of-tree replacement, ops/registry.py)
keeps vLLM's path for bf16 and, for any other dtype, runs the same steps with float32
math: vLLM's input projections and the split of its ``prepare_gdn_attention_core_
inputs``; vLLM's generic core op ``vllm.qwen_gdn_attention_core`` (opaque to
torch.compile, it reads the forward context), which calls the layer's
``_forward_core``, here the plugin's; inside it vLLM's pure-torch causal conv1d
(``causal_conv1d_fn_cpu``, the one vLLM itself uses on CPUs without AVX-512 BF16)
and the plugin's gates and gated delta rule (ops/reference.py: no C++ kernel, the
float32 reference is the implementation: a per-token recurrence, correct but slow on
long prompts); then vLLM's gated RMSNorm and output projection. Speculative decoding
is not supported on this path.

OLMo-Hybrid's layer (``OlmoHybridGatedDeltaNetAttention``, ``olmo_gdn_linear_attn.py``)
has no CPU path in vLLM at all: its ``__init__`` calls ``set_triton_allocator`` (there
is no Triton CPU backend here, so vLLM's Triton placeholder has no ``set_allocator``)
and its ``_forward_core`` runs FLA's Triton kernels. The plugin's subclass builds the
layer with that one call skipped (patches.no_triton_allocator) and replaces
``_forward_core`` with the same core as above (OLMo's gates double beta with
``linear_allow_neg_eigval``; its q/k come already expanded to the value heads); the
projections, vLLM's custom op around the whole layer and the gated norm are vLLM's.
It also hands vLLM's fused conv1d weight loader the q/k/v shard id where vLLM 0.32's
weight mapper now puts it (see X86OlmoHybridGatedDeltaNetMixin.__init__).
"""

from __future__ import annotations

import torch

from vllm_x86.runtime.log import get_logger
from vllm_x86.runtime.ops import reference

logger = get_logger("ops")
_said = False


def _say_once(layer) -> None:
    global _said
    if not _said:
        _said = True
        logger.info(
            "vllm-x86: Gated DeltaNet (%s) runs the plugin's float32 torch implementation "
            "(ops/gdn.py): vLLM has no CPU kernel for it in this dtype",
            type(layer).__name__,
        )


def gdn_core(
    layer,
    mixed_qkv: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    core_attn_out: torch.Tensor,
) -> None:
    """conv1d + gated delta rule for one GDN layer, non-speculative batches (decodes
    first, then prefills, as vLLM's GDN metadata orders them); writes core_attn_out
    [tokens, Hv, V] and updates the layer's conv and recurrent states in place."""
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
    from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import (
        causal_conv1d_fn_cpu,
    )

    metadata = get_forward_context().attn_metadata
    if not isinstance(metadata, dict) or metadata.get(layer.prefix) is None:
        return  # profiling run: no state, nothing to compute
    m = metadata[layer.prefix]
    t = m.num_actual_tokens
    if t == 0:
        return
    if m.spec_sequence_masks is not None or m.num_accepted_tokens is not None:
        raise NotImplementedError(
            "vllm-x86: the plugin's Gated DeltaNet does not support speculative decoding"
        )
    _say_once(layer)
    n_dec, n_pre = m.num_decodes, m.num_prefills
    n = n_dec + n_pre
    qsl = m.non_spec_query_start_loc[: n + 1]
    slots = m.non_spec_state_indices_tensor[:n]
    has_initial = torch.ones(n, dtype=torch.bool)
    if n_pre and m.has_initial_state is not None:
        has_initial[n_dec:] = m.has_initial_state[n_dec:n].cpu()

    conv_state = layer.kv_cache[0]
    if not is_conv_state_dim_first():
        conv_state = conv_state.transpose(-1, -2)  # (slots, dim, width - 1)
    # vLLM packs bf16 conv weights for its C++ conv kernel after loading (layers/
    # utils.py dispatch_cpu_unquantized_gemm) and keeps the plain (dim, width) copy
    w = getattr(layer.conv1d, "_cpu_unpacked_conv_weight", None)
    if w is None:
        w = layer.conv1d.weight
        w = w.view(w.size(0), w.size(-1))
    x = causal_conv1d_fn_cpu(
        x=mixed_qkv[:t].transpose(0, 1),
        weight=w,
        bias=layer.conv1d.bias,
        conv_states=conv_state,
        query_start_loc=qsl,
        cache_indices=slots,
        has_initial_state=has_initial,
        activation=layer.activation,
    ).transpose(0, 1)

    query, key, value = layer.rearrange_mixed_qkv(x)
    g, beta = reference.fused_gdn_gating(
        layer.A_log, a[:t], b[:t], layer.dt_bias, getattr(layer, "allow_neg_eigval", False)
    )
    ssm = layer.kv_cache[1]
    n_slots, hv, dv, dk = ssm.shape
    # the layout vLLM's CPU kernels give the cache: [slots, Hv, K, V] in its memory
    ssm = ssm.view(n_slots, hv, dk, dv)
    fresh = slots[~has_initial]
    if fresh.numel():
        ssm[fresh] = 0
    out = reference.gated_delta_rule(query, key, value, g, beta, ssm, qsl, slots, True)
    core_attn_out[:t] = out[0].to(core_attn_out.dtype)


class X86GatedDeltaNetMixin:
    """Mixed into vLLM's QwenGatedDeltaNetAttention (ops/registry.py, a ``layer``
    row): float32 (any dtype but bf16) goes through gdn_core."""

    def forward_cpu(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if hidden_states.dtype == torch.bfloat16:
            return super().forward_cpu(hidden_states)  # vLLM's CPU kernels
        from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
            _encode_layer_name,
        )

        # the projections and their split as vLLM's forward_cpu does them
        # (qwen_gdn_linear_attn.py:1099); prepare_gdn_attention_core_inputs would do the
        # same under a nested torch.compile(fullgraph=True)
        assert not hasattr(self, "in_proj_qkv"), "lora isn't supported on CPU."
        num_tokens = hidden_states.size(0)
        mixed_qkvz, _ = self.in_proj_qkvz(hidden_states)
        ba, _ = self.in_proj_ba(hidden_states)
        if self.gqa_interleaved_layout:  # Qwen3-Next
            query, key, value, z, b, a = self.fix_query_key_value_ordering(mixed_qkvz, ba)
            mixed_qkv = torch.cat([t.reshape(num_tokens, -1) for t in (query, key, value)], -1)
        else:  # Qwen3.5: [q, k, v, z] and [b, a]
            qkv_size = (self.key_dim * 2 + self.value_dim) // self.tp_size
            z_size = self.value_dim // self.tp_size
            mixed_qkv, z = mixed_qkvz.split([qkv_size, z_size], dim=-1)
            z = z.reshape(num_tokens, -1, self.head_v_dim)
            b, a = ba.chunk(2, dim=-1)
        core_attn_out = torch.zeros(
            (num_tokens, self.num_v_heads // self.tp_size, self.head_v_dim),
            dtype=hidden_states.dtype,
            device=hidden_states.device,
        )
        # vLLM's generic GDN core op: looks the layer up and calls its _forward_core
        torch.ops.vllm.qwen_gdn_attention_core(
            mixed_qkv,
            b.contiguous(),
            a.contiguous(),
            core_attn_out,
            layer_name=_encode_layer_name(self.prefix),
        )
        return self._output_projection(core_attn_out, z)

    def _forward_core(self, mixed_qkv, b, a, core_attn_out) -> None:
        gdn_core(self, mixed_qkv, b, a, core_attn_out)


class X86OlmoHybridGatedDeltaNetMixin:
    """Mixed into vLLM's OlmoHybridGatedDeltaNetAttention (ops/registry.py, a
    ``layer`` row): built without the Triton allocator, core by gdn_core."""

    def __init__(self, *args, **kwargs) -> None:
        from vllm_x86.runtime.patches import no_triton_allocator

        with no_triton_allocator("vllm.model_executor.layers.mamba.gdn.olmo_gdn_linear_attn"):
            super().__init__(*args, **kwargs)
        # vLLM 0.32's fused conv1d loader (olmo_gdn_linear_attn.py:515) takes the
        # q/k/v shard as an argument, but vLLM's AutoWeightsLoader now passes the shard
        # of a stacked weight as the tensor's ``shard_id`` attribute (WeightsMapper.
        # apply, models/utils.py:163) and calls ``weight_loader(param, data)``: every
        # OLMo-Hybrid checkpoint then stops with "list indices must be integers or
        # slices, not NoneType", on any platform. The wrapper hands vLLM's loader the
        # shard from where the loader now puts it.
        loader = self.conv1d.weight.weight_loader

        def weight_loader(param, loaded_weight, loaded_shard_id=None):
            if loaded_shard_id is None:
                loaded_shard_id = getattr(loaded_weight, "shard_id", None)
            loader(param, loaded_weight, loaded_shard_id)

        self.conv1d.weight.weight_loader = weight_loader

    def _forward_core(self, mixed_qkv, b, a, core_attn_out) -> None:
        gdn_core(self, mixed_qkv, b, a, core_attn_out)
