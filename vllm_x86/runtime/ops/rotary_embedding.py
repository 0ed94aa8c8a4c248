"""Rotary embedding whose results are bit-identical to vLLM's reference.

vLLM's reference (``RotaryEmbedding.forward_native``, and transformers' Llama code)
computes, in the model's dtype,

    o1 = x1 * cos - x2 * sin        o2 = x2 * cos + x1 * sin

so in bf16 each product and each sum is rounded to bf16 (three roundings per output).
Stock vLLM CPU's ``_C.rotary_embedding`` evaluates the same formula in float32 and
rounds once. Both are valid approximations, but they differ by up to one bf16 ulp per
element, and through 30 layers that is enough to flip a near-tie: stock vLLM CPU in
eager bf16 answers SmolLM2's "What is the capital of France?" with "L'Étoile, ..."
where transformers, vLLM compiled and vLLM with the native rotary op all answer
"The capital of France is Paris." (docs/correctness.md has the whole analysis).

The plugin keeps the reference's rounding so that eager and compiled vLLM, and
transformers, follow the same trajectory. ``rope_reference`` below is the reference;
the C++ kernel (csrc, torch.ops.vllm_x86.rotary_embedding) is what runs, and
``rope_fast`` is the same arithmetic in PyTorch ops for when the kernel cannot run.
The unit tests require all three to agree bit for bit.
"""

from __future__ import annotations

import torch


def rope_reference(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    rotary_dim: int,
    cos_sin_cache: torch.Tensor,
    is_neox_style: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """vLLM's own native implementation (the semantic reference)."""
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    return RotaryEmbedding.forward_static(
        positions, query, key, head_size, rotary_dim, cos_sin_cache, is_neox_style
    )


def expand_cos_sin(cos_sin_cache: torch.Tensor, is_neox_style: bool) -> torch.Tensor:
    """[max_pos, rot] cos|sin cache -> [max_pos, 2, rot] (C, S) tables such that

        out = x * C + swap(x) * S

    reproduces the reference bit for bit: for the first half, swap(x) * S is
    x2 * (-sin) = -(x2 * sin) exactly, and a + (-b) rounds exactly like a - b.
    neox: C = [cos, cos], S = [-sin, sin], swap exchanges the two halves.
    gptj: C = [c0, c0, c1, c1, ...], S = [-s0, s0, -s1, s1, ...], swap exchanges
    neighbours.
    """
    cos, sin = cos_sin_cache.chunk(2, dim=-1)
    if is_neox_style:
        c = torch.cat((cos, cos), dim=-1)
        s = torch.cat((-sin, sin), dim=-1)
    else:
        c = torch.stack((cos, cos), dim=-1).flatten(-2)
        s = torch.stack((-sin, sin), dim=-1).flatten(-2)
    return torch.stack((c, s), dim=1).contiguous()


def _rotate(x: torch.Tensor, cs: torch.Tensor, rotary_dim: int, is_neox: bool) -> torch.Tensor:
    # x: [T, H, head_size]; cs: [T, 2, rot]
    rot = x[..., :rotary_dim]
    if is_neox:
        half = rotary_dim // 2
        swapped = torch.cat((rot[..., half:], rot[..., :half]), dim=-1)
    else:
        swapped = rot.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    c = cs[:, 0].unsqueeze(1)
    s = cs[:, 1].unsqueeze(1)
    out = rot * c + swapped * s
    if rotary_dim == x.shape[-1]:
        return out
    return torch.cat((out, x[..., rotary_dim:]), dim=-1)


def rope_fast(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    rotary_dim: int,
    cs_table: torch.Tensor,
    is_neox_style: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Same results as ``rope_reference``; ``cs_table`` comes from ``expand_cos_sin``
    of the cache in the query's dtype. q and k heads are rotated in one pass (one
    set of tensor ops instead of two; elementwise results do not depend on it)."""
    positions = positions.flatten()
    t = positions.shape[0]
    cs = cs_table.index_select(0, positions)
    q = query.view(t, -1, head_size)
    if key is None:
        return _rotate(q, cs, rotary_dim, is_neox_style).reshape(query.shape), None
    k = key.view(t, -1, head_size)
    both = _rotate(torch.cat((q, k), dim=1), cs, rotary_dim, is_neox_style)
    nq = q.shape[1]
    return both[:, :nq].reshape(query.shape), both[:, nq:].reshape(key.shape)


def _packed_heads(t: torch.Tensor, head_size: int) -> bool:
    """The layouts the kernel takes: [tokens, heads * head_size] with contiguous rows,
    or [tokens, heads, head_size] with heads back to back (any token stride)."""
    if t.dim() == 2:
        return t.stride(1) == 1
    return t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == head_size


class X86RotaryMixin:
    """forward_cpu for vLLM's RotaryEmbedding and its subclasses that only change
    how the cos/sin cache is computed (Llama 3, linear/NTK/YaRN scaling...).

    Runs the C++ kernel (torch.ops.vllm_x86.rotary_embedding, bit-identical to the
    reference, in place like vLLM's own CPU op); without the kernel library, or for a
    layout it does not take, ``rope_fast`` (the same arithmetic in PyTorch ops) runs,
    with a warning."""

    def _x86_table(self, query: torch.Tensor) -> torch.Tensor:
        cache = self._match_cos_sin_cache_dtype(query)
        key = (cache.data_ptr(), cache.dtype, cache.shape[0])
        tables = self.__dict__.setdefault("_x86_cs_tables", {})
        table = tables.get(key)
        if table is None:
            tables.clear()
            table = expand_cos_sin(cache, self.is_neox_style)
            tables[key] = table
        return table

    def forward_cpu(self, positions, query, key=None):
        from vllm_x86.runtime.ops import kernels
        from vllm_x86.runtime.ops.fallback import warn_fallback

        why = None
        if not kernels.available():
            why = kernels.load_error() or "no kernels"
        elif query.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            why = f"dtype {query.dtype} is not float32/bfloat16/float16"
        elif query.stride(-1) != 1 or (key is not None and key.stride(-1) != 1):
            why = "query or key is not contiguous in its last dimension"
        if why is None:
            cache = self._match_cos_sin_cache_dtype(query)
            # The kernel takes whole heads one after another. A view whose heads are
            # spaced wider (MLA rotates q[..., nope:], a slice of each head) runs on a
            # packed copy, written back so the op stays in place.
            q = query if _packed_heads(query, self.head_size) else query.contiguous()
            k = key
            if key is not None and not _packed_heads(key, self.head_size):
                k = key.contiguous()
            torch.ops.vllm_x86.rotary_embedding(
                positions.flatten().long(), q, k, self.head_size, cache, self.is_neox_style
            )
            if q is not query:
                query.copy_(q)
            if k is not key:
                key.copy_(k)
            return query, key
        warn_fallback("rotary_embedding", why)
        return rope_fast(
            positions,
            query,
            key,
            self.head_size,
            self.rotary_dim,
            self._x86_table(query),
            self.is_neox_style,
        )
