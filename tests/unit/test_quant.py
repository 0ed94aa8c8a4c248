"""x86_int8 / x86_int4: quantizers, kernels against a float32 dequantize-then-matmul
reference, the prepacked format's assumptions, the converter and its error messages.

Tolerances (relative Frobenius error of the layer output, ||y - y_ref|| / ||y_ref||):
- PyTorch's weight-only kernels (no AMX, VLLM_X86_QUANT_KERNEL=torch) against the
  dequantized weight times the bf16 activations: 1e-2 (bf16 rounding of the output).
- the plugin's INT8 kernel (int8_w8a16_gemm: 16-bit activations per token) against the
  same reference: 5e-3 (measured about 2e-3, the bf16 rounding of the output).
- vLLM's AMX kernels, which quantize the activations per token to 8 bits (INT4, and
  INT8 with VLLM_X86_QUANT_KERNEL=vllm): against the same reference 2e-2 (measured
  0.8-0.9e-2); against a reference that quantizes the activations the same way
  (symmetric per token, amax/127), 5e-3 (measured 1.7-1.9e-3). A packing or scale error
  gives errors near 1.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.unit.conftest import AMX, needs_amx, needs_quant_kernels
from vllm_x86.runtime.quant import linear as lin
from vllm_x86.runtime.quant import methods as m

SHAPES = [(256, 576), (1024, 1024), (576, 1536), (192, 576)]  # SmolLM2 and Qwen3 layers
ROWS = [1, 8, 32, 64]
ODD_ROWS = [3, 17, 100]  # ragged row tiles of the INT8 kernel


def _rel(y, ref) -> float:
    return float((y.float() - ref).norm() / ref.norm())


def _act_quant(x: torch.Tensor) -> torch.Tensor:
    s = x.float().abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127.0
    return torch.round(x.float() / s).clamp(-127, 127) * s


class _Layer(torch.nn.Module):
    pass


def _layer(w: torch.Tensor, method) -> _Layer:
    layer = _Layer()
    n, k = w.shape
    layer.x86_shape = (n, k)
    layer.x86_quantized = True
    method.quantize_and_pack(layer, w)
    return layer


class _Cfg:
    def __init__(self, group_size=128, zero_point=False):
        self.group_size = group_size
        self.zero_point = zero_point
        self.prepacked = False

    def get_name(self):
        return "test"


def _data(n, k, rows, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16)
    x = torch.randn(rows, k, generator=g).to(torch.bfloat16)
    return w, x


# ------------------------------------------------------------------ quantizers


def test_int8_quantizer_error_is_half_a_step():
    w, _ = _data(256, 576, 1)
    q, scale = m.quantize_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (256,)
    err = (m.dequantize_int8(q, scale) - w.float()).abs()
    assert (err <= scale[:, None] / 2 + 1e-6).all()


@pytest.mark.parametrize("zero_point", [False, True])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_quantizer_error_is_half_a_step(group, zero_point):
    w, _ = _data(64, 256, 1)
    # min/max rounding (the default search may clip a group's smaller side on purpose:
    # tests/unit/test_int4_rounding.py)
    q, scale, zero = m.quantize_int4(w, group, zero_point, "minmax")
    assert int(q.min()) >= 0 and int(q.max()) <= 15
    deq = m.dequantize_int4(q, scale, zero, group)
    step = scale.t().float().repeat_interleave(group, dim=1)
    # symmetric: half a step; asymmetric: the rounded zero point can shift the grid by
    # half a step, so the largest value of a group may be off by up to one step
    bound = step if zero_point else step / 2
    assert ((deq - w.float()).abs() <= bound + 1e-6).all()


def test_effective_group_size_falls_back_for_576():
    assert m.effective_group_size(576, 128) == 64
    assert m.effective_group_size(1024, 128) == 128
    assert m.effective_group_size(96, 128) == 32
    assert m.effective_group_size(40, 128) is None


# ------------------------------------------------------------------ kernels


@needs_quant_kernels
@pytest.mark.parametrize("rows", ROWS + ODD_ROWS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_int8_amx_kernel_matches_reference(n, k, rows):
    from vllm_x86.runtime.ops import reference

    w, x = _data(n, k, rows)
    x[0, 5] = 60.0  # an outlier sets the row's 16-bit step
    layer = _layer(w, lin.X86Int8Linear(_Cfg()))
    assert layer.x86_kernel == "w8a16"
    y = lin.X86Int8Linear(_Cfg()).matmul(layer, x, None)
    q, scale = m.quantize_int8(w)
    wd = m.dequantize_int8(q, scale)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, n)
    assert _rel(y, reference.kernel_activations(x) @ wd.t()) < 5e-3
    assert _rel(y, x.float() @ wd.t()) < 2e-2  # 8-bit activations included


def _vnni() -> bool:
    from vllm_x86.runtime.hardware import cpu_info

    return cpu_info().has("avx512_vnni")


@pytest.mark.skipif(
    not (AMX and _vnni()), reason="needs a CPU with both AMX and AVX-512 VNNI to compare them"
)
@pytest.mark.parametrize("rows", [1, 2, 3, 17, 100])
def test_vnni_kernels_equal_the_amx_kernels_bit_for_bit(rows):
    """csrc/vnni_gemm.cpp forms the same int32 sums as the AMX kernel (unsigned weights
    and a per-token correction instead of tdpbssd) and the same float32 epilogue, so the
    two give the same bits, zero rows, NaN rows and bias included (16-bit activations at
    every row count: the VNNI kernels' 8-bit ones are off here)."""
    import vllm_x86.runtime._C as C

    m.check_plugin_kernels()
    a8_rows, vnni_rows = C.quant_a8_rows(), C.quant_vnni_rows()
    C.set_quant_a8_rows(0)
    C.set_quant_vnni_rows(0)  # AMX's own INT4 kernel at 1 and 2 rows too
    n, k = 192, 1024
    w, x = _data(n, k, rows)
    x[0, 5] = 60.0
    if rows > 2:
        x[1] = 0
        x[2, 7] = float("nan")
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n + 1))  # order-independent
    p8 = m.pack_int8_w8a16(m.quantize_int8(w)[0]), m.quantize_int8(w)[1]
    outs = {}
    try:
        for isa in ("amx", "avx512_vnni"):
            C.set_quant_isa(isa)
            got = [torch.ops.vllm_x86.int8_w8a16_gemm(x, *p8, bias)]
            for group, zp in ((32, True), (64, True), (128, False)):
                p4 = m.pack_int4_w4a16(*m.quantize_int4(w, group, zp))
                got.append(torch.ops.vllm_x86.int4_w4a16_gemm(x, *p4, group, bias))
            outs[isa] = got
    finally:
        C.set_quant_isa("auto")
        C.set_quant_a8_rows(a8_rows)
        C.set_quant_vnni_rows(vnni_rows)
    for a, b in zip(outs["amx"], outs["avx512_vnni"], strict=True):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.skipif(
    not (AMX and _vnni()), reason="needs a CPU with both AMX and AVX-512 VNNI to choose between"
)
def test_int4_decode_rows_run_the_vnni_kernel_on_amx():
    """With AMX chosen, INT4 GEMMs of up to VLLM_X86_QUANT_VNNI_ROWS rows (2) run the VNNI
    kernel, more rows AMX; 0 keeps AMX at every row count; with the VNNI kernels chosen
    every row count runs VNNI. (The two give the same bits: the test above.)"""
    import vllm_x86.runtime._C as C

    m.check_plugin_kernels()
    rows = C.quant_vnni_rows()
    try:
        C.set_quant_isa("amx")
        assert rows == 2
        assert [C.int4_kernel(r) for r in (1, 2, 3, 16)] == ["avx512_vnni"] * 2 + ["amx"] * 2
        C.set_quant_vnni_rows(0)
        assert C.int4_kernel(1) == "amx"
        C.set_quant_vnni_rows(5)
        assert C.int4_kernel(5) == "avx512_vnni" and C.int4_kernel(6) == "amx"
        C.set_quant_isa("avx512_vnni")
        assert C.int4_kernel(100) == "avx512_vnni"
        with pytest.raises(RuntimeError, match="expected 0 .never. or a row count"):
            C.set_quant_vnni_rows(-1)
    finally:
        C.set_quant_isa("auto")
        C.set_quant_vnni_rows(rows)


def _int_ops(x, w, bias):
    """The INT8 op and the INT4 op (groups of 32 and 64 with zero points, 128 without) on x."""
    q, scale = m.quantize_int8(w)
    outs = [torch.ops.vllm_x86.int8_w8a16_gemm(x, m.pack_int8_w8a16(q), scale, bias)]
    for group, zp in ((32, True), (64, True), (128, False)):
        p4 = m.pack_int4_w4a16(*m.quantize_int4(w, group, zp))
        outs.append(torch.ops.vllm_x86.int4_w4a16_gemm(x, *p4, group, bias))
    return outs


def _int_refs(x, w, bias):
    """_int_ops' float32 references (ops/reference.py, 8-bit activations modelled)."""
    from vllm_x86.runtime.ops import reference

    q, scale = m.quantize_int8(w)
    refs = [reference.int8_w8a16_gemm(x, m.pack_int8_w8a16(q), scale, bias)]
    for group, zp in ((32, True), (64, True), (128, False)):
        p4 = m.pack_int4_w4a16(*m.quantize_int4(w, group, zp))
        refs.append(reference.int4_w4a16_gemm(x, *p4, group, bias))
    return refs


@needs_quant_kernels
@pytest.mark.parametrize("rows", [1, 2, 3, 5])
@pytest.mark.parametrize("n", [16, 32, 48, 80, 112])
def test_quantized_kernels_on_ragged_channel_blocks(n, rows):
    """The kernels take 4 blocks of 16 channels a step and 1 or 2 tokens (VNNI) or 8
    (AMX): every remainder of channel blocks (1, 2, 3) and of tokens against the
    float32 reference, INT8 and INT4 with and without zero points, with bias."""
    m.check_plugin_kernels()
    k = 256
    w, x = _data(n, k, rows, seed=n + rows)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n + 1))  # order-independent
    for y, ref in zip(_int_ops(x, w, bias), _int_refs(x, w, bias), strict=True):
        assert _rel(y, ref.float()) < 5e-3


@pytest.fixture
def vnni_a8():
    """The AVX-512 VNNI kernels with 8-bit activations from 4 rows (the default), also on
    a CPU with AMX; both settings restored afterwards."""
    import vllm_x86.runtime._C as C

    if not _vnni():
        pytest.skip("the 8-bit-activation kernels need AVX-512 VNNI")
    m.check_plugin_kernels()
    isa, rows = C.quant_isa(), C.quant_a8_rows()
    C.set_quant_isa("avx512_vnni")
    C.set_quant_a8_rows(4)
    yield C
    C.set_quant_isa(isa)
    C.set_quant_a8_rows(rows)


@pytest.mark.parametrize("rows", [4, 5, 6, 7, 8, 17, 64, 100])
@pytest.mark.parametrize("n", [16, 48, 80, 1024])
def test_a8_kernels_match_their_reference(vnni_a8, n, rows):
    """From 4 rows the VNNI kernels round each group of 64 inputs to 8 bits with its own
    scale: every tile of 4 tokens, every tail (1-3 tokens), every remainder of channel
    blocks, raw and (from 64 rows) expanded INT4 blocks, against the float32 reference
    that rounds the activations the same way; within 2e-2 of unrounded activations
    despite an outlier (it coarsens only its own group)."""
    from vllm_x86.runtime.ops import reference

    k = 1024
    w, x = _data(n, k, rows, seed=n * rows)
    x[0, 5] = 60.0
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n + 1))  # order-independent
    assert reference.takes_a8(rows)
    for y, ref in zip(_int_ops(x, w, bias), _int_refs(x, w, bias), strict=True):
        assert y.dtype == torch.bfloat16 and y.shape == (rows, n)
        # both rounded to bf16: where they round apart, one unit in the last place (2^-8
        # relative); 16 channels x 4 rows measured up to 3.4e-3 over 30 biases
        assert _rel(y, ref.float()) < 4e-3
    q, scale = m.quantize_int8(w)
    exact = x.float() @ m.dequantize_int8(q, scale).t() + bias
    assert _rel(_int_ops(x, w, bias)[0], exact) < 2e-2


@pytest.mark.parametrize("n", [16, 48, 80, 1024])
def test_a8_kernels_on_one_row(vnni_a8, n):
    """One row with 8-bit activations (VLLM_X86_QUANT_A8_ROWS=1) goes one channel block
    at a time instead of 4 side by side: against the float32 reference that
    rounds the activations the same way, INT8 and INT4 with and without zero points,
    every remainder of the 4-block unit, with an outlier."""
    from vllm_x86.runtime.ops import reference

    C = vnni_a8
    C.set_quant_a8_rows(1)
    w, x = _data(n, 1024, 1, seed=n)
    x[0, 5] = 60.0
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n + 1))  # order-independent
    assert reference.takes_a8(1)
    for y, ref in zip(_int_ops(x, w, bias), _int_refs(x, w, bias), strict=True):
        assert y.dtype == torch.bfloat16 and y.shape == (1, n)
        assert _rel(y, ref.float()) < 3e-3
    q, scale = m.quantize_int8(w)
    exact = x.float() @ m.dequantize_int8(q, scale).t() + bias
    assert _rel(_int_ops(x, w, bias)[0], exact) < 2e-2


def test_a8_rows_setting_switches_at_its_row_count(vnni_a8):
    """Below VLLM_X86_QUANT_A8_ROWS rows the ops give the 16-bit kernels' bits, from it
    on other ones (8-bit activations); 0 never switches; a bad setting is a sentence."""
    from vllm_x86.runtime.ops import kernels

    C = vnni_a8
    w, x = _data(192, 1024, 6)
    bias = torch.randn(192)

    def run(rows_setting, xs):
        C.set_quant_a8_rows(rows_setting)
        return [y.view(torch.int16) for y in _int_ops(xs, w, bias)]

    for rows in (3, 4, 6):
        xs = x[:rows].contiguous()
        a16 = run(0, xs)
        got = run(4, xs)
        same = [torch.equal(a, b) for a, b in zip(a16, got, strict=True)]
        assert same == [rows < 4] * 4, (rows, same)
        assert [torch.equal(a, b) for a, b in zip(run(rows + 1, xs), a16, strict=True)] == [
            True
        ] * 4
    with pytest.raises(RuntimeError, match="expected 0 .never. or a row count"):
        C.set_quant_a8_rows(-1)
    for bad in ("-2", "four"):
        os.environ["VLLM_X86_QUANT_A8_ROWS"] = bad
        try:
            with pytest.raises(ValueError, match="VLLM_X86_QUANT_A8_ROWS=.*expected a row count"):
                kernels.a8_rows()
        finally:
            del os.environ["VLLM_X86_QUANT_A8_ROWS"]


def test_a8_kernels_zero_and_nan_rows(vnni_a8):
    """With 8-bit activations a zero row gives the bias, a row holding NaN gives NaN (as
    a float matmul), and the other rows match the reference."""
    w, x = _data(64, 256, 6)
    x[1] = 0
    x[2, 7] = float("nan")
    x[4, 70] = float("inf")
    bias = torch.randn(64)
    for y, ref in zip(_int_ops(x, w, bias), _int_refs(x, w, bias), strict=True):
        assert torch.equal(y[1], bias.to(torch.bfloat16))
        assert y[2].isnan().all() and y[4].isnan().all()
        for r in (0, 3, 5):
            assert _rel(y[r], ref[r].float()) < 3e-3


def test_quant_isa_choice_is_explained():
    """The plugin's INT8/INT4 kernels say which ISA runs them, and refuse one the CPU
    lacks with a sentence."""
    import vllm_x86.runtime._C as C

    from vllm_x86.runtime.ops import kernels

    if not kernels.available():
        pytest.skip(f"the plugin's kernels did not load: {kernels.load_error()}")
    isa = C.quant_isa()
    assert isa == ("amx" if AMX else "avx512_vnni" if _vnni() else "")
    assert m.quant_isa() == (isa or None)
    with pytest.raises(RuntimeError, match="expected auto, amx or avx512_vnni"):
        C.set_quant_isa("avx2")
    if not AMX:
        with pytest.raises(RuntimeError, match="the AMX kernels cannot run here"):
            C.set_quant_isa("amx")
    assert C.quant_isa() == isa


@needs_amx
@pytest.mark.parametrize("rows", ROWS)
def test_int8_w8a8_kernel_matches_reference(rows, monkeypatch):
    monkeypatch.setenv("VLLM_X86_QUANT_KERNEL", "vllm")
    n, k = 1024, 1024
    w, x = _data(n, k, rows)
    layer = _layer(w, lin.X86Int8Linear(_Cfg()))
    assert layer.x86_kernel == "vllm"
    y = lin.X86Int8Linear(_Cfg()).matmul(layer, x, None)
    wd = m.dequantize_int8(*m.quantize_int8(w))
    assert _rel(y, _act_quant(x) @ wd.t()) < 5e-3
    assert _rel(y, x.float() @ wd.t()) < 2e-2


@needs_quant_kernels
def test_int8_kernel_reference_and_special_rows():
    """The op against its reference in ops/reference.py: a zero row gives zeros, a row
    holding NaN gives NaN (as a float matmul), other rows are unaffected."""
    from vllm_x86.runtime.ops import reference

    m.check_plugin_kernels()
    w, x = _data(64, 128, 4)
    x[1] = 0
    x[2, 7] = float("nan")
    q, scale = m.quantize_int8(w)
    packed = m.pack_int8_w8a16(q)
    bias = torch.randn(64)
    y = torch.ops.vllm_x86.int8_w8a16_gemm(x, packed, scale, bias)
    ref = reference.int8_w8a16_gemm(x, packed, scale, bias)
    assert torch.equal(y[1], bias.to(torch.bfloat16))
    assert y[2].isnan().all()
    for r in (0, 3):
        assert _rel(y[r], ref[r].float()) < 5e-3
    with pytest.raises(RuntimeError, match="K must be a multiple of 64"):
        torch.ops.vllm_x86.int8_w8a16_gemm(x[:, :96], packed, scale, None)


@needs_quant_kernels
def test_int8_amx_kernel_bias():
    w, x = _data(256, 576, 8)
    bias = torch.randn(256)
    layer = _layer(w, lin.X86Int8Linear(_Cfg()))
    y0 = lin.X86Int8Linear(_Cfg()).matmul(layer, x, None)
    y1 = lin.X86Int8Linear(_Cfg()).matmul(layer, x, bias)
    assert _rel(y1.float() - y0.float(), bias.expand(8, -1)) < 1e-2


@needs_quant_kernels
@pytest.mark.parametrize("zero_point", [False, True])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("rows", ROWS)
def test_int4_amx_kernel_matches_reference(rows, group, zero_point):
    from vllm_x86.runtime.ops import reference

    n, k = 1024, 1024
    w, x = _data(n, k, rows)
    cfg = _Cfg(group, zero_point)
    layer = _layer(w, lin.X86Int4Linear(cfg))
    y = lin.X86Int4Linear(cfg).matmul(layer, x, None)
    wd = m.dequantize_int4(*m.quantize_int4(w, group, zero_point), group)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, n)
    # the plugin's kernel, 16-bit activations (8-bit for batches on VNNI); groups of 32
    # with zero points in eighths
    assert layer.x86_kernel == "w4a16"
    assert layer.x86_group == group
    xa = reference.kernel_activations(x)
    assert _rel(y, xa @ wd.t()) < 5e-3
    assert _rel(y, x.float() @ wd.t()) < 2e-2


@needs_quant_kernels
def test_int4_layer_keeps_a_4bit_grid(monkeypatch):
    """A weight already on a 4-bit grid of groups of 32 (a dequantized Q4_1) is stored in
    groups of 32 with zero points in eighths, and the layer's output is the grid
    weight's within the activations' rounding; rounded again into groups of 128
    (VLLM_X86_QUANT_INT4_GRID=0) it is several times further off."""
    from tests.helpers.grid_model import q4_1

    w, x = _data(256, 512, 5)
    w = q4_1(w)
    want = x.float() @ w.float().t()
    cfg = _Cfg(128, True)
    layer = _layer(w, lin.X86Int4Linear(cfg))
    assert layer.x86_group == 32 and layer.x86_kernel == "w4a16"
    kept = _rel(lin.X86Int4Linear(cfg).matmul(layer, x, None), want)
    monkeypatch.setenv("VLLM_X86_QUANT_INT4_GRID", "0")
    again = _layer(w, lin.X86Int4Linear(cfg))
    assert again.x86_group == 128
    regrouped = _rel(lin.X86Int4Linear(cfg).matmul(again, x, None), want)
    assert kept < 2e-2 and kept * 4 < regrouped


@needs_quant_kernels
@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("bits,group,zero_point", [(8, 128, False), (4, 128, True), (4, 64, False)])
def test_lm_head_method_matches_reference(bits, group, zero_point, rows):
    """VLLM_X86_QUANT_LM_HEAD=1 / int4 (lm_head.py): logits from the quantized LM head
    against x @ W^T with W its quantized-then-dequantized values (scope.fake_quantize,
    the conformance reference), SmolLM2's head shape (49152 x 576: groups of 64)."""
    from vllm_x86.runtime.ops import reference
    from vllm_x86.runtime.quant import scope
    from vllm_x86.runtime.quant.lm_head import X86LMHeadMethod

    n, k = 49152, 576
    w, x = _data(n, k, rows, seed=3)
    layer = _Layer()
    layer.weight = torch.nn.Parameter(w.clone(), requires_grad=False)
    method = X86LMHeadMethod(bits, group, zero_point)
    method.process_weights_after_loading(layer)
    assert layer.x86_lm_head
    g = m.effective_group_size(k, group)
    plan = scope.plan("lm_head", n, k, 4, group, lm_head=bits)
    assert plan == scope.Plan(bits, g if bits == 4 else None)
    wd = scope.fake_quantize(w, plan, zero_point, scope.LM_HEAD)
    y = method.apply(layer, x[None])  # [1, rows, n]: batch dimensions are kept
    assert y.shape == (1, rows, n) and y.dtype == torch.bfloat16
    ref = reference.kernel_activations(x) if rows >= 4 else x.float()
    assert _rel(y[0], ref @ wd.t()) < 5e-3
    assert _rel(y[0], x.float() @ wd.t()) < 2e-2


def _head(w: torch.Tensor, bits: int = 8):
    """A ParallelLMHead with an INT8/INT4 X86LMHeadMethod, without vLLM's parallel set-up."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    from vllm_x86.runtime.quant.lm_head import X86LMHeadMethod

    head = ParallelLMHead.__new__(ParallelLMHead)
    torch.nn.Module.__init__(head)
    head.weight = w if isinstance(w, torch.nn.Parameter) else torch.nn.Parameter(w, False)
    head.quant_method = X86LMHeadMethod(bits, 128, True)
    head.quant_method.process_weights_after_loading(head)
    return head


class _Model(torch.nn.Module):
    def __init__(self, embed, head, input_embedding=None):
        super().__init__()
        self.embed, self.head = embed, head
        self._input = input_embedding if input_embedding is not None else embed

    def get_input_embeddings(self):
        return self._input


@needs_quant_kernels
@pytest.mark.parametrize("bits", [8, 4])
def test_an_untied_quantized_heads_bf16_weight_is_freed_a_shared_one_kept(bits):
    from vllm_x86.runtime.quant.lm_head import release_unshared_weights

    n, k = 1024, 256
    w, x = _data(n, k, 3, seed=5)
    embed = _Layer()
    embed.weight = torch.nn.Parameter(w.clone(), requires_grad=False)
    # untied: the head's own weight, not read again after quantization
    head = _head(w.clone(), bits)
    before = head.quant_method.apply(head, x)
    assert release_unshared_weights(_Model(embed, head)) == n * k * 2
    assert head.weight.shape == (0, k) and embed.weight.shape == (n, k)
    assert torch.equal(head.quant_method.apply(head, x), before)
    from vllm_x86.runtime.ops.logits import head_weight

    assert head_weight(head, x) is None
    # tied: the head's weight is the embedding's table
    tied = _head(embed.weight, bits)
    assert release_unshared_weights(_Model(embed, tied)) == 0
    assert tied.weight.shape == (n, k) and tied.weight is embed.weight
    # the head module is the model's input embedding
    own = _head(w.clone(), bits)
    assert release_unshared_weights(_Model(embed, own, input_embedding=own)) == 0
    assert own.weight.shape == (n, k)


def test_lm_head_setting_values():
    from vllm_x86.runtime.quant import scope

    assert [scope.lm_head_bits(v) for v in ("", "0", "1", "int8", "INT4", "4", True, None)] == [
        0,
        0,
        8,
        8,
        4,
        4,
        8,
        0,
    ]
    with pytest.raises(ValueError, match="VLLM_X86_QUANT_LM_HEAD must be"):
        scope.lm_head_bits("int2")
    assert scope.weight_bits(scope.LM_HEAD, 8, lm_head=4) == 4
    assert scope.options(8, 128, True, "int4") == (128, True, 4)  # zero points for the head
    assert scope.options(8, 128, True, "1") == (128, False, 8)
    # a head the plugin's INT4 kernel cannot take stays in bf16, with the reason
    assert "K of 64" in m.lm_head_bf16_reason(49152, 96, 4, 64)
    assert m.lm_head_bf16_reason(49152, 576, 4, 32) is None  # groups of 32: the plugin's too
    assert m.lm_head_bf16_reason(49152, 576, 4, 128) is None


@needs_quant_kernels
@pytest.mark.parametrize("rows", ODD_ROWS)
@pytest.mark.parametrize("n,k,group", [(576, 576, 64), (192, 576, 64), (1024, 3072, 128)])
def test_int4_w4a16_kernel_against_its_reference(n, k, group, rows):
    from vllm_x86.runtime.ops import reference

    w, x = _data(n, k, rows)
    x[-1, 3] = -50.0
    packed = m.pack_int4_w4a16(*m.quantize_int4(w, group, True))
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n + 1))  # order-independent
    y = torch.ops.vllm_x86.int4_w4a16_gemm(x, *packed, group, bias)
    ref = reference.int4_w4a16_gemm(x, *packed, group, bias)
    assert _rel(y, ref.float()) < 5e-3


@needs_amx
@pytest.mark.parametrize("group", [128, 32])
def test_int4_vllm_kernel_on_request(monkeypatch, group):
    """VLLM_X86_QUANT_KERNEL=vllm: vLLM's W4A8 kernel, 8-bit activations; groups of 32
    with integer zero points there (its packing holds no eighths)."""
    monkeypatch.setenv("VLLM_X86_QUANT_KERNEL", "vllm")
    w, x = _data(1024, 1024, 8)
    cfg = _Cfg(group, True)
    layer = _layer(w, lin.X86Int4Linear(cfg))
    assert layer.x86_kernel == "vllm"
    y = lin.X86Int4Linear(cfg).matmul(layer, x, None)
    q, s, z = m.quantize_int4(w, group, True, fine=False)
    assert z.dtype == torch.int32
    assert _rel(y, _act_quant(x) @ m.dequantize_int4(q, s, z, group).t()) < 5e-3


@pytest.mark.parametrize("rows", ROWS)
def test_torch_weight_only_kernels_match_reference(rows, monkeypatch):
    monkeypatch.setenv("VLLM_X86_QUANT_KERNEL", "torch")
    n, k = 256, 1024
    w, x = _data(n, k, rows)
    layer = _layer(w, lin.X86Int8Linear(_Cfg()))
    assert layer.x86_kernel == "torch"
    y = lin.X86Int8Linear(_Cfg()).matmul(layer, x, None)
    assert _rel(y, x.float() @ m.dequantize_int8(*m.quantize_int8(w)).t()) < 1e-2
    cfg = _Cfg(128, True)
    layer = _layer(w, lin.X86Int4Linear(cfg))
    y = lin.X86Int4Linear(cfg).matmul(layer, x, None)
    wd = m.dequantize_int4(*m.quantize_int4(w, 128, True), 128)
    assert _rel(y, x.float() @ wd.t()) < 1e-2


@needs_quant_kernels
def test_packing_a_concatenation_is_concatenating_the_packs():
    """The prepacked format stores q_proj, k_proj, ... packed separately and lets vLLM's
    loaders place them in the fused layer: correct only if this holds."""
    a, _ = _data(96, 576, 1, seed=1)
    b, _ = _data(64, 576, 1, seed=2)
    qa, _ = m.quantize_int8(a)
    qb, _ = m.quantize_int8(b)
    for pack in (m.pack_int8, m.pack_int8_w8a16):
        assert torch.equal(pack(torch.cat([qa, qb])), torch.cat([pack(qa), pack(qb)]))
    qc, _ = m.quantize_int8(_data(48, 576, 1, seed=3)[0])  # 16-channel blocks suffice
    assert torch.equal(
        m.pack_int8_w8a16(torch.cat([qa, qc])),
        torch.cat([m.pack_int8_w8a16(qa), m.pack_int8_w8a16(qc)]),
    )
    ra, rb = m.quantize_int4(a, 64, True), m.quantize_int4(b, 64, True)
    fused = m.pack_int4(
        torch.cat([ra[0], rb[0]]), torch.cat([ra[1], rb[1]], 1), torch.cat([ra[2], rb[2]], 1)
    )
    for f, pa, pb in zip(fused, m.pack_int4(*ra), m.pack_int4(*rb), strict=True):
        assert torch.equal(f, torch.cat([pa, pb]))
    fused = m.pack_int4_w4a16(
        torch.cat([ra[0], rb[0]]), torch.cat([ra[1], rb[1]], 1), torch.cat([ra[2], rb[2]], 1)
    )
    for f, pa, pb in zip(fused, m.pack_int4_w4a16(*ra), m.pack_int4_w4a16(*rb), strict=True):
        assert torch.equal(f, torch.cat([pa, pb]))


# ------------------------------------------------------------------ format checks


def test_format_version_and_layout_mismatch_are_clear_errors():
    from vllm_x86.runtime.quant import format as qf

    good = {
        "quant_method": "x86_int8",
        "prepacked": True,
        "format_version": qf.FORMAT_VERSION,
        "layout": qf.expected_layout("x86_int8"),
    }
    qf.check_config(good, "x86_int8")
    with pytest.raises(qf.FormatError, match="format version 99.*quantize"):
        qf.check_config({**good, "format_version": 99}, "x86_int8")
    with pytest.raises(qf.FormatError, match="packed as 'other'"):
        qf.check_config({**good, "layout": "other"}, "x86_int8")


# ------------------------------------------------------------------ converter


@needs_quant_kernels
@pytest.mark.parametrize("bits", [8, 4])
def test_converter_writes_a_prepacked_checkpoint(tiny_bf16, tmp_path, bits):
    from safetensors import safe_open

    from vllm_x86.runtime.quant import format as qf
    from vllm_x86.tools.quantize.convert import quantize_checkpoint

    out = tmp_path / f"int{bits}"
    lines: list[str] = []
    manifest = quantize_checkpoint(tiny_bf16, out, bits, progress=lines.append)
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == f"x86_int{bits}" and cfg["prepacked"] is True
    assert cfg["format_version"] == qf.FORMAT_VERSION
    assert len(cfg["quantized_layers"]) == 2 * 7  # q k v o gate up down, 2 layers
    assert (out / "tokenizer_config.json").is_file()
    assert manifest["files"]["model.safetensors"]["bytes"] == os.path.getsize(
        out / "model.safetensors"
    )
    assert any("serve it with" in line for line in lines)
    qf.check_files(str(out))
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        qw = f.get_tensor("model.layers.0.self_attn.q_proj.weight")
        assert f.get_tensor("model.norm.weight").dtype == torch.bfloat16
    assert "model.layers.1.mlp.down_proj.weight_scale" in keys
    assert qw.dtype == (torch.int8 if bits == 8 else torch.uint8)
    assert not (tmp_path / f"int{bits}.partial").exists()


@needs_quant_kernels
def test_truncated_or_missing_files_are_caught(tiny_bf16, tmp_path):
    from vllm_x86.runtime.quant import format as qf
    from vllm_x86.tools.quantize.convert import quantize_checkpoint

    out = tmp_path / "int8"
    quantize_checkpoint(tiny_bf16, out, 8, progress=None)
    f = out / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 1000])
    with pytest.raises(qf.FormatError, match="truncated"):
        qf.check_files(str(out))
    f.write_bytes(data)
    qf.check_files(str(out))
    (out / qf.MANIFEST).unlink()
    with pytest.raises(qf.FormatError, match="no x86_quant.json"):
        qf.check_files(str(out))


def test_converter_refuses_bad_input(tiny_bf16, tmp_path):
    from vllm_x86.tools.quantize.convert import ConvertError, quantize_checkpoint

    with pytest.raises(ConvertError, match="not a model directory"):
        quantize_checkpoint(tmp_path / "nowhere", tmp_path / "o", 8, progress=None)
    with pytest.raises(ConvertError, match="--bits must be 8 or 4"):
        quantize_checkpoint(tiny_bf16, tmp_path / "o", 3, progress=None)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    if AMX:
        with pytest.raises(ConvertError, match="not empty"):
            quantize_checkpoint(tiny_bf16, tmp_path / "full", 8, progress=None)
        out = tmp_path / "q"
        quantize_checkpoint(tiny_bf16, out, 8, progress=None)
        with pytest.raises(ConvertError, match="already quantized"):
            quantize_checkpoint(out, tmp_path / "qq", 8, progress=None)


def test_cli_quantize_bad_model_exits_with_a_sentence(tmp_path):
    import subprocess
    import sys

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_x86.tools.cli",
            "quantize",
            str(tmp_path / "no"),
            "o",
            "--bits",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1
    assert "does not exist. Give a model directory" in r.stderr
    assert "Traceback" not in r.stderr
