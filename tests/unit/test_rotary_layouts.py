"""The plugin's rotary op on the strided views models pass it: MLA (DeepSeek-V2/V3,
GLM-4-MoE-Lite, ...) rotates q[..., nope:], the last rope_dim features of each head,
in place. Found by the conformance suite (DeepSeek-V2's tiny checkpoint stopped with
"rotary_embedding: query heads must be contiguous")."""

from __future__ import annotations

import pytest
import torch

from vllm_x86.runtime.ops import kernels
from vllm_x86.runtime.ops.rotary_embedding import X86RotaryMixin, rope_reference

pytestmark = pytest.mark.skipif(not kernels.available(), reason="kernels not built")


def _cache(rot: int, max_pos: int = 256) -> torch.Tensor:
    inv = 1.0 / (1e4 ** (torch.arange(0, rot, 2, dtype=torch.float) / rot))
    f = torch.outer(torch.arange(max_pos, dtype=torch.float), inv)
    return torch.cat((f.cos(), f.sin()), dim=-1)


class _Rope(X86RotaryMixin):
    """The mixin with the attributes vLLM's RotaryEmbedding gives it."""

    def __init__(self, head_size, rotary_dim, neox, dtype):
        self.head_size, self.rotary_dim, self.is_neox_style = head_size, rotary_dim, neox
        self.cos_sin_cache = _cache(rotary_dim)

    def _match_cos_sin_cache_dtype(self, query):
        return self.cos_sin_cache.to(query.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
def test_mla_slices_are_rotated_in_place_like_the_reference(dtype, neox):
    tokens, heads, nope, rope = 7, 4, 32, 64
    torch.manual_seed(0)
    q_full = torch.randn(tokens, heads, nope + rope, dtype=dtype)
    k_pe = torch.randn(tokens, 1, rope, dtype=dtype)
    kv = torch.randn(tokens, 512 + rope, dtype=dtype)  # k_pe as a slice of a wider row
    k_slice = kv[:, 512:].unsqueeze(1)
    pos = torch.arange(tokens) * 3
    op = _Rope(rope, rope, neox, dtype)

    want_q, want_k = rope_reference(
        pos, q_full[..., nope:].clone(), k_pe.clone(), rope, rope, op.cos_sin_cache.to(dtype), neox
    )
    before_nope = q_full[..., :nope].clone()
    q_view = q_full[..., nope:]
    got_q, got_k = op.forward_cpu(pos, q_view, k_pe)
    assert torch.equal(got_q, want_q) and torch.equal(q_full[..., nope:], want_q)
    assert torch.equal(q_full[..., :nope], before_nope)  # the rest of each head untouched
    assert torch.equal(got_k, want_k)

    _, want_ks = rope_reference(
        pos,
        q_full[..., nope:].clone(),
        k_slice.clone(),
        rope,
        rope,
        op.cos_sin_cache.to(dtype),
        neox,
    )
    op.forward_cpu(pos, q_full[..., nope:].clone(), k_slice)
    assert torch.equal(kv[:, 512:].unsqueeze(1), want_ks)
