"""Every op of the ``torch.ops.vllm_x86`` namespace: its schema and its fake (meta)
implementation, declared here and nowhere else.

Importing this module defines the namespace (one ``torch.library.Library`` of kind DEF,
so a second definition of it anywhere, C++ ``TORCH_LIBRARY`` included, fails at load)
with every op's schema and fake. The implementations register on their own, for the CPU
dispatch key only:

- C++ kernels: ``TORCH_LIBRARY_IMPL(vllm_x86, CPU, m)`` in csrc/bindings.cpp, loaded
  with the library (ops/kernels.py);
- PyTorch code: ``torch.library.impl(..., "CPU")`` in the module named in ``impl``.

The fakes let torch.compile (Dynamo, FakeTensor) trace through the ops: the ops that
write into their arguments and return nothing have nothing to compute; the others
return an empty tensor of the output's shape. tests/unit/test_op_table.py checks that
every op of the namespace is declared here, once, with a fake and an implementation,
and that no schema or fake is declared anywhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

NAMESPACE = "vllm_x86"


@dataclass(frozen=True)
class OpSchema:
    name: str
    schema: str  # arguments and result, vLLM's `_C` order where vLLM has the op
    fake: Callable
    impl: str  # where the CPU implementation registers: "csrc" or "module:function"


def _nothing(*args, **kwargs) -> None:
    """Fake of an op that writes into its arguments and returns nothing."""
    return None


def _int8_gemm(x, w, scale, bias):
    return x.new_empty((x.shape[0], w.shape[0] * 16))  # N: 16 channels per packed row


def _int4_gemm(x, w, scale, zeros, group_size, bias):
    return x.new_empty((x.shape[0], w.shape[0] * 16))


def _moe_experts(x, topk_weights, topk_ids, layer_key):
    return torch.empty_like(x)  # [M, H]: the experts' output has the input's shape


def _like_query(query, key, value, layer_name):
    return query.new_empty(query.shape)


def _embedding_rows(ids, weight, table):
    return weight.new_empty((*ids.shape, weight.shape[1]))


def _layer_outputs(hidden, residual, positions, weights, ints, *rest):
    """(the MLP's output, the residual stream): float32 where the call keeps the
    residual stream so (ints[9])."""
    dtype = torch.float32 if ints[9] else (hidden if residual is None else residual).dtype
    return hidden.new_empty(hidden.shape), hidden.new_empty(hidden.shape, dtype=dtype)


def _stack_outputs(hidden, positions, weights, ints, *rest):
    """(the last layer's MLP output, the residual stream): float32 where the layers keep
    the residual stream so (ints[9])."""
    dtype = torch.float32 if ints[9] else hidden.dtype
    return hidden.new_empty(hidden.shape), hidden.new_empty(hidden.shape, dtype=dtype)


def _refined_logits(logits, hidden, weight, bias, rel):
    return logits.new_empty(logits.shape, dtype=torch.float32)


_CSRC = "csrc"  # csrc/bindings.cpp, TORCH_LIBRARY_IMPL

OPS: tuple[OpSchema, ...] = (
    # elementwise kernels of the op table's customop, ir and module rows (csrc/ops.cpp)
    OpSchema(
        "rms_norm",
        "(Tensor! out, Tensor input, Tensor? weight, float epsilon) -> ()",
        _nothing,
        _CSRC,
    ),
    OpSchema(
        "fused_add_rms_norm",
        "(Tensor! input, Tensor! residual, Tensor? weight, float epsilon) -> ()",
        _nothing,
        _CSRC,
    ),
    OpSchema(
        "fused_add_rms_norm_f32res",
        "(Tensor! input, Tensor! residual, Tensor? weight, float epsilon) -> ()",
        _nothing,
        _CSRC,
    ),
    OpSchema(
        "rotary_embedding",
        "(Tensor positions, Tensor! query, Tensor!? key, int head_size, Tensor cos_sin_cache, "
        "bool is_neox) -> ()",
        _nothing,
        _CSRC,
    ),
    OpSchema("silu_and_mul", "(Tensor! out, Tensor input) -> ()", _nothing, _CSRC),
    OpSchema("gelu_and_mul", "(Tensor! out, Tensor input) -> ()", _nothing, _CSRC),
    OpSchema("gelu_tanh_and_mul", "(Tensor! out, Tensor input) -> ()", _nothing, _CSRC),
    OpSchema(
        "split_norm_rope_neox",
        "(Tensor! q_out, Tensor! k_out, Tensor! v_out, Tensor qkv, Tensor positions, "
        "Tensor q_weight, Tensor k_weight, Tensor cos_sin_cache, int num_heads, "
        "int num_kv_heads, int head_size, float epsilon) -> ()",
        _nothing,
        _CSRC,
    ),
    # the best logits of a bf16/fp16 LM head recomputed in float32 (ops/logits.py)
    OpSchema(
        "refine_top_logits",
        "(Tensor logits, Tensor hidden, Tensor weight, Tensor? bias, float rel) -> Tensor",
        _refined_logits,
        _CSRC,
    ),
    # vLLM CPU's decode attention in one call (ops/attention.py): the KV-cache write and
    # attention of one query token per sequence, on vLLM's paged cache layout
    OpSchema(
        "decode_attention",
        "(Tensor! out, Tensor query, Tensor key, Tensor value, Tensor! kv_cache, "
        "Tensor slot_mapping, Tensor block_table, Tensor seq_lens, float scale, "
        "int layout) -> ()",
        _nothing,
        _CSRC,
    ),
    # the quantized GEMMs of the op table's quant rows (csrc/amx_gemm.cpp, vnni_gemm.cpp)
    OpSchema(
        "int8_w8a16_gemm",
        "(Tensor x, Tensor w, Tensor scale, Tensor? bias) -> Tensor",
        _int8_gemm,
        _CSRC,
    ),
    OpSchema(
        "int4_w4a16_gemm",
        "(Tensor x, Tensor w, Tensor scale, Tensor zeros, int group_size, Tensor? bias) -> Tensor",
        _int4_gemm,
        _CSRC,
    ),
    # a decode step of a whole decoder layer in one call (ops/decoder_layer.py)
    OpSchema(
        "decode_layer",
        "(Tensor hidden, Tensor? residual, Tensor positions, Tensor?[] weights, int[] ints, "
        "float[] floats, Tensor! kv_cache, Tensor slot_mapping, Tensor block_table, "
        "Tensor seq_lens) -> (Tensor, Tensor)",
        _layer_outputs,
        _CSRC,
    ),
    # ... and of a stack of them, layer after layer, in one call (ops/decoder_layer.py)
    OpSchema(
        "decode_stack",
        "(Tensor hidden, Tensor positions, Tensor?[] weights, int[] ints, float[] floats, "
        "Tensor(a!)[] kv_caches, Tensor slot_mapping, Tensor block_table, Tensor seq_lens) "
        "-> (Tensor, Tensor)",
        _stack_outputs,
        _CSRC,
    ),
    # the quantized MoE experts as one op, opaque to Dynamo (quant/moe.py)
    OpSchema(
        "quant_moe_experts",
        "(Tensor x, Tensor topk_weights, Tensor topk_ids, str layer_key) -> Tensor",
        _moe_experts,
        "vllm_x86.runtime.quant.moe:quant_moe_experts",
    ),
    # vLLM's Attention layer in one call per layer (ops/attention.py); the output has the
    # query's shape (the op takes only layers whose value and key heads are the same size)
    OpSchema(
        "attention",
        "(Tensor query, Tensor key, Tensor value, str layer_name) -> Tensor",
        _like_query,
        "vllm_x86.runtime.ops.attention:attention",
    ),
    # the input embedding read by row from the checkpoint file (ops/file_embedding.py)
    OpSchema(
        "file_embedding",
        "(Tensor ids, Tensor weight, str table) -> Tensor",
        _embedding_rows,
        "vllm_x86.runtime.ops.file_embedding:file_embedding",
    ),
    # Mamba-1 (ops/mamba.py): vLLM's _C.selective_scan_fwd schema and contract
    OpSchema(
        "selective_scan_fwd",
        "(Tensor u, Tensor(a!) delta, Tensor A, Tensor B, Tensor C, "
        "Tensor? D_, Tensor(b!)? z_, Tensor? delta_bias_, bool delta_softplus, "
        "Tensor? query_start_loc, Tensor? cache_indices, Tensor? has_initial_state, "
        "Tensor(c!) ssm_states, int null_block_id, int block_size=1024, "
        "Tensor? block_idx_first_scheduled_token=None, "
        "Tensor? block_idx_last_scheduled_token=None, Tensor? initial_state_idx=None, "
        "Tensor? cu_chunk_seqlen=None, Tensor? last_chunk_indices=None) -> ()",
        _nothing,
        "vllm_x86.runtime.ops.mamba:selective_scan_fwd",
    ),
    OpSchema(
        "selective_state_update",
        "(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, "
        "Tensor? D, Tensor? z, Tensor? dt_bias, bool dt_softplus, "
        "Tensor? state_batch_indices, Tensor? dst_state_batch_indices, "
        "int null_block_id, Tensor(b!) out) -> ()",
        _nothing,
        "vllm_x86.runtime.ops.mamba:selective_state_update",
    ),
)

BY_NAME: dict[str, OpSchema] = {op.name: op for op in OPS}

_LIB = torch.library.Library(NAMESPACE, "DEF")  # kept: dropping it unregisters the ops
for _op in OPS:
    _LIB.define(_op.name + _op.schema)
    torch.library.register_fake(f"{NAMESPACE}::{_op.name}", _op.fake, lib=_LIB)
