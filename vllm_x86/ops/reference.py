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


def sigmoid_topk(
    router_logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    e_score_correction_bias: torch.Tensor | None,
    routed_scaling_factor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid MoE routing (ops/moe_routing.sigmoid_topk), one token at a time in
    float32 as transformers' LagunaTopKRouter / MiniMaxM2TopKRouter define it: the
    experts with the largest sigmoid(logit) + bias (a stable sort: equal values keep
    the lower id first), weighted by their sigmoid(logit) without the bias, divided by
    the weights' sum when `renormalize`, times `routed_scaling_factor`."""
    weights, ids = [], []
    for logits in router_logits.float():
        scores = 1.0 / (1.0 + torch.exp(-logits))
        choice = scores if e_score_correction_bias is None else scores + e_score_correction_bias
        order = torch.sort(choice.float(), descending=True, stable=True).indices[:top_k]
        w = scores[order]
        if renormalize:
            w = w / w.sum()
        weights.append(w * routed_scaling_factor)
        ids.append(order)
    return torch.stack(weights), torch.stack(ids).to(torch.int32)
