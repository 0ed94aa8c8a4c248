"""The plugin's rotary embedding is bit-identical to vLLM's reference implementation,
and stock vLLM CPU's kernel is not (the root cause of the eager-bf16 divergence)."""

from __future__ import annotations

import pytest
import torch

from vllm_x86.runtime.ops.rotary_embedding import expand_cos_sin, rope_fast, rope_reference


def cos_sin_cache(rotary_dim: int, max_pos: int = 4096, base: float = 1e4) -> torch.Tensor:
    inv = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float), inv)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


SHAPES = [  # (num_heads, num_kv_heads, head_size, rotary_dim)
    (9, 3, 64, 64),  # SmolLM2
    (16, 8, 128, 128),  # Qwen3-0.6B
    (14, 2, 64, 64),
    (8, 8, 256, 256),
    (8, 2, 128, 64),  # partial rotary
    (4, 1, 80, 40),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}kv{}d{}r{}".format(*s))
@pytest.mark.parametrize("tokens", [1, 7, 64, 1000])
def test_bit_identical_to_reference(dtype, neox, shape, tokens):
    heads, kv_heads, head, rot = shape
    g = torch.Generator().manual_seed(tokens * 31 + head)
    cache = cos_sin_cache(rot).to(dtype)
    pos = torch.randint(0, 4096, (tokens,), generator=g)
    # q/k as views into a fused qkv projection output: non-contiguous rows
    qkv = (torch.randn(tokens, (heads + 2 * kv_heads) * head, generator=g) * 4).to(dtype)
    q, k, _ = qkv.split([heads * head, kv_heads * head, kv_heads * head], dim=-1)
    assert tokens == 1 or not q.is_contiguous()
    ref_q, ref_k = rope_reference(pos, q, k, head, rot, cache, neox)
    out_q, out_k = rope_fast(pos, q, k, head, rot, expand_cos_sin(cache, neox), neox)
    assert torch.equal(out_q, ref_q)
    assert torch.equal(out_k, ref_k)
    assert out_q.dtype == dtype and out_q.shape == q.shape


def test_key_may_be_none():
    cache = cos_sin_cache(64).bfloat16()
    q = torch.randn(3, 4 * 64).bfloat16()
    pos = torch.tensor([0, 5, 9])
    out_q, out_k = rope_fast(pos, q, None, 64, 64, expand_cos_sin(cache, True), True)
    assert out_k is None
    assert torch.equal(out_q, rope_reference(pos, q, None, 64, 64, cache, True)[0])


def test_stock_cpu_kernel_rounds_differently_in_bf16():
    """vLLM CPU's _C.rotary_embedding evaluates the formula in float32 and rounds once,
    where the reference rounds each product and sum to bf16. The results differ in a
    good share of elements; that is what flips SmolLM2's near-tie answer in stock
    eager bf16 (docs/correctness.md)."""
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    from vllm import _custom_ops as ops

    g = torch.Generator().manual_seed(0)
    cache = cos_sin_cache(64).bfloat16()
    pos = torch.randint(0, 4096, (64,), generator=g)
    q = (torch.randn(64, 9 * 64, generator=g) * 4).bfloat16()
    k = (torch.randn(64, 3 * 64, generator=g) * 4).bfloat16()
    ref_q, _ = rope_reference(pos, q, k, 64, 64, cache, True)
    stock_q, stock_k = q.clone(), k.clone()
    ops.rotary_embedding(pos, stock_q, stock_k, 64, cache, True)
    # stock == the same inputs rotated in float32, rounded once
    once_q, _ = rope_reference(pos, q.float(), k.float(), 64, 64, cache.float(), True)
    assert torch.equal(stock_q, once_q.bfloat16())
    assert (stock_q != ref_q).float().mean().item() > 0.01
