"""Pure-torch references of every kernel, with the kernels' signatures.

Each function writes its result where the kernel would (out-parameters, in-place
updates) and computes in float32 with the rounding points of vLLM's own reference
(CustomOp.forward_native / the vLLM IR native implementation): where that reference
rounds an intermediate to the model's dtype, so does this one. Tests compare each
kernel with its reference (tests/unit/test_ops.py); the op table falls back to these
when a kernel cannot run (and says so).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _rms(x: torch.Tensor, weight: torch.Tensor | None, epsilon: float) -> torch.Tensor:
    orig = x.dtype
    xf = x.to(torch.float32)
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + epsilon)
    if weight is not None:
        y = y.to(weight.dtype) * weight
    return y.to(orig)


def rms_norm(
    out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor | None, epsilon: float
) -> None:
    out.copy_(_rms(input, weight, epsilon))


def fused_add_rms_norm(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, epsilon: float
) -> None:
    orig = input.dtype
    s = input.to(torch.float32) + residual.to(torch.float32)
    residual.copy_(s.to(orig))
    y = s * torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + epsilon)
    if weight is not None:
        y = y.to(weight.dtype) * weight
    input.copy_(y.to(orig))


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    rot = cos_sin_cache.shape[-1]
    q, k = RotaryEmbedding.forward_static(
        positions, query, key, head_size, rot, cos_sin_cache, is_neox
    )
    query.copy_(q.view_as(query))
    if key is not None:
        key.copy_(k.view_as(key))


def _act_and_mul(out: torch.Tensor, input: torch.Tensor, act) -> None:
    d = input.shape[-1] // 2
    out.copy_(act(input[..., :d]) * input[..., d:])


def silu_and_mul(out: torch.Tensor, input: torch.Tensor) -> None:
    _act_and_mul(out, input, F.silu)


def gelu_and_mul(out: torch.Tensor, input: torch.Tensor) -> None:
    _act_and_mul(out, input, F.gelu)


def gelu_tanh_and_mul(out: torch.Tensor, input: torch.Tensor) -> None:
    _act_and_mul(out, input, lambda x: F.gelu(x, approximate="tanh"))


def split_norm_rope_neox(
    q_out: torch.Tensor,
    k_out: torch.Tensor,
    v_out: torch.Tensor,
    qkv: torch.Tensor,
    positions: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    epsilon: float,
) -> None:
    """What vLLM's Qwen3 attention does between the QKV projection and attention:
    split, per-head RMSNorm of q and k (q_norm, k_norm), neox rotary embedding."""
    t = qkv.shape[0]
    q, k, v = qkv.split(
        [num_heads * head_size, num_kv_heads * head_size, num_kv_heads * head_size], dim=-1
    )
    qn = _rms(q.reshape(t, num_heads, head_size), q_weight, epsilon).reshape(t, -1)
    kn = _rms(k.reshape(t, num_kv_heads, head_size), k_weight, epsilon).reshape(t, -1)
    rotary_embedding(positions, qn, kn, head_size, cos_sin_cache, True)
    q_out.copy_(qn.view_as(q_out))
    k_out.copy_(kn.view_as(k_out))
    v_out.copy_(v.reshape(v_out.shape))


def _unblock(t: torch.Tensor, nb: int, k: int) -> torch.Tensor:
    """[nb, K/64, 16 quads, 64] B-tile blocks (quant/methods._vnni_blocks) -> [N, K]."""
    return t.reshape(nb, k // 64, 16, 16, 4).permute(0, 3, 1, 2, 4).reshape(nb * 16, k)


def int8_w8a16_gemm(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [M, K] @ (q * scale)^T (+ bias) in float32, rounded to x's dtype; `w` is the
    packed [N/16, 16 K] int8 weight of quant/methods.pack_int8_w8a16, unpacked here.
    The kernel rounds the activations to 16-bit integers per token; the reference does
    not (the tests bound the difference)."""
    nb, k16 = w.shape
    k = k16 // 16
    q = _unblock(w, nb, k)
    out = x.float() @ (q.float() * scale.float()[:, None]).t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


def int4_w4a16_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """x [M, K] @ ((codes - zero) * scale)^T (+ bias) in float32, rounded to x's dtype;
    `w`, `scale`, `zeros` as quant/methods.pack_int4_w4a16 packs them, unpacked here.
    As for int8_w8a16_gemm, the kernel's 16-bit activations are not modelled."""
    nb, k8 = w.shape
    k = k8 // 8
    b = w.view(nb, k // 64, 8, 64)
    q = _unblock(torch.cat([b & 15, b >> 4], dim=2), nb, k)  # rows r, r + 8 per byte
    g = k // group_size
    s = scale.view(nb, g, 16).permute(0, 2, 1).reshape(nb * 16, g)
    z = zeros.view(nb, g, 16).permute(0, 2, 1).reshape(nb * 16, g)
    wd = (q.float().view(-1, g, group_size) - z.float()[..., None]) * s.float()[..., None]
    out = x.float() @ wd.view(nb * 16, k).t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


def reshape_and_cache_diffkv(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write each token's K and V into a packed DiffKV paged cache (the layout of vLLM's
    ``triton_reshape_and_cache_flash_diffkv``): `kv_cache` is ``[num_blocks,
    block_size, num_kv_heads, head_size + head_size_v]``, K in the first ``head_size``
    channels, V after; slot -1 (padding) is skipped."""
    block_size = kv_cache.shape[1]
    hk = key.shape[-1]
    n = slot_mapping.shape[0]
    slots = slot_mapping[:n].to(torch.long)
    keep = slots >= 0
    slots = slots[keep]
    blocks, offs = slots // block_size, slots % block_size
    kv_cache[blocks, offs, :, :hk] = key[:n][keep].to(kv_cache.dtype)
    kv_cache[blocks, offs, :, hk : hk + value.shape[-1]] = value[:n][keep].to(kv_cache.dtype)


def paged_attention_diffkv(
    out: torch.Tensor,
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    head_size_v: int,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    window_left: int = -1,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> None:
    """Causal decoder attention over a packed DiffKV paged cache (the semantics of
    vLLM's ``unified_attention_diffkv``), in float32.

    `query` ``[num_tokens, num_heads, head_size]``, `kv_cache` ``[num_blocks,
    block_size, num_kv_heads, head_size + head_size_v]``, `out` ``[num_tokens,
    num_heads, head_size_v]``. The queries of request i are the last ones of its
    ``seq_lens[i]`` tokens. A key is visible when it is not after the query and, with
    ``window_left >= 0``, at most ``window_left`` positions before it. ``softcap > 0``
    caps scores with ``softcap * tanh(s / softcap)``; `sinks` (one logit per head)
    join the softmax's denominator only."""
    num_blocks, block_size, num_kv_heads, _ = kv_cache.shape
    hk = query.shape[-1]
    num_heads = query.shape[1]
    group = num_heads // num_kv_heads
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        q0, q1 = starts[i], starts[i + 1]
        if q1 <= q0:
            continue
        n_blocks = -(-seq_len // block_size)
        kv = kv_cache[block_table[i, :n_blocks].to(torch.long)]
        kv = kv.reshape(n_blocks * block_size, num_kv_heads, -1)[:seq_len].to(torch.float32)
        k = kv[..., :hk].repeat_interleave(group, dim=1)  # [S, H, hk]
        v = kv[..., hk : hk + head_size_v].repeat_interleave(group, dim=1)
        q = query[q0:q1].to(torch.float32)  # [Q, H, hk]
        s = torch.einsum("qhd,khd->hqk", q, k) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        qpos = torch.arange(seq_len - (q1 - q0), seq_len)[:, None]
        kpos = torch.arange(seq_len)[None, :]
        visible = kpos <= qpos
        if window_left >= 0:
            visible &= kpos >= qpos - window_left
        s = s.masked_fill(~visible, float("-inf"))
        if sinks is not None:
            sink = sinks.to(torch.float32)[:, None, None].expand(-1, q1 - q0, 1)
            p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
        else:
            p = torch.softmax(s, dim=-1)
        out[q0:q1] = torch.einsum("hqk,khd->qhd", p, v).to(out.dtype)
