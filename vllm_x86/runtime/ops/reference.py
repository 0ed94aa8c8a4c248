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


def fused_add_rms_norm_f32res(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, epsilon: float
) -> None:
    """fused_add_rms_norm with a float32 residual (VLLM_X86_FP32_RESIDUAL): the sum is
    kept in float32, unrounded; the norm rounds where vLLM's native one does."""
    s = input.to(torch.float32) + residual
    residual.copy_(s)
    y = s * torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + epsilon)
    if weight is not None:
        y = y.to(weight.dtype) * weight
    input.copy_(y.to(input.dtype))


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


def xielu(
    x: torch.Tensor,
    alpha_p: torch.Tensor,
    alpha_n: torch.Tensor,
    beta: torch.Tensor,
    eps: torch.Tensor,
) -> torch.Tensor:
    """xIELU (arXiv 2411.13010) as transformers' ``XIELUActivation`` computes it, in
    float64 (the parameters as given, before their softplus)."""
    xd = x.to(torch.float64)
    a_p = F.softplus(alpha_p.to(torch.float64))
    b = beta.to(torch.float64)
    a_n = b + F.softplus(alpha_n.to(torch.float64))
    neg = (torch.expm1(torch.minimum(xd, eps.to(torch.float64))) - xd) * a_n + b * xd
    return torch.where(xd > 0, a_p * xd * xd + b * xd, neg).to(x.dtype)


def mla_attention(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Multi-head latent attention (DeepSeek-V2/V3) as the model defines it, in float64:
    keys and values expanded from the latent cache, causal softmax attention.

    Sequence b has ``seq_lens[b]`` positions (cached context, then its new tokens);
    its rows of ``kv_c`` [positions, kv_lora_rank] and ``k_pe`` [positions, rope] are
    the b-th run of ``seq_lens`` rows. Its new tokens are the last ``q_len`` positions,
    ``q_len = query_start_loc[b+1] - query_start_loc[b]``, with queries ``q_nope``
    [tokens, heads, nope] and ``q_pe`` [tokens, heads, rope]. ``w_uk`` [kv_lora_rank,
    heads, nope] and ``w_uv`` [kv_lora_rank, heads, v] are kv_b_proj's two parts (its
    weight transposed). Returns [tokens, heads, v] in float64."""
    f = torch.float64
    out = []
    kv_start = 0
    for b in range(len(seq_lens)):
        q0, q1 = int(query_start_loc[b]), int(query_start_loc[b + 1])
        n, q_len = int(seq_lens[b]), q1 - q0
        c = kv_c[kv_start : kv_start + n].to(f)
        pe = k_pe[kv_start : kv_start + n].to(f)
        kv_start += n
        k_nope = torch.einsum("sl,lhp->shp", c, w_uk.to(f))
        v = torch.einsum("sl,lhv->shv", c, w_uv.to(f))
        scores = torch.einsum("thp,shp->hts", q_nope[q0:q1].to(f), k_nope)
        scores = scores + torch.einsum("thr,sr->hts", q_pe[q0:q1].to(f), pe)
        pos = torch.arange(n - q_len, n)[:, None]  # each new token's position
        scores = (scores * scale).masked_fill(torch.arange(n)[None, :] > pos, float("-inf"))
        out.append(torch.einsum("hts,shv->thv", scores.softmax(-1), v))
    return torch.cat(out)


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


def refine_top_logits(
    logits: torch.Tensor,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    rel: float,
) -> torch.Tensor:
    """An LM head's bf16/fp16 logits [M, V] as float32, every token within
    |best| * rel of its row's best recomputed as the float32 dot product of the row's
    hidden state and the token's weight row (+ bias). A row whose best is NaN or +inf
    has no candidates (nothing compares >= NaN)."""
    out = logits.to(torch.float32)
    if out.numel() == 0:
        return out
    best = out.amax(dim=-1, keepdim=True)
    rows, cols = (out >= best - best.abs() * rel).nonzero(as_tuple=True)
    if rows.numel() == 0:
        return out
    exact = (weight[cols].to(torch.float32) * hidden[rows].to(torch.float32)).sum(dim=-1)
    if bias is not None:
        exact = exact + bias[cols].to(torch.float32)
    out[rows, cols] = exact
    return out


def kv_cache_offsets(
    layout: int, block_size: int, head_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where vLLM CPU's cpu_attn_reshape_and_cache puts token t's key and value element d
    inside one (block, KV head) of the paged cache ([block_size, 2 * head_size] elements):
    two int64 [block_size, head_size] tensors of offsets. Layout 0 is vLLM's "vec" and
    "vec16" attention ISAs (keys transposed, values by token), 1 its "amx" (bfloat16 pairs
    in 16-wide tiles); csrc/kernels_impl.h's kv_key_at and kv_value_at say the same."""
    t = torch.arange(block_size).view(-1, 1)
    d = torch.arange(head_size).view(1, -1)
    if layout == 0:
        key = d * block_size + t
        value = t * head_size + d
    else:
        key = (t // 16) * 16 * head_size + (d // 2) * 32 + (t % 16) * 2 + d % 2
        value = (d // 16) * block_size * 16 + (t // 2) * 32 + (d % 16) * 2 + t % 2
    return key, block_size * head_size + value


def decode_attention(
    out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    layout: int,
) -> None:
    """vLLM CPU's decode step of attention, one query token per row: row s's key and
    value go to slot slot_mapping[s] of the paged cache (as cpu_attn_reshape_and_cache),
    then each query head attends, causally, to the row's seq_lens[s] cached tokens
    (blocks block_table[s]), rows in order (rows of one sequence, a speculative step's,
    read the keys and values of the rows before them): softmax(scale q K^T) V
    in float32, rounded once to the output's dtype. Query head h reads KV head
    h // (heads / kv_heads). In vLLM's amx layout (bf16) the probabilities multiply V
    rounded to bf16, before the division by their float32 sum, as vLLM's AMX kernel
    does."""
    blocks, kvh, bs, two_hd = kv_cache.shape
    hd = two_hd // 2
    koff, voff = kv_cache_offsets(layout, bs, hd)
    flat = kv_cache.view(blocks, kvh, -1)
    n = seq_lens.shape[0]
    heads = query.shape[1] // hd
    g = heads // kvh
    for s in range(n):
        slot = int(slot_mapping[s])
        if slot >= 0:
            b, t = divmod(slot, bs)
            flat[b, :, koff[t]] = key[s].view(kvh, hd).to(kv_cache.dtype)
            flat[b, :, voff[t]] = value[s].view(kvh, hd).to(kv_cache.dtype)
        length = int(seq_lens[s])
        tok = torch.arange(length)
        blk = block_table[s, tok // bs].long()
        rows = flat[blk]  # [L, kvh, 2 * bs * hd]
        k = rows.gather(2, koff[tok % bs][:, None, :].expand(length, kvh, hd)).float()
        v = rows.gather(2, voff[tok % bs][:, None, :].expand(length, kvh, hd)).float()
        q = query[s].float().view(kvh, g, hd)
        scores = torch.einsum("hgd,lhd->hgl", q, k) * scale
        e = (scores - scores.amax(-1, keepdim=True)).exp()
        p = e.bfloat16().float() if layout == 1 and kv_cache.dtype == torch.bfloat16 else e
        o = torch.einsum("hgl,lhd->hgd", p, v) / e.sum(-1, keepdim=True)
        out[s].copy_(o.reshape(-1).to(out.dtype))


def _unblock(t: torch.Tensor, nb: int, k: int) -> torch.Tensor:
    """[nb, K/64, 16 quads, 64] B-tile blocks (quant/methods._vnni_blocks) -> [N, K]."""
    return t.reshape(nb, k // 64, 16, 16, 4).permute(0, 3, 1, 2, 4).reshape(nb * 16, k)


def a8_activations(x: torch.Tensor) -> torch.Tensor:
    """The values the 8-bit-activation kernels (csrc/vnni_gemm.cpp, quant_rows_a8)
    compute with: each group of 64 inputs of a row rounded (to nearest even) to 8-bit
    integers with the scale amax / 127 of its group, as float32."""
    m, k = x.shape
    g = x.float().view(m, k // 64, 64)
    s = g.abs().amax(dim=-1, keepdim=True) / 127.0
    s = torch.where(s > 0, s, torch.ones_like(s))
    return (torch.round(g / s).clamp(-127, 127) * s).view(m, k)


def a8_rows() -> int:
    """From how many rows the INT8/INT4 ops take 8-bit activations now: the AVX-512 VNNI
    kernels' vllm_x86.runtime._C.quant_a8_rows(); 0 (never) on AMX."""
    import vllm_x86.runtime._C as C

    return C.quant_a8_rows() if C.quant_isa() == "avx512_vnni" else 0


def takes_a8(rows: int) -> bool:
    """Whether the INT8/INT4 ops take 8-bit activations for `rows` rows now."""
    a8 = a8_rows()
    return a8 > 0 and rows >= a8


def kernel_activations(x: torch.Tensor) -> torch.Tensor:
    """The activations the INT8/INT4 ops compute with for x's rows now, as float32: x
    (their 16-bit rounding is not modelled) or, where they take 8-bit ones, a8_activations."""
    return a8_activations(x) if takes_a8(x.shape[0]) else x.float()


def int8_w8a16_gemm(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [M, K] @ (q * scale)^T (+ bias) in float32, rounded to x's dtype; `w` is the
    packed [N/16, 16 K] int8 weight of quant/methods.pack_int8_w8a16, unpacked here.
    The kernel rounds the activations to 16-bit integers per token; the reference does
    not (the tests bound the difference). Where the op takes 8-bit activations
    (takes_a8), the reference rounds them as the kernel does (a8_activations)."""
    nb, k16 = w.shape
    k = k16 // 16
    q = _unblock(w, nb, k)
    out = kernel_activations(x) @ (q.float() * scale.float()[:, None]).t()
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
    `w`, `scale`, `zeros` as quant/methods.pack_int4_w4a16 packs them, unpacked here
    (groups of 32: (8 codes - zero) * scale, zero points in eighths of a step). As for
    int8_w8a16_gemm, the kernel's 16-bit activations are not modelled, its 8-bit ones
    are."""
    nb, k8 = w.shape
    k = k8 // 8
    b = w.view(nb, k // 64, 8, 64)
    q = _unblock(torch.cat([b & 15, b >> 4], dim=2), nb, k)  # rows r, r + 8 per byte
    g = k // group_size
    s = scale.view(nb, g, 16).permute(0, 2, 1).reshape(nb * 16, g)
    z = zeros.view(nb, g, 16).permute(0, 2, 1).reshape(nb * 16, g)
    steps = 8.0 if group_size == 32 else 1.0
    qs = q.float().view(-1, g, group_size) * steps
    wd = (qs - z.float()[..., None]) * s.float()[..., None]
    xa = kernel_activations(x)
    out = xa @ wd.view(nb * 16, k).t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


def moe_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    weight_on_input: bool = False,
    a8_rows: int = 0,
) -> torch.Tensor:
    """Routed MoE experts (quant/moe.run_experts), token by token in float32: for each
    of a token's top-k experts e, act(x @ w13[e]^T)[:I] * (x @ w13[e]^T)[I:] @ w2[e]^T,
    weighted by the routing weight and summed in float32. The gate_up output and the
    activation's are rounded to x's dtype (where vLLM's bf16 experts round them), the sum
    at the end. `w13`
    [E, 2I, H] and `w2` [E, H, I] are float weights (the dequantized codes, in the
    quantization tests). Gated activations: silu, gelu (erf), gelu_tanh.
    `weight_on_input` (top-k 1): the routing weight scales the expert's input (rounded
    to x's dtype) instead of its output. `a8_rows` > 0 (quantized experts: a8_rows()):
    an expert that gets at least that many tokens takes 8-bit activations in both of
    its GEMMs, as the ops do for that many rows (a8_activations, row by row)."""
    act = {
        "silu": F.silu,
        "gelu": F.gelu,
        "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    }[activation]
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32)
    counts = torch.bincount(topk_ids.flatten().long(), minlength=w13.shape[0]).tolist()

    def rounded(v: torch.Tensor, e: int) -> torch.Tensor:
        return a8_activations(v[None])[0] if 0 < a8_rows <= counts[e] else v

    for t in range(x.shape[0]):
        for w, e in zip(topk_weights[t].float(), topk_ids[t].tolist(), strict=True):
            xt = (x[t].float() * w).to(x.dtype).float() if weight_on_input else x[t].float()
            xt = rounded(xt, e)
            h = w13[e].float() @ xt
            if w13_bias is not None:
                h = h + w13_bias[e].float()
            gate, up = h.to(x.dtype).float().chunk(2)
            a = rounded((act(gate) * up).to(x.dtype).float(), e)
            y = w2[e].float() @ a
            if w2_bias is not None:
                y = y + w2_bias[e].float()
            out[t] += y if weight_on_input else w * y
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


# ---------------------------------------------------------------- Mamba-1 (ops/mamba.py)


def _mamba_step(h, u, dt, A, B, C, D, z):
    """One step of the Mamba-1 recurrence for all channels (transformers'
    MambaMixer.slow_forward, Mamba paper eq. 2a/2b with ZOH-discretized A and Euler B):
    h <- exp(dt A) h + dt B u; y = C h + D u, gated by silu(z). Float32; dt already
    biased and softplus-ed; B, C per channel [dim, dstate]."""
    h = torch.exp(dt[:, None] * A) * h + (dt * u)[:, None] * B
    y = (h * C).sum(-1)
    if D is not None:
        y = y + D * u
    out_z = y * F.silu(z) if z is not None else None
    return h, y, out_z


def _mamba_dt(delta, delta_bias, softplus: bool):
    dt = delta.float()
    if delta_bias is not None:
        dt = dt + delta_bias.float()
    if softplus:
        dt = torch.where(dt <= 20.0, torch.log1p(torch.exp(dt)), dt)
    return dt


def selective_scan_fwd(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D_: torch.Tensor | None,
    z_: torch.Tensor | None,
    delta_bias_: torch.Tensor | None,
    delta_softplus: bool,
    query_start_loc: torch.Tensor | None,
    cache_indices: torch.Tensor | None,
    has_initial_state: torch.Tensor | None,
    ssm_states: torch.Tensor,
    null_block_id: int,
    block_size: int = 1024,
    block_idx_first_scheduled_token: torch.Tensor | None = None,
    block_idx_last_scheduled_token: torch.Tensor | None = None,
    initial_state_idx: torch.Tensor | None = None,
    cu_chunk_seqlen: torch.Tensor | None = None,
    last_chunk_indices: torch.Tensor | None = None,
) -> None:
    """vLLM's _C.selective_scan_fwd (Mamba-1 prefill), token by token. u, delta, z:
    [dim, T] varlen (sequences cut by query_start_loc) or [batch, dim, L]; A [dim,
    dstate]; B, C [groups, dstate, T] or [batch, groups, dstate, L]; ssm_states [slots,
    dim, dstate], read where has_initial_state, written with each final state. Writes y
    into delta and y * silu(z) into z. Sequences whose slot is null_block_id are left
    alone. The prefix-caching arguments are not modelled (vLLM's Mamba-1 passes none)."""
    assert block_idx_first_scheduled_token is None and cu_chunk_seqlen is None
    dim, dstate = A.shape
    Af = A.float()
    if query_start_loc is not None:
        q = query_start_loc.tolist()
        seqs = [(i, (Ellipsis, slice(q[i], q[i + 1]))) for i in range(len(q) - 1)]
    else:
        seqs = [(i, (i,)) for i in range(u.shape[0])]
    for i, where in seqs:
        slot = int(cache_indices[i]) if cache_indices is not None else i
        if slot == null_block_id:
            continue
        us, dts, Bs, Cs = u[where], delta[where], B[where], C[where]
        zs = z_[where] if z_ is not None else None
        groups = Bs.shape[0]
        per_group = dim // groups
        if has_initial_state is not None and bool(has_initial_state[i]):
            h = ssm_states[slot].float().reshape(dim, dstate)
        else:
            h = torch.zeros(dim, dstate)
        length = us.shape[-1]
        if length == 0:
            continue
        ys, yzs = [], []
        for t in range(length):
            dt = _mamba_dt(dts[:, t], delta_bias_, delta_softplus)
            Bt = Bs[:, :, t].float().repeat_interleave(per_group, dim=0)
            Ct = Cs[:, :, t].float().repeat_interleave(per_group, dim=0)
            zt = zs[:, t].float() if zs is not None else None
            D = D_.float() if D_ is not None else None
            h, y, yz = _mamba_step(h, us[:, t].float(), dt, Af, Bt, Ct, D, zt)
            ys.append(y)
            yzs.append(yz)
        dts.copy_(torch.stack(ys, dim=-1))
        if zs is not None:
            zs.copy_(torch.stack(yzs, dim=-1))
        ssm_states[slot].copy_(h.reshape(ssm_states[slot].shape))


def selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    state_batch_indices: torch.Tensor | None,
    dst_state_batch_indices: torch.Tensor | None,
    null_block_id: int,
    out: torch.Tensor,
) -> None:
    """One decode step of the Mamba-1 recurrence per sequence (vLLM's
    selective_state_update for Mamba-1 shapes): state [slots, dim, dstate]; x, dt, z,
    out [batch, dim]; B, C [batch, dstate]; A [dim, dstate]; D, dt_bias [dim]. Sequence b
    reads slot state_batch_indices[b] and writes dst_state_batch_indices[b] ([batch] or
    [batch, 1]; b itself if None); a sequence whose slot is null_block_id is skipped."""
    batch = x.shape[0]

    def slot(indices, b):
        return int(indices.reshape(batch, -1)[b, 0]) if indices is not None else b

    for b in range(batch):
        src = slot(state_batch_indices, b)
        if src == null_block_id:
            continue
        h, y, yz = _mamba_step(
            state[src].float(),
            x[b].float(),
            _mamba_dt(dt[b], dt_bias, dt_softplus),
            A.float(),
            B[b].float()[None, :],
            C[b].float()[None, :],
            D.float() if D is not None else None,
            z[b].float() if z is not None else None,
        )
        dst = slot(
            dst_state_batch_indices if dst_state_batch_indices is not None else state_batch_indices,
            b,
        )
        state[dst].copy_(h)
        out[b].copy_(yz if z is not None else y)


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    initial_state: torch.Tensor | None,
    silu: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal convolution of one sequence x [dim, L] with weight [dim, width]
    (the Mamba conv1d), after the width - 1 columns of initial_state (zeros if None):
    out[:, t] = bias + sum_k weight[:, k] * xp[:, t + k], xp = [initial_state, x].
    Returns (out [dim, L], the last width - 1 columns of xp: the next conv state)."""
    dim, width = weight.shape
    xf = x.float()
    init = initial_state.float() if initial_state is not None else torch.zeros(dim, width - 1)
    xp = torch.cat([init, xf], dim=-1)
    out = torch.zeros_like(xf)
    for k in range(width):
        out += weight.float()[:, k : k + 1] * xp[:, k : k + xf.shape[-1]]
    if bias is not None:
        out += bias.float()[:, None]
    if silu:
        out = F.silu(out)
    return out, xp[:, -(width - 1) :]


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
