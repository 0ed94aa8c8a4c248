"""torch.ops.vllm_x86.decode_layer (a decode step of a Llama / Qwen2 / Qwen3 decoder layer
in one C++ call) against its reference, the same ops called one by one from Python
(ops/decoder_layer.reference_decode_layer): the layer's output, its residual stream and
the KV cache it writes must be equal bit for bit, for INT8 and INT4 weights, with and
without the float32 residual stream, for the first layer (no residual yet) and the
others, with a QKV bias (Qwen2) and without (Llama), with q/k norms (Qwen3), in both KV
cache layouts this CPU can run."""

from __future__ import annotations

import pytest
import torch

from tests.unit.conftest import last_slots
from vllm_x86.runtime.ops import kernels
from vllm_x86.runtime.ops.decoder_layer import reference_decode_layer, reference_decode_stack
from vllm_x86.runtime.quant.methods import quant_isa, quantize_pack

pytestmark = pytest.mark.skipif(
    not kernels.available() or quant_isa() is None,
    reason="needs the kernel library and AMX or AVX-512 VNNI (the INT8/INT4 kernels)",
)

H, NQ, NK, HD, INTER, BS = 128, 4, 2, 32, 192, 16
LAYOUTS = [0] + ([1] if kernels.isa() != "avx2" else [])


def _linear(gen, n, k, bits, group, bias):
    w = (torch.randn(n, k, generator=gen) * 0.05).to(torch.bfloat16)
    packed = quantize_pack(bits, "w8a16" if bits == 8 else "w4a16", w, group)
    b = torch.randn(n, generator=gen) * 0.1 if bias else None
    return [packed["weight"], packed["weight_scale"], packed.get("weight_zp"), b]


def _layer(bits, group, bias, seed=0, qk_norm=False):
    gen = torch.Generator().manual_seed(seed)
    norms = [(1 + 0.1 * torch.randn(H, generator=gen)).to(torch.bfloat16) for _ in range(2)]
    weights = norms
    weights += _linear(gen, (NQ + 2 * NK) * HD, H, bits, group, bias)
    weights += _linear(gen, H, NQ * HD, bits, group, False)
    weights += _linear(gen, 2 * INTER, H, bits, group, False)
    weights += _linear(gen, H, INTER, bits, group, False)
    pos = torch.arange(4096, dtype=torch.float32)
    inv = 1.0 / (10000 ** (torch.arange(0, HD, 2, dtype=torch.float32) / HD))
    freqs = pos[:, None] * inv[None, :]
    weights.append(torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(torch.bfloat16))
    if qk_norm:
        weights += [(1 + 0.2 * torch.randn(HD, generator=gen)).to(torch.bfloat16) for _ in "qk"]
    else:
        weights += [None, None]
    g = 0 if bits == 8 else group
    return weights, [g, g, g, g, NQ, NK, HD, 1]


def _step(m, f32res, first, seed=1):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(m, H, generator=gen).to(torch.bfloat16)
    residual = None
    if not first:
        residual = torch.randn(m, H, generator=gen)
        residual = residual if f32res else residual.to(torch.bfloat16)
    lens = torch.tensor([5, 40, 17][:m], dtype=torch.int32)
    blocks = 16
    table = torch.randperm(blocks, generator=gen)[: m * 4].view(m, 4).to(torch.int32)
    slots = last_slots(table, lens.tolist(), BS)
    cache = torch.randn(blocks, NK, BS, 2 * HD, generator=gen).to(torch.bfloat16)
    positions = (lens - 1).long()
    return hidden, residual, positions, cache, slots, table, lens


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "bits,group,bias,qk_norm",
    [
        (4, 32, False, False),
        (4, 64, True, False),
        (8, 0, True, False),
        (8, 0, False, False),
        (4, 32, False, True),
        (8, 0, False, True),
    ],
)
@pytest.mark.parametrize("f32res", [True, False])
@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("m", [1, 3])
def test_decode_layer_equals_its_ops_one_by_one(
    layout, bits, group, bias, qk_norm, f32res, first, m
):
    weights, ints = _layer(bits, group, bias, qk_norm=qk_norm)
    ints = ints + [layout, int(f32res)]
    floats = [1e-5, 1e-6, HD**-0.5, 1e-6]
    hidden, residual, positions, cache, slots, table, lens = _step(m, f32res, first)
    hidden0 = hidden.clone()
    residual0 = None if residual is None else residual.clone()
    cache_ref = cache.clone()
    out, res = torch.ops.vllm_x86.decode_layer(
        hidden, residual, positions, weights, ints, floats, cache, slots, table, lens
    )
    out_ref, res_ref = reference_decode_layer(
        hidden, residual, positions, weights, ints, floats, cache_ref, slots, table, lens
    )
    assert out.dtype == torch.bfloat16 and out.shape == (m, H)
    assert res.dtype == (torch.float32 if f32res else torch.bfloat16)
    assert torch.equal(out, out_ref)
    assert torch.equal(res, res_ref)
    assert torch.equal(cache, cache_ref)
    assert not torch.equal(cache, _step(m, f32res, first)[3])  # the step wrote its K and V
    # inputs are not written
    assert torch.equal(hidden, hidden0)
    assert residual is None or torch.equal(residual, residual0)
    assert out.isfinite().all() and res.isfinite().all()


def test_bad_arguments_are_refused_with_a_sentence():
    weights, ints = _layer(4, 32, False)
    hidden, residual, positions, cache, slots, table, lens = _step(1, True, False)
    with pytest.raises(RuntimeError, match="expects 21 weights, 10 ints and 4 floats"):
        torch.ops.vllm_x86.decode_layer(
            hidden, residual, positions, weights, ints, [1e-5], cache, slots, table, lens
        )
    bad = list(ints) + [0, 1]
    bad[4] = NQ + 1  # heads that do not match qkv_proj's output
    with pytest.raises(RuntimeError, match="qkv_proj gives 256 channels"):
        torch.ops.vllm_x86.decode_layer(
            hidden, residual, positions, weights, bad, [1e-5, 1e-5, 0.1, 0.0], cache, slots, table,
            lens,
        )  # fmt: skip
    good = list(ints) + [0, 1]
    good[7] = 0  # q/k norms (split_norm_rope_neox) with a GPT-J-style rotary embedding
    qk = weights[:19] + [weights[0][:HD], weights[0][:HD]]
    with pytest.raises(RuntimeError, match="need both norm weights and a neox rotary"):
        torch.ops.vllm_x86.decode_layer(
            hidden, residual, positions, qk, good, [1e-5, 1e-5, 0.1, 1e-6], cache, slots, table,
            lens,
        )  # fmt: skip


def test_linear_layers_are_read_by_kernel():
    """What the fused call takes of a linear layer: the INT4 kernel's tensors and group,
    the INT8 kernel's as group 0, a float32 copy of a bias; bf16 weights or another
    kernel's are refused with the reason the op table logs."""
    from vllm_x86.runtime.ops.decoder_layer import _linear_args, _linear_problem

    def linear(kernel, bias=None, **tensors):
        lin = torch.nn.Module()
        lin.x86_quantized, lin.x86_kernel, lin.x86_group, lin.bias = True, kernel, 64, bias
        for name, t in tensors.items():
            setattr(lin, name, t)
        return lin

    w, s, z = torch.zeros(2, 8, dtype=torch.uint8), torch.ones(4), torch.zeros(4, dtype=torch.uint8)
    args, group = _linear_args(linear("w4a16", weight=w, weight_scale=s, weight_zp=z))
    assert group == 64 and args[0] is w and args[1] is s and args[2] is z and args[3] is None
    b = torch.ones(4, dtype=torch.bfloat16)
    args, group = _linear_args(linear("w8a16", bias=b, weight=w, weight_scale=s))
    assert group == 0 and args[2] is None
    assert args[3].dtype == torch.float32 and torch.equal(args[3], b.float())
    assert _linear_problem(linear("w4a16", weight=w)) is None
    assert _linear_problem(linear("w8a16", weight=w)) is None
    assert "bf16 or another kernel's weights" in _linear_problem(linear("vllm", weight=w))
    bf16 = linear("w4a16", weight=w)
    bf16.x86_quantized = False
    assert "bf16 or another kernel's weights" in _linear_problem(bf16)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("f32res", [True, False])
@pytest.mark.parametrize("m", [1, 3])
def test_decode_stack_equals_its_layers_one_by_one(layout, f32res, m):
    """torch.ops.vllm_x86.decode_stack (the layers of a stack one after another in one
    call) against decode_layer called layer by layer and against its reference (the ops
    one by one from Python): the last output, the residual stream and every layer's KV
    cache equal bit for bit; layers of INT4 and INT8 weights, with and without q/k norms,
    mixed."""
    layers = [
        _layer(4, 32, False, seed=0),
        _layer(8, 0, True, seed=1),
        _layer(4, 64, False, seed=2, qk_norm=True),
    ]
    ints = [i + [layout, int(f32res)] for _, i in layers]
    floats = [[1e-5, 1e-6, HD**-0.5, 1e-6]] * len(layers)
    hidden, _, positions, cache, slots, table, lens = _step(m, f32res, True)
    caches = [cache.clone() for _ in layers]
    ref_caches = [cache.clone() for _ in layers]
    out, res = torch.ops.vllm_x86.decode_stack(
        hidden, positions, [w for ws, _ in layers for w in ws], [x for i in ints for x in i],
        [x for f in floats for x in f], caches, slots, table, lens,
    )  # fmt: skip
    h, r = hidden, None
    for (weights, _), i, f, c in zip(layers, ints, floats, ref_caches):
        h, r = torch.ops.vllm_x86.decode_layer(
            h, r, positions, weights, i, f, c, slots, table, lens
        )
    assert torch.equal(out, h) and torch.equal(res, r)
    assert res.dtype == (torch.float32 if f32res else torch.bfloat16)
    for got, want in zip(caches, ref_caches):
        assert torch.equal(got, want)
        assert not torch.equal(got, cache)  # each layer wrote its own K and V
    # and its reference, the ops one by one from Python
    py_caches = [cache.clone() for _ in layers]
    h, r = reference_decode_stack(
        hidden, positions, [w for ws, _ in layers for w in ws], [x for i in ints for x in i],
        [x for f in floats for x in f], py_caches, slots, table, lens,
    )  # fmt: skip
    assert torch.equal(out, h) and torch.equal(res, r)
    assert all(torch.equal(a, b) for a, b in zip(caches, py_caches))
    with pytest.raises(RuntimeError, match="expects 21 weights, 10 ints and 4 floats for each"):
        torch.ops.vllm_x86.decode_stack(
            hidden, positions, layers[0][0], ints[0], floats[0], caches, slots, table, lens
        )


def test_a_step_of_several_tokens_per_sequence_is_a_decode_step_per_token():
    """With speculative decoding a step brings a few tokens per sequence (a verification):
    the fused call takes it where allowed (_decode_rows), each row with its sequence's
    block-table row and its position + 1 tokens (_row_metadata). Its outputs and KV
    caches equal the ops one by one from Python on the same rows, and, within the
    GEMMs' row-count rounding, decoding the same tokens one step at a time."""
    from types import SimpleNamespace

    from vllm_x86.runtime.ops import decoder_layer as dl

    layers = [_layer(4, 32, False, seed=0), _layer(8, 0, True, seed=1)]
    ints = [x for _, i in layers for x in i + [0, 1]]
    floats = [1e-5, 1e-6, HD**-0.5, 1e-6] * len(layers)
    weights = [w for ws, _ in layers for w in ws]
    gen = torch.Generator().manual_seed(3)
    table = torch.randperm(16, generator=gen)[:8].view(2, 4).to(torch.int32)
    # sequence 0: 20 tokens cached, 2 new (positions 20, 21); sequence 1: 9 cached, 1 new
    positions = torch.tensor([20, 21, 9])
    md = SimpleNamespace(
        num_actual_tokens=3, max_query_len=2, query_start_loc=torch.tensor([0, 2, 3], dtype=torch.int32),
        seq_lens=torch.tensor([22, 10], dtype=torch.int32), block_table=table, causal=True,
        dynamic_causal=None,
    )  # fmt: skip
    assert not dl._decode_rows(md, 3)  # without speculation: the layers' own code
    dl.allow_rows_per_sequence(3)
    try:
        assert dl._decode_rows(md, 3) and not dl._decode_rows(md, 4)
        rows_table, rows_lens = dl._row_metadata(md, positions)
    finally:
        dl.allow_rows_per_sequence(1)
    assert rows_lens.tolist() == [21, 22, 10] and rows_lens.dtype == torch.int32
    assert torch.equal(rows_table, table[[0, 0, 1]])
    slots = last_slots(rows_table, rows_lens.tolist(), BS)  # each row's own position
    hidden = torch.randn(3, H, generator=gen).to(torch.bfloat16)
    cache = torch.randn(16, NK, BS, 2 * HD, generator=gen).to(torch.bfloat16)
    caches, py_caches, one_caches = ([cache.clone() for _ in layers] for _ in range(3))
    out, res = torch.ops.vllm_x86.decode_stack(
        hidden, positions, weights, ints, floats, caches, slots, rows_table, rows_lens
    )
    h, r = reference_decode_stack(
        hidden, positions, weights, ints, floats, py_caches, slots, rows_table, rows_lens
    )
    assert torch.equal(out, h) and torch.equal(res, r)
    assert all(torch.equal(a, b) for a, b in zip(caches, py_caches))
    for i in range(3):  # the same tokens, one decode step each, in order
        o, _ = torch.ops.vllm_x86.decode_stack(
            hidden[i : i + 1], positions[i : i + 1], weights, ints, floats, one_caches,
            slots[i : i + 1], rows_table[i : i + 1], rows_lens[i : i + 1],
        )  # fmt: skip
        torch.testing.assert_close(out[i : i + 1].float(), o.float(), atol=0.05, rtol=0.02)
    for a, b in zip(caches, one_caches):
        torch.testing.assert_close(a.float(), b.float(), atol=0.05, rtol=0.02)
