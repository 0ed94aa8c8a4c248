"""torch.ops.vllm_x86.decode_attention against vLLM CPU's own two kernels and the float32
reference (ops/reference.decode_attention), on every elementwise ISA this CPU can run.

The KV cache history is written by vLLM's `_C.cpu_attn_reshape_and_cache` in the layout
of the attention ISA vLLM picks ("vec", "vec16"; "amx" on CPUs with AMX), so these tests
pin the plugin's reading of vLLM's layouts: after one decode step the cache must hold
exactly the bytes vLLM's writer leaves, and the output must equal the float32
reference to the output dtype's rounding. vLLM's "vec" kernel computes in float32 as
well and gives the same output; its AMX kernel multiplies bfloat16-rounded
probabilities, so it is compared with a looser bound.
"""

from __future__ import annotations

import pytest
import torch

from tests.unit.conftest import AMX, KERNEL_ISAS, last_slots
from vllm_x86.runtime.ops import kernels, reference

pytestmark = pytest.mark.skipif(
    not kernels.available(), reason=f"kernel library not built: {kernels.load_error()}"
)

LAYOUT = {"vec": 0, "vec16": 0, "amx": 1}
# (vLLM attention ISA, dtype, head size, block size, KV heads, query heads per KV head,
# sequence lengths): SmolLM2's and Qwen2.5-0.5B's heads, head sizes 80/96/128/256,
# sequences of 1 token, exactly one block, one token past a block, several blocks
CASES = [
    ("vec", torch.bfloat16, 64, 32, 3, 3, [1, 17, 100]),
    ("vec", torch.float32, 128, 128, 2, 7, [5, 300]),
    ("vec", torch.float16, 64, 64, 1, 8, [200]),
    ("vec16", torch.bfloat16, 80, 32, 2, 4, [33, 64, 65]),
    ("vec16", torch.float32, 96, 32, 4, 1, [31, 32]),
    ("amx", torch.bfloat16, 64, 32, 3, 3, [1, 17, 100, 301]),
    ("amx", torch.bfloat16, 128, 128, 2, 7, [5, 300]),
    ("amx", torch.bfloat16, 96, 64, 1, 12, [2, 3, 129]),
    ("amx", torch.bfloat16, 256, 32, 2, 1, [77]),
]
# output against the float32 reference: the output dtype's rounding (one unit in the
# last place of values below 4) plus float32 summation order
ATOL = {torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def _vllm_ops():
    from vllm import _custom_ops as ops

    return ops


def _step(attn_isa, dtype, hd, bs, kvh, g, lens, seed=0):
    """A paged cache with each sequence's earlier tokens written by vLLM's writer (or, for
    the amx layout on a CPU without AMX, by the reference), and one decode step's inputs."""
    gen = torch.Generator().manual_seed(seed)
    blocks, n, heads = 64, len(lens), kvh * g
    cache = torch.zeros(blocks, kvh, bs, 2 * hd, dtype=dtype)
    per_seq = max((L + bs - 1) // bs for L in lens) + 1
    table = torch.randperm(blocks, generator=gen)[: n * per_seq].view(n, per_seq).to(torch.int32)
    for s, L in enumerate(lens):
        if L == 1:
            continue
        t = torch.arange(L - 1)
        slots = table[s, t // bs].long() * bs + t % bs
        k = torch.randn(L - 1, kvh, hd, generator=gen).to(dtype)
        v = torch.randn(L - 1, kvh, hd, generator=gen).to(dtype)
        if attn_isa == "amx" and not AMX:
            koff, voff = reference.kv_cache_offsets(1, bs, hd)
            flat = cache.view(blocks, kvh, -1)
            for i, slot in enumerate(slots.tolist()):
                flat[slot // bs, :, koff[slot % bs]] = k[i]
                flat[slot // bs, :, voff[slot % bs]] = v[i]
        else:
            kc, vc = cache.view(blocks, kvh, 2 * bs, hd).chunk(2, dim=2)
            _vllm_ops().cpu_attn_reshape_and_cache(
                k, v, kc, vc, slots, attn_isa, k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto"
            )
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    slot = last_slots(table, lens, bs)
    qkv = torch.randn(n, (heads + 2 * kvh) * hd, generator=gen).to(dtype)
    # q, k, v as vLLM hands them over: views into the QKV projection's rows
    q, k, v = qkv.split([heads * hd, kvh * hd, kvh * hd], dim=1)
    return cache, table, seq_lens, slot, q, k, v


def _vllm_step(attn_isa, cache, table, seq_lens, slot, q, k, v, scale):
    ops = _vllm_ops()
    blocks, kvh, bs, two_hd = cache.shape
    hd, n, heads = two_hd // 2, seq_lens.shape[0], q.shape[1] // (two_hd // 2)
    kc, vc = cache.view(blocks, kvh, 2 * bs, hd).chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(
        k.reshape(n, kvh, hd), v.reshape(n, kvh, hd), kc, vc, slot, attn_isa,
        k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto",
    )  # fmt: skip
    qsl = torch.arange(n + 1, dtype=torch.int32)
    md = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=n, num_heads=heads, num_kv_heads=kvh, head_dim=hd, seq_lens=seq_lens,
        dtype=q.dtype, query_start_loc=qsl, causal=True, sliding_window_size=-1,
        isa=attn_isa, enable_kv_split=False, dynamic_causal=None, kv_cache_dtype="auto",
    )  # fmt: skip
    out = torch.empty(n, heads * hd, dtype=q.dtype)
    ops.cpu_attention_with_kv_cache(
        query=q.reshape(n, heads, hd), key_cache=kc, value_cache=vc,
        output=out.view(n, heads, hd), query_start_loc=qsl, seq_lens=seq_lens, scale=scale,
        causal=True, alibi_slopes=None, sliding_window=-1, block_table=table, softcap=0.0,
        scheduler_metadata=md, s_aux=None, dynamic_causal=None, k_scale=1.0, v_scale=1.0,
        kv_cache_dtype="auto",
    )  # fmt: skip
    return out


def _ids(case):
    attn_isa, dtype, hd, bs, kvh, g, lens = case
    return f"{attn_isa}-{str(dtype)[6:]}-hd{hd}-bs{bs}-kv{kvh}x{g}-{len(lens)}seq"


# every ISA with every case, except the amx layout on the AVX2 kernels: an AMX CPU always
# has the AVX-512 ones (test_the_amx_layout_needs_the_avx512_kernels checks the refusal)
PAIRS = [
    pytest.param(isa, case, id=f"{isa}-{_ids(case)}")
    for isa in KERNEL_ISAS
    for case in CASES
    if not (LAYOUT[case[0]] == 1 and isa == "avx2")
]


@pytest.mark.parametrize("kernel_isa,case", PAIRS)
def test_decode_attention_matches_vllm_and_the_reference(kernel_isa, case):
    attn_isa, dtype, hd, bs, kvh, g, lens = case
    layout = LAYOUT[attn_isa]
    kernels.set_isa(kernel_isa)
    try:
        _compare(attn_isa, layout, dtype, hd, bs, kvh, g, lens)
    finally:
        kernels.set_isa("auto")


def _compare(attn_isa, layout, dtype, hd, bs, kvh, g, lens):
    cache, table, seq_lens, slot, q, k, v = _step(attn_isa, dtype, hd, bs, kvh, g, lens)
    scale = hd**-0.5
    ours_cache, ref_cache = cache.clone(), cache.clone()
    ours = torch.full_like(q, float("nan"))
    torch.ops.vllm_x86.decode_attention(
        ours, q, k, v, ours_cache, slot, table, seq_lens, scale, layout
    )
    ref = torch.empty_like(q)
    reference.decode_attention(ref, q, k, v, ref_cache, slot, table, seq_lens, scale, layout)
    assert torch.equal(ours_cache, ref_cache)
    assert not ours.isnan().any()
    torch.testing.assert_close(ours.float(), ref.float(), atol=ATOL[dtype], rtol=0)
    if layout == 1 and not AMX:
        return  # vLLM's AMX kernels cannot run here; the reference wrote the history
    vllm_cache = cache.clone()
    theirs = _vllm_step(attn_isa, vllm_cache, table, seq_lens, slot, q, k, v, scale)
    assert torch.equal(ours_cache, vllm_cache), "the KV cache is not written as vLLM writes it"
    if layout == 1:
        # the probabilities rounded to bf16 as vLLM's AMX kernel rounds them: its output,
        # bit for bit (so a model gives the same tokens with either)
        assert torch.equal(ours, theirs)
    else:
        torch.testing.assert_close(ours.float(), theirs.float(), atol=ATOL[dtype], rtol=0)


def test_a_padded_slot_writes_nothing(isa):
    cache, table, seq_lens, slot, q, k, v = _step("vec", torch.float32, 64, 32, 2, 2, [40, 9])
    slot[1] = -1  # vLLM pads with -1: no cache write for that row
    before = cache.clone()
    ours, ref = torch.empty_like(q), torch.empty_like(q)
    ref_cache = cache.clone()
    torch.ops.vllm_x86.decode_attention(ours, q, k, v, cache, slot, table, seq_lens, 0.125, 0)
    reference.decode_attention(ref, q, k, v, ref_cache, slot, table, seq_lens, 0.125, 0)
    assert torch.equal(cache, ref_cache)
    changed = (cache != before).any(dim=(1, 2, 3)).nonzero().flatten().tolist()
    assert changed == [int(slot[0]) // 32]  # only the first sequence's block
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("attn_isa", ["vec", "amx"])
@pytest.mark.parametrize("history", [3, 300], ids=["one-thread", "threads"])
def test_rows_of_one_sequence_read_the_rows_before_them(isa, history, attn_isa):
    """A speculative step's verification: several rows of one sequence, each with its own
    length and a copy of the sequence's block-table row, beside a one-row sequence. Each
    row attends to the keys and values of the rows before it, written in the same call:
    with 300 tokens of history the call is split across threads, so a row on the second
    thread must not read the slots of rows the first has not reached. The new rows' slots
    hold a stale value of 100 until written. Both KV cache layouts (the amx one on the
    AVX-512 kernels)."""
    layout = LAYOUT[attn_isa]
    if layout == 1 and isa == "avx2":
        pytest.skip("the amx KV cache layout needs the AVX-512 kernels (refused on AVX2)")
    dtype, hd, bs, kvh, g = torch.bfloat16, 64, 32, 2, 4
    cache, table, _, _, _, _, _ = _step(attn_isa, dtype, hd, bs, kvh, g, [history + 5, 40])
    rows = 4  # the verified token and 3 drafts
    lens = [history + 1 + i for i in range(rows)] + [40]
    seq_of_row = [0] * rows + [1]
    row_table = table[seq_of_row].contiguous()
    slot = last_slots(row_table, lens, bs)
    koff, voff = reference.kv_cache_offsets(layout, bs, hd)
    flat = cache.view(cache.shape[0], kvh, -1)
    for s in slot.tolist():
        flat[s // bs, :, koff[s % bs]] = 100.0
        flat[s // bs, :, voff[s % bs]] = 100.0
    gen = torch.Generator().manual_seed(7)
    qkv = torch.randn(len(lens), (kvh * g + 2 * kvh) * hd, generator=gen).to(dtype)
    q, k, v = qkv.split([kvh * g * hd, kvh * hd, kvh * hd], dim=1)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    ours_cache, ref_cache = cache.clone(), cache.clone()
    ours, ref = torch.full_like(q, float("nan")), torch.empty_like(q)
    torch.ops.vllm_x86.decode_attention(
        ours, q, k, v, ours_cache, slot, row_table, seq_lens, hd**-0.5, layout
    )
    reference.decode_attention(ref, q, k, v, ref_cache, slot, row_table, seq_lens, hd**-0.5, layout)
    assert torch.equal(ours_cache, ref_cache)
    torch.testing.assert_close(ours.float(), ref.float(), atol=ATOL[dtype], rtol=0)


def test_bad_arguments_are_refused_with_a_sentence():
    cache, table, seq_lens, slot, q, k, v = _step("vec", torch.float32, 64, 32, 2, 2, [40])
    out = torch.empty_like(q)
    op = torch.ops.vllm_x86.decode_attention
    with pytest.raises(RuntimeError, match="one dtype"):
        op(out, q.bfloat16(), k, v, cache, slot, table, seq_lens, 0.125, 0)
    too_long = torch.tensor([table.shape[1] * 32 + 1], dtype=torch.int32)
    with pytest.raises(
        RuntimeError, match=f"length {too_long.item()}, outside 1..{table.shape[1] * 32}"
    ):
        op(out, q, k, v, cache, slot, table, too_long, 0.125, 0)
    with pytest.raises(RuntimeError, match="amx KV cache layout needs bfloat16"):
        op(out, q, k, v, cache, slot, table, seq_lens, 0.125, 1)
    with pytest.raises(RuntimeError, match="outside the KV cache"):
        op(out, q, k, v, cache, torch.tensor([64 * 32]), table, seq_lens, 0.125, 0)


@pytest.mark.skipif("avx2" not in KERNEL_ISAS, reason="this CPU cannot run the AVX2 kernels")
def test_the_amx_layout_needs_the_avx512_kernels():
    cache, table, seq_lens, slot, q, k, v = _step("vec", torch.bfloat16, 64, 32, 2, 2, [40])
    kernels.set_isa("avx2")
    try:
        with pytest.raises(RuntimeError, match="AVX-512 kernels"):
            torch.ops.vllm_x86.decode_attention(
                torch.empty_like(q), q, k, v, cache, slot, table, seq_lens, 0.125, 1
            )
    finally:
        kernels.set_isa("auto")
