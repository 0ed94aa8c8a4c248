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


def fused_gdn_gating(
    A_log: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dt_bias: torch.Tensor,
    allow_neg_eigval: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet gates, as vLLM's ``fused_gdn_gating`` (Triton),
    ``_C.fused_gdn_gating_cpu`` (bf16 only) and OLMo-Hybrid's
    ``fused_olmo_hybrid_gdn_gating`` (Triton) compute them: the log decay
    ``g = -exp(A_log) * softplus(a + dt_bias)`` and the write strength
    ``beta = sigmoid(b)``, times 2 with ``allow_neg_eigval`` (OLMo-Hybrid), both
    float32, shaped like ``a`` [tokens, heads]."""
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())
    beta = torch.sigmoid(b.float())
    return g, beta * 2.0 if allow_neg_eigval else beta


def _l2norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state_indices: torch.Tensor,
    use_qk_l2norm_in_kernel: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """The gated delta rule over packed variable-length sequences, token by token, in
    float32: what vLLM's ``chunk_gated_delta_rule_cpu`` (prefill) and
    ``fused_sigmoid_gating_delta_rule_update_cpu`` (decode, one token per sequence)
    compute, and transformers' ``torch_recurrent_gated_delta_rule`` (its
    ``torch_chunk_gated_delta_rule`` is the same recurrence regrouped in chunks).

    query, key [1, T, Hk, K]; value [1, T, Hv, V]; g, beta [T, Hv] (or [1, T, Hv]);
    Hv a multiple of Hk (each key head serves Hv/Hk value heads, repeat_interleave
    order). initial_state [slots, Hv, K, V]: sequence i starts from
    ``initial_state[initial_state_indices[i]]`` and its final state is written back
    there (in the state's dtype). cu_seqlens [N + 1] bounds the sequences in T.
    Per token, with q, k L2-normalised (eps as FLA and transformers) and q scaled by
    K^-0.5: S = S * exp(g); S += k (x) beta (v - S^T k); out = S^T q.
    Returns [1, T, Hv, V] in value's dtype."""
    _, t, hk, dk = key.shape
    hv, dv = value.shape[-2:]
    q = query.reshape(t, hk, dk).float()
    k = key.reshape(t, hk, dk).float()
    v = value.reshape(t, hv, dv).float()
    if use_qk_l2norm_in_kernel:
        q = _l2norm(q, eps)
        k = _l2norm(k, eps)
    q = q * dk**-0.5
    if hv != hk:
        q = q.repeat_interleave(hv // hk, dim=1)
        k = k.repeat_interleave(hv // hk, dim=1)
    g = g.reshape(t, hv).float()
    beta = beta.reshape(t, hv).float()
    out = torch.zeros(t, hv, dv, dtype=torch.float32, device=value.device)
    bounds = cu_seqlens.tolist()
    for i, slot in enumerate(initial_state_indices.tolist()):
        s = initial_state[slot].float()  # [Hv, K, V]
        for j in range(bounds[i], bounds[i + 1]):
            s = s * torch.exp(g[j])[:, None, None]
            kv_mem = (s * k[j][:, :, None]).sum(dim=1)  # [Hv, V]
            delta = (v[j] - kv_mem) * beta[j][:, None]
            s = s + k[j][:, :, None] * delta[:, None, :]
            out[j] = (s * q[j][:, :, None]).sum(dim=1)
        initial_state[slot].copy_(s)
    return out.to(value.dtype).unsqueeze(0)
