"""Every kernel against its pure-torch reference (vllm_x86/runtime/ops/reference.py), on every
ISA build this CPU can run, in bf16/fp16/fp32, over decode and prefill token counts,
real hidden sizes, odd head counts and non-contiguous inputs; the INT8/INT4 GEMMs on
every GEMM ISA this CPU can run (AMX, AVX-512 VNNI). The ISAs are hardware.py's answer,
handed to the library; a lower one than the CPU's best is how each path is tested here.

Tolerances (docs/kernels.md):
- rms_norm, fused_add_rms_norm, rotary_embedding, split_norm_rope_neox: bit-identical
  to the reference (they reproduce its rounding points and, for RMSNorm, torch's
  order of summation);
- silu_and_mul: bit-identical in bf16 and fp16; fp32 within 1e-6 relative (the exp
  approximation differs from torch's in the last bits);
- gelu_and_mul, gelu_tanh_and_mul: within two units in the last place of the dtype
  (the GELU value may differ by one before the product rounds again), plus 2e-5
  absolute (torch's own GELU loses precision where 1 + erf(x) cancels).
"""

from __future__ import annotations

import pytest
import torch

from tests.unit.conftest import KERNEL_ISAS
from vllm_x86.runtime.ops import kernels, reference

pytestmark = pytest.mark.skipif(
    not kernels.available(), reason=f"kernel library not built: {kernels.load_error()}"
)

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# 1000 tokens (prefill) is the slow part of this file; `make test` runs it, test-fast not
TOKENS = [1, 7, 64, pytest.param(1000, marks=pytest.mark.slow)]
HIDDEN = [576, 1024, 2048, 4096, 5120]


def ops():
    return torch.ops.vllm_x86


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rand(shape, dtype, seed, scale=1.0):
    return (torch.randn(shape, generator=gen(seed)) * scale).to(dtype)


# ---------------------------------------------------------------- RMSNorm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_rms_norm_bit_identical(isa, dtype, tokens, hidden):
    x = rand((tokens, hidden), dtype, tokens + hidden, 3.0)
    w = (rand((hidden,), torch.float32, 1) * 0.1 + 1).to(dtype)
    out, ref = torch.empty_like(x), torch.empty_like(x)
    ops().rms_norm(out, x, w, 1e-6)
    reference.rms_norm(ref, x, w, 1e-6)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 3, 7, 8, 9, 31, 33, 100, 257, 1000, 1536, 8192, 12345])
def test_rms_norm_sums_in_torch_order_for_any_size(isa, dtype, hidden):
    x = rand((5, hidden), dtype, hidden, 2.0)
    out, ref = torch.empty_like(x), torch.empty_like(x)
    ops().rms_norm(out, x, None, 1e-5)
    reference.rms_norm(ref, x, None, 1e-5)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,head_dim", [(9, 64), (14, 64), (16, 128), (8, 256)])
def test_rms_norm_per_head_of_a_fused_qkv_view(isa, dtype, heads, head_dim):
    """Qwen3's q_norm: q is a [tokens, heads, head_dim] view into the qkv projection
    output (rows are not contiguous)."""
    tokens, kv = 7, 2
    qkv = rand((tokens, (heads + 2 * kv) * head_dim), dtype, heads)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    assert not q.is_contiguous()
    w = (rand((head_dim,), torch.float32, 2) * 0.1 + 1).to(dtype)
    out = torch.empty(q.shape, dtype=dtype)
    ref = torch.empty(q.shape, dtype=dtype)
    ops().rms_norm(out, q, w, 1e-6)
    reference.rms_norm(ref, q, w, 1e-6)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_fused_add_rms_norm_bit_identical(isa, dtype, tokens, hidden):
    x = rand((tokens, hidden), dtype, tokens, 2.0)
    r = rand((tokens, hidden), dtype, hidden, 2.0)
    w = (rand((hidden,), torch.float32, 3) * 0.1 + 1).to(dtype)
    x1, r1, x2, r2 = x.clone(), r.clone(), x.clone(), r.clone()
    ops().fused_add_rms_norm(x1, r1, w, 1e-6)
    reference.fused_add_rms_norm(x2, r2, w, 1e-6)
    assert torch.equal(r1, r2)
    assert torch.equal(x1, x2)


def test_fused_add_rms_norm_with_strided_rows(isa):
    base = rand((64, 2 * 1024), torch.bfloat16, 5)
    x = base[:, :1024]  # rows 2048 elements apart
    r = rand((64, 1024), torch.bfloat16, 6)
    w = rand((1024,), torch.bfloat16, 7)
    x2, r2 = x.clone(), r.clone()
    ops().fused_add_rms_norm(x, r, w, 1e-6)
    reference.fused_add_rms_norm(x2, r2, w, 1e-6)
    assert torch.equal(x, x2) and torch.equal(r, r2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_fused_add_rms_norm_f32res_bit_identical(isa, dtype, tokens, hidden):
    """VLLM_X86_FP32_RESIDUAL's kernel: the float32 residual sum unrounded, the norm as
    the reference rounds it."""
    x = rand((tokens, hidden), dtype, tokens, 2.0)
    r = rand((tokens, hidden), torch.float32, hidden, 2.0)
    w = (rand((hidden,), torch.float32, 3) * 0.1 + 1).to(dtype)
    x1, r1, x2, r2 = x.clone(), r.clone(), x.clone(), r.clone()
    ops().fused_add_rms_norm_f32res(x1, r1, w, 1e-6)
    reference.fused_add_rms_norm_f32res(x2, r2, w, 1e-6)
    assert r1.dtype == torch.float32
    assert torch.equal(r1, r2)
    assert torch.equal(x1, x2)
    # not the bf16-rounded sum vLLM keeps: the float32 one
    assert torch.equal(r1, x.float() + r)


def test_fused_add_rms_norm_f32res_strided_rows_and_no_weight(isa):
    base = rand((64, 2 * 1024), torch.bfloat16, 5)
    x = base[:, :1024]  # rows 2048 elements apart
    r = rand((64, 1024), torch.float32, 6)
    x2, r2 = x.clone(), r.clone()
    ops().fused_add_rms_norm_f32res(x, r, None, 1e-6)
    reference.fused_add_rms_norm_f32res(x2, r2, None, 1e-6)
    assert torch.equal(x, x2) and torch.equal(r, r2)
    assert torch.equal(base[:, 1024:], rand((64, 2 * 1024), torch.bfloat16, 5)[:, 1024:])


def test_fused_add_rms_norm_f32res_refuses_a_bf16_residual():
    x = rand((2, 64), torch.bfloat16, 1)
    with pytest.raises(RuntimeError, match="residual must be float32"):
        ops().fused_add_rms_norm_f32res(x, x.clone(), None, 1e-6)


# ---------------------------------------------------------------- rotary embedding


def cos_sin_cache(rotary_dim: int, max_pos: int = 4096, base: float = 1e4) -> torch.Tensor:
    inv = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float), inv)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


ROPE_SHAPES = [  # (heads, kv_heads, head_dim, rotary_dim)
    (9, 3, 64, 64),
    (14, 2, 64, 64),
    (16, 8, 128, 128),
    (8, 8, 256, 256),
    (8, 2, 128, 64),
    (4, 1, 80, 40),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("shape", ROPE_SHAPES, ids=lambda s: "h{}kv{}d{}r{}".format(*s))
@pytest.mark.parametrize("tokens", TOKENS)
def test_rotary_embedding_bit_identical(isa, dtype, neox, shape, tokens):
    heads, kv, head, rot = shape
    cache = cos_sin_cache(rot).to(dtype)
    pos = torch.randint(0, 4096, (tokens,), generator=gen(tokens))
    qkv = rand((tokens, (heads + 2 * kv) * head), dtype, heads * tokens, 4.0)
    want = qkv.clone()
    q, k, _ = qkv.split([heads * head, kv * head, kv * head], dim=-1)
    rq, rk, _ = want.split([heads * head, kv * head, kv * head], dim=-1)
    ops().rotary_embedding(pos, q, k, head, cache, neox)
    reference.rotary_embedding(pos, rq, rk, head, cache, neox)
    assert torch.equal(qkv, want)  # q and k rotated in place, v untouched


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rotary_embedding_float32_cache_is_rounded_like_the_reference(isa, dtype):
    cache = cos_sin_cache(128)
    pos = torch.randint(0, 4096, (9,), generator=gen(1))
    q = rand((9, 16 * 128), dtype, 2)
    k = rand((9, 8 * 128), dtype, 3)
    q2, k2 = q.clone(), k.clone()
    ops().rotary_embedding(pos, q, k, 128, cache, True)
    reference.rotary_embedding(pos, q2, k2, 128, cache, True)
    assert torch.equal(q, q2) and torch.equal(k, k2)


def test_rotary_embedding_without_key_and_3d_query(isa):
    cache = cos_sin_cache(64).bfloat16()
    pos = torch.arange(5)
    q = rand((5, 9, 64), torch.bfloat16, 4)
    q2 = q.clone()
    ops().rotary_embedding(pos, q, None, 64, cache, True)
    reference.rotary_embedding(pos, q2, None, 64, cache, True)
    assert torch.equal(q, q2)


# ---------------------------------------------------------------- activations


def _act_tolerance(op: str, dtype: torch.dtype) -> dict:
    if op == "silu_and_mul":
        return {"rtol": 1e-6, "atol": 1e-7} if dtype == torch.float32 else {"rtol": 0, "atol": 0}
    ulp = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-23}[dtype]
    return {"rtol": 2 * ulp, "atol": 2e-5}


@pytest.mark.parametrize("op", ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("d", [576, 1536, 4096, 5120, 17])
def test_activation_and_mul(isa, op, dtype, tokens, d):
    x = rand((tokens, 2 * d), dtype, tokens * d, 3.0)
    out = torch.empty((tokens, d), dtype=dtype)
    ref = torch.empty((tokens, d), dtype=dtype)
    getattr(ops(), op)(out, x)
    getattr(reference, op)(ref, x)
    torch.testing.assert_close(out, ref, **_act_tolerance(op, dtype))


def test_activation_of_a_3d_input(isa):
    x = rand((2, 5, 2 * 576), torch.bfloat16, 8)
    out = torch.empty((2, 5, 576), dtype=torch.bfloat16)
    ref = torch.empty_like(out)
    ops().silu_and_mul(out, x)
    reference.silu_and_mul(ref, x)
    assert torch.equal(out, ref)


# ---------------------------------------------------------------- split + norm + rope


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape",
    [(16, 8, 128, 128), (14, 2, 64, 64), (9, 3, 64, 64), (8, 2, 128, 64), (32, 4, 128, 128)],
    ids=lambda s: "h{}kv{}d{}r{}".format(*s),
)
@pytest.mark.parametrize("tokens", TOKENS)
def test_split_norm_rope_neox_bit_identical(isa, dtype, shape, tokens):
    heads, kv, head, rot = shape
    cache = cos_sin_cache(rot).to(dtype)
    pos = torch.randint(0, 4096, (tokens,), generator=gen(tokens + 1))
    qkv = rand((tokens, (heads + 2 * kv) * head), dtype, tokens + heads, 3.0)
    qw = (rand((head,), torch.float32, 11) * 0.2 + 1).to(dtype)
    kw = (rand((head,), torch.float32, 12) * 0.2 + 1).to(dtype)
    outs = [torch.empty((tokens, n * head), dtype=dtype) for n in (heads, kv, kv)]
    refs = [torch.empty_like(o) for o in outs]
    ops().split_norm_rope_neox(*outs, qkv, pos, qw, kw, cache, heads, kv, head, 1e-6)
    reference.split_norm_rope_neox(*refs, qkv, pos, qw, kw, cache, heads, kv, head, 1e-6)
    for o, r in zip(outs, refs):
        assert torch.equal(o, r)


# ---------------------------------------------------------------- errors


def test_bad_arguments_are_clear_errors():
    x = torch.randn(4, 64)
    with pytest.raises(RuntimeError, match="must be float32, bfloat16 or float16"):
        ops().rms_norm(torch.empty(4, 64, dtype=torch.int32), x.int(), None, 1e-6)
    with pytest.raises(RuntimeError, match="out must match input"):
        ops().rms_norm(torch.empty(4, 32), x, None, 1e-6)
    with pytest.raises(RuntimeError, match="weight must be contiguous with 64 elements"):
        ops().rms_norm(torch.empty_like(x), x, torch.ones(32), 1e-6)
    with pytest.raises(RuntimeError, match="input must be \\[..., 2d\\] and out \\[..., d\\]"):
        ops().silu_and_mul(torch.empty(4, 64), x)
    with pytest.raises(RuntimeError, match="positions must be contiguous int64"):
        ops().rotary_embedding(
            torch.zeros(4, dtype=torch.int32), x, None, 64, cos_sin_cache(64), True
        )


def test_isa_selection():
    assert kernels.isa() in KERNEL_ISAS
    with pytest.raises(RuntimeError, match="unknown ISA"):
        kernels.set_isa("sse2")
    kernels.set_isa("avx2")
    assert kernels.isa() == "avx2"
    kernels.set_isa("auto")
    assert kernels.isa() == KERNEL_ISAS[-1]


def test_an_isa_the_cpu_lacks_is_refused(monkeypatch):
    """The library runs only what hardware.py says this CPU can run: told an AVX2-only
    CPU, it runs the avx2 kernels, refuses avx512 and the GEMM kernels with a sentence,
    and on this machine's own answer again runs its best."""
    import vllm_x86.runtime._C as C

    from vllm_x86.runtime import hardware

    x = rand((3, 64), torch.bfloat16, 5)
    try:
        C.set_cpu_isas(["avx2"])
        assert C.cpu_isas() == ["avx2"]
        assert kernels.isa() == "avx2" and kernels.quant_isa() == ""
        with pytest.raises(RuntimeError, match="this CPU cannot run the avx512 kernels"):
            kernels.set_isa("avx512")
        with pytest.raises(RuntimeError, match="the AMX kernels cannot run here"):
            kernels.set_quant_isa("amx")
        with pytest.raises(RuntimeError, match="AVX-512 VNNI kernels cannot run here"):
            kernels.set_quant_isa("avx512_vnni")
        with pytest.raises(RuntimeError, match="needs AMX-INT8 .* or AVX-512 VNNI"):
            ops().int8_w8a16_gemm(x, torch.zeros(1, 1024, dtype=torch.int8), torch.ones(16), None)
        out, ref = torch.empty_like(x), torch.empty_like(x)
        ops().rms_norm(out, x, None, 1e-6)  # the avx2 kernels still run
        reference.rms_norm(ref, x, None, 1e-6)
        assert torch.equal(out, ref)
        with pytest.raises(RuntimeError, match="unknown ISA 'avx9'"):
            C.set_cpu_isas(["avx2", "avx9"])
    finally:
        C.set_cpu_isas(list(hardware.usable_isas()))
        kernels.set_isa(kernels.wanted_isa())
    assert C.cpu_isas() == list(hardware.usable_isas())
    assert kernels.isa() == (
        KERNEL_ISAS[-1] if kernels.wanted_isa() == "auto" else kernels.wanted_isa()
    )
    want = hardware.best_isa(hardware.QUANT_ISAS) or ""
    assert kernels.quant_isa() == want


def test_the_library_runs_nothing_until_told_the_isa():
    """Imported on its own (not through ops/kernels.py), the library knows no ISA: it
    probes nothing itself, so its ops refuse to run and say how to load it."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "import vllm_x86.runtime.ops.schemas\n"
        "import vllm_x86.runtime._C as C\n"
        "assert C.cpu_isas() == [] and C.isa() == 'none' and C.quant_isa() == ''\n"
        "x = torch.ones(2, 64)\n"
        "try:\n"
        "    torch.ops.vllm_x86.rms_norm(torch.empty_like(x), x, None, 1e-6)\n"
        "except RuntimeError as e:\n"
        "    print(e)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "the library was told this CPU can run nothing" in p.stdout


# ---------------------------------------------------------------- INT8/INT4 GEMMs

QUANT_ISAS = [i for i in ("amx", "avx512_vnni") if i in kernels.available_quant_isas()]


@pytest.fixture(params=QUANT_ISAS)
def quant_isa(request):
    import vllm_x86.runtime._C as C

    kernels.set_quant_isa(request.param)
    rows = C.quant_vnni_rows()
    C.set_quant_vnni_rows(0)  # AMX's own kernel at 1 row too (not VNNI's, which is faster)
    yield request.param
    C.set_quant_vnni_rows(rows)
    kernels.set_quant_isa("auto")


@pytest.mark.parametrize("rows", [1, 3, 8, 17])
def test_quantized_gemms_on_every_isa(quant_isa, rows):
    """int8_w8a16_gemm and int4_w4a16_gemm (groups of 32, 64 and 128) on each GEMM ISA
    this CPU can run, against their references (which round the activations to 8 bits
    where the VNNI kernels do: from VLLM_X86_QUANT_A8_ROWS rows)."""
    from vllm_x86.runtime.quant import methods as m

    assert kernels.quant_isa() == quant_isa
    n, k = 80, 256
    w = rand((n, k), torch.float32, rows, 0.05).to(torch.bfloat16)
    x = rand((rows, k), torch.bfloat16, rows + 1)
    bias = rand((n,), torch.float32, 3)
    q, scale = m.quantize_int8(w)
    packed = m.pack_int8_w8a16(q)
    pairs = [
        (
            ops().int8_w8a16_gemm(x, packed, scale, bias),
            reference.int8_w8a16_gemm(x, packed, scale, bias),
        )
    ]
    for group, zp in ((64, True), (128, False), (32, True), (32, False)):
        p4 = m.pack_int4_w4a16(*m.quantize_int4(w, group, zp))
        pairs.append(
            (
                ops().int4_w4a16_gemm(x, *p4, group, bias),
                reference.int4_w4a16_gemm(x, *p4, group, bias),
            )
        )
    for got, want in pairs:
        assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
        err = float((got.float() - want.float()).norm() / want.float().norm())
        assert err < 5e-3, (quant_isa, rows, err)


@pytest.mark.skipif(len(QUANT_ISAS) < 2, reason="needs AMX and AVX-512 VNNI to compare them")
@pytest.mark.parametrize("rows", [1, 2, 3, 9, 40])
def test_int4_groups_of_32_same_bits_on_amx_and_vnni(rows):
    """Groups of 32 (zero points in eighths, each block's nibbles two groups) give the
    same bits on AMX and AVX-512 VNNI at every row count (16-bit activations on both),
    through every path: one row, pairs, the odd row, prefill's expanded blocks."""
    import vllm_x86.runtime._C as C

    from vllm_x86.runtime.quant import methods as m

    n, k = 48, 320
    w = rand((n, k), torch.float32, 7, 0.05).to(torch.bfloat16)
    q, s, z = m.quantize_int4(w, 32, True)
    assert (z * 8 != torch.round(z * 8)).sum() == 0 and (z != torch.round(z)).any()
    p4 = m.pack_int4_w4a16(q, s, z)
    x = rand((rows, k), torch.bfloat16, rows + 11)
    outs = {}
    vnni_rows = C.quant_vnni_rows()
    try:
        C.set_quant_vnni_rows(0)
        for isa in QUANT_ISAS:
            kernels.set_quant_isa(isa)
            outs[isa] = ops().int4_w4a16_gemm(x, *p4, 32, None)
    finally:
        C.set_quant_vnni_rows(vnni_rows)
        kernels.set_quant_isa("auto")
    assert torch.equal(outs["amx"], outs["avx512_vnni"])
    want = reference.int4_w4a16_gemm(x, *p4, 32, None)
    err = float((outs["amx"].float() - want.float()).norm() / want.float().norm())
    assert err < 5e-3


# ---------------------------------------------------------------- torch.compile


def test_ops_trace_under_torch_compile():
    """The fake implementations let torch.compile trace the ops (fullgraph)."""
    torch._dynamo.reset()

    def f(x, w, qkv, pos, cache):
        out = torch.empty_like(x)
        torch.ops.vllm_x86.rms_norm(out, x, w, 1e-6)
        q = torch.empty(qkv.shape[0], 4 * 64, dtype=qkv.dtype)
        k = torch.empty(qkv.shape[0], 2 * 64, dtype=qkv.dtype)
        v = torch.empty_like(k)
        torch.ops.vllm_x86.split_norm_rope_neox(
            q, k, v, qkv, pos, w[:64], w[64:128], cache, 4, 2, 64, 1e-6
        )
        return out * 2, q, k, v

    x = rand((5, 256), torch.bfloat16, 1)
    w = rand((256,), torch.bfloat16, 2)
    qkv = rand((5, 8 * 64), torch.bfloat16, 3)
    pos = torch.arange(5)
    cache = cos_sin_cache(64).bfloat16()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    for got, want in zip(compiled(x, w, qkv, pos, cache), f(x, w, qkv, pos, cache)):
        assert torch.equal(got, want)
