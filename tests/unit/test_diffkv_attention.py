"""The CPU DiffKV attention (V head size != Q/K head size) against a naive one."""

from __future__ import annotations

import math

import pytest
import torch

from vllm_x86.runtime.ops import reference


def _naive(q, ks, vs, scale, window, softcap, sinks):
    """One request: q [Q, H, D] (the last Q of S positions), ks [S, Hkv, D], vs [S, Hkv, Dv]."""
    nq, nh, _ = q.shape
    s_len, nkv, _ = ks.shape
    out = torch.zeros(nq, nh, vs.shape[-1], dtype=torch.float64)
    for i in range(nq):
        pos = s_len - nq + i
        for h in range(nh):
            kh = h // (nh // nkv)
            logits, idx = [], []
            for j in range(pos + 1):
                if window >= 0 and j < pos - window:
                    continue
                x = float(q[i, h].double() @ ks[j, kh].double()) * scale
                if softcap > 0:
                    x = softcap * math.tanh(x / softcap)
                logits.append(x)
                idx.append(j)
            m = max(logits + ([float(sinks[h])] if sinks is not None else []))
            w = [math.exp(x - m) for x in logits]
            den = sum(w) + (math.exp(float(sinks[h]) - m) if sinks is not None else 0.0)
            for wj, j in zip(w, idx):
                out[i, h] += wj / den * vs[j, kh].double()
    return out


@pytest.mark.parametrize(
    "window,softcap,with_sinks", [(-1, 0.0, False), (5, 0.0, True), (-1, 20.0, True)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_diffkv_attention_matches_naive(window, softcap, with_sinks, dtype):
    torch.manual_seed(0)
    nh, nkv, hk, hv, bs, nblocks = 4, 2, 64, 32, 16, 12
    seq_lens = [23, 40, 9]  # one prefill-like, one long decode-like, one short
    q_lens = [23, 1, 3]
    cache = torch.zeros(nblocks, bs, nkv, hk + hv, dtype=dtype)
    perm = torch.randperm(nblocks).tolist()
    table = torch.full((3, 4), 0, dtype=torch.int32)
    ks, vs, slots = [], [], []
    for r, s_len in enumerate(seq_lens):
        n = -(-s_len // bs)
        blocks = [perm.pop() for _ in range(n)]
        table[r, :n] = torch.tensor(blocks)
        ks.append(torch.randn(s_len, nkv, hk).to(dtype))
        vs.append(torch.randn(s_len, nkv, hv).to(dtype))
        slots.append(torch.tensor([blocks[p // bs] * bs + p % bs for p in range(s_len)]))
    key, value = torch.cat(ks), torch.cat(vs)
    slot = torch.cat(slots)
    slot_with_pad = torch.cat([slot, torch.tensor([-1, -1])])
    pad = torch.zeros(2, nkv, hk, dtype=dtype)
    reference.reshape_and_cache_diffkv(
        torch.cat([key, pad]), torch.cat([value, pad[..., :hv]]), cache, slot_with_pad
    )
    qs = [torch.randn(n, nh, hk).to(dtype) for n in q_lens]
    query = torch.cat(qs)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    sinks = torch.randn(nh) if with_sinks else None
    out = torch.full((query.shape[0], nh, hv), float("nan"), dtype=dtype)
    scale = hk**-0.5
    reference.paged_attention_diffkv(
        out, query, cache, hv, starts, torch.tensor(seq_lens), table, scale, window, softcap, sinks
    )
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for r in range(3):
        want = _naive(qs[r], ks[r], vs[r], scale, window, softcap, sinks)
        got = out[starts[r] : starts[r + 1]].double()
        assert torch.allclose(got, want, atol=tol, rtol=tol), (r, (got - want).abs().max())


def test_cache_write_skips_padding_slots():
    cache = torch.zeros(2, 4, 1, 3)
    key = torch.ones(2, 1, 2)
    value = torch.full((2, 1, 1), 7.0)
    reference.reshape_and_cache_diffkv(key, value, cache, torch.tensor([5, -1]))
    assert cache[1, 1, 0].tolist() == [1.0, 1.0, 7.0]
    assert int((cache != 0).sum()) == 3


def test_the_op_table_replaces_vllms_diffkv_backend():
    from vllm_x86.runtime.ops import registry
    from vllm_x86.runtime.ops.diffkv_attention import (
        X86DiffKVAttentionBackend,
        X86DiffKVAttentionImpl,
    )

    rows = [r for r in registry.OVERRIDES if r.kind == "backend"]
    assert [r.target for r in rows] == ["TRITON_ATTN_DIFFKV"]
    assert registry._load(rows[0].impl) is X86DiffKVAttentionBackend
    assert X86DiffKVAttentionBackend.get_impl_cls() is X86DiffKVAttentionImpl
    assert X86DiffKVAttentionBackend.get_name() == "TRITON_ATTN_DIFFKV"
