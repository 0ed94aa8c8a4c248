"""Float32 MLA (DeepSeek-V2/V3, GLM-4.7-Flash, A.X-K1): the platform gives float32 MLA
models vLLM's reference backend CPU_MLA (vLLM's AMX_MLA takes bf16 only), and that
backend's float32 decode kernel and prefill attention match a float64 MLA reference
(ops/reference.py: mla_attention) on several sequences at once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_x86.runtime.ops import reference
from vllm_x86.runtime.platform import mla_attention_backend

HEADS, LORA, ROPE, NOPE, V = 4, 512, 64, 32, 32  # the cache row is 576 wide, as vLLM needs
SCALE = (NOPE + ROPE) ** -0.5


# ----------------------------------------------------------------------------- choice


def _config(dtype=torch.float32, use_mla=True, backend=None, **hf):
    model = SimpleNamespace(
        dtype=dtype,
        use_mla=use_mla,
        hf_config=SimpleNamespace(**{"model_type": "deepseek_v3", **hf}),
    )
    return SimpleNamespace(model_config=model, attention_config=SimpleNamespace(backend=backend))


@pytest.fixture
def amx(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)


def test_float32_mla_gets_vllms_cpu_mla_backend(amx):
    assert mla_attention_backend(_config()) == "CPU_MLA"


@pytest.mark.parametrize(
    "cfg",
    [
        _config(dtype=torch.bfloat16),  # vLLM's AMX_MLA runs bf16
        _config(dtype=torch.float16),
        _config(use_mla=False),
        _config(backend="AMX_MLA"),  # the user's choice
        _config(model_type="deepseek_v4"),  # a backend of its own
        _config(index_topk=64),  # sparse MLA (DeepSeek-V3.2)
    ],
    ids=["bf16", "fp16", "no-mla", "user-backend", "deepseek-v4", "sparse"],
)
def test_everything_else_keeps_vllms_choice(amx, cfg):
    assert mla_attention_backend(cfg) is None


def test_without_amx_vllm_picks_cpu_mla_itself(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert mla_attention_backend(_config()) is None


def test_no_model_no_choice():
    assert mla_attention_backend(SimpleNamespace(model_config=None)) is None


# ----------------------------------------------------------------------------- kernels


def _weights(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w_uk = torch.randn(LORA, HEADS, NOPE, generator=g) * LORA**-0.5
    w_uv = torch.randn(LORA, HEADS, V, generator=g) * LORA**-0.5
    return w_uk, w_uv


def _latents(seq_lens: list[int], seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    n = sum(seq_lens)
    return torch.randn(n, LORA, generator=g), torch.randn(n, ROPE, generator=g)


def _queries(tokens: int, seed: int = 2):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, HEADS, NOPE, generator=g), torch.randn(
        tokens, HEADS, ROPE, generator=g
    )


def _paged(kv_c, k_pe, seq_lens: list[int], block: int = 16):
    """vLLM's MLA cache [num_blocks, block, 576] with scattered blocks, and its table."""
    per_seq = [-(-n // block) for n in seq_lens]
    order = torch.randperm(sum(per_seq) + 3, generator=torch.Generator().manual_seed(3))
    cache = torch.full((sum(per_seq) + 3, block, LORA + ROPE), float("nan"))
    table = torch.zeros(len(seq_lens), max(per_seq), dtype=torch.int32)
    start, used = 0, 0
    for b, n in enumerate(seq_lens):
        for i in range(per_seq[b]):
            blk = int(order[used])
            used += 1
            table[b, i] = blk
            lo, hi = i * block, min(n, (i + 1) * block)
            cache[blk, : hi - lo, :LORA] = kv_c[start + lo : start + hi]
            cache[blk, : hi - lo, LORA:] = k_pe[start + lo : start + hi]
        start += n
    return cache, table


@pytest.mark.parametrize("seq_lens", [[1], [17, 5, 40, 16]], ids=["one", "four-seqs"])
def test_cpu_mla_float32_decode_matches_the_reference(seq_lens):
    """vLLM CPU_MLA's decode: the absorbed query against the paged latent cache
    (mla_decode_kvcache), then W_UV, as MLAAttention runs it."""
    from vllm import _custom_ops as ops

    w_uk, w_uv = _weights()
    kv_c, k_pe = _latents(seq_lens)
    q_nope, q_pe = _queries(len(seq_lens))
    cache, table = _paged(kv_c, k_pe, seq_lens)
    q = torch.cat([torch.einsum("thp,lhp->thl", q_nope, w_uk), q_pe], dim=-1).contiguous()
    latent = torch.zeros(len(seq_lens), HEADS, LORA)
    ops.mla_decode_kvcache_cpu(
        latent, q, cache, SCALE, table, torch.tensor(seq_lens, dtype=torch.int32)
    )
    got = torch.einsum("thl,lhv->thv", latent, w_uv)
    loc = torch.arange(len(seq_lens) + 1)  # one new token each
    want = reference.mla_attention(
        q_nope, q_pe, kv_c, k_pe, w_uk, w_uv, loc, torch.tensor(seq_lens), SCALE
    )
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


def test_cpu_mla_float32_prefill_matches_the_reference():
    """vLLM CPU_MLA's prefill (the CPU SDPA MLA prefill backend): keys and values
    expanded from the latents, causal attention per sequence, several at once."""
    from vllm.v1.attention.backends.mla.prefill.cpu_sdpa import CPUSDPAMLAPrefillBackend

    seq_lens = [7, 1, 23]
    w_uk, w_uv = _weights()
    kv_c, k_pe = _latents(seq_lens)
    q_nope, q_pe = _queries(sum(seq_lens))
    loc = torch.tensor([0, 7, 8, 31], dtype=torch.int32)
    backend = CPUSDPAMLAPrefillBackend(HEADS, SCALE, LORA, NOPE, ROPE, V, vllm_config=None)
    backend.prepare_metadata(SimpleNamespace(query_start_loc=loc))
    k_nope = torch.einsum("sl,lhp->shp", kv_c, w_uk)
    k = torch.cat([k_nope, k_pe[:, None].expand(-1, HEADS, -1)], dim=-1)
    v = torch.einsum("sl,lhv->shv", kv_c, w_uv)
    out = torch.empty(sum(seq_lens), HEADS, V)
    backend.run_prefill_new_tokens(torch.cat([q_nope, q_pe], -1), k, v, False, out=out)
    want = reference.mla_attention(
        q_nope, q_pe, kv_c, k_pe, w_uk, w_uv, loc, torch.tensor(seq_lens), SCALE
    )
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-5)


def test_reference_with_cached_context_equals_the_full_prefill():
    """The reference's context handling: the last tokens of a sequence attending to its
    cached context give the full prefill's last rows."""
    w_uk, w_uv = _weights()
    kv_c, k_pe = _latents([20])
    q_nope, q_pe = _queries(20)
    full = reference.mla_attention(
        q_nope, q_pe, kv_c, k_pe, w_uk, w_uv, torch.tensor([0, 20]), torch.tensor([20]), SCALE
    )
    tail = reference.mla_attention(
        q_nope[15:],
        q_pe[15:],
        kv_c,
        k_pe,
        w_uk,
        w_uv,
        torch.tensor([0, 5]),
        torch.tensor([20]),
        SCALE,
    )
    torch.testing.assert_close(tail, full[15:], rtol=1e-12, atol=1e-12)
