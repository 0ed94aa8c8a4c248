"""VLLM_X86_FP32_RESIDUAL (docs/correctness.md): the residual stream of bf16 models in
float32 (vLLM IR providers of fused_add_rms_norm, their fake, the platform's choice of
them) and the best logits recomputed in float32 (ops/logits.py). The kernel itself is
tested against its reference in test_ops.py; the whole model in
tests/models/test_default_model_parity.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_x86.runtime.ops import kernels, layernorm
from vllm_x86.runtime.ops.logits import head_weight, refinable, refine_top_logits

needs_kernels = pytest.mark.skipif(
    not kernels.available(), reason=f"kernel library not built: {kernels.load_error()}"
)


def rand(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def native(*args):
    from vllm import ir

    return ir.ops.fused_add_rms_norm.impls["native"].impl_fn(*args)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_torch_provider_is_native_without_rounding_the_residual(dtype):
    x, r = rand((5, 576), dtype, 1, 3.0), rand((5, 576), dtype, 2, 3.0)
    w = rand((576,), dtype, 3)
    y, s = layernorm.fused_add_rms_norm_f32res_torch(x, r, w, 1e-5)
    ny, nr = native(x, r, w, 1e-5)
    assert s.dtype == torch.float32 and y.dtype == dtype
    assert torch.equal(s, x.float() + r.float())
    assert torch.equal(s.to(dtype), nr)  # vLLM's residual is this one rounded
    assert torch.equal(y, ny)  # the same norm where the sum is the same (layer 0)


@needs_kernels
def test_kernel_provider_equals_the_torch_one_through_two_layers():
    """Layer 0 hands the bf16 embedding in and gets a float32 residual back; layer 1
    hands that in and it is updated in place."""
    emb = rand((3, 576), torch.bfloat16, 4, 2.0)
    w = rand((576,), torch.bfloat16, 5)
    outs = []
    for impl in (
        layernorm.fused_add_rms_norm_f32res_x86,
        layernorm.fused_add_rms_norm_f32res_torch,
    ):
        r = emb.clone()
        x0 = rand((3, 576), torch.bfloat16, 6)
        y0, r = impl(x0, r, w, 1e-5)
        assert r.dtype == torch.float32
        r_before = r
        y1, r = impl(rand((3, 576), torch.bfloat16, 7), r, w, 1e-5)
        if impl is layernorm.fused_add_rms_norm_f32res_x86:
            assert r is r_before  # in place once float32
        outs.append((y0.clone(), y1.clone(), r.clone()))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def _config(dtype=torch.bfloat16, arch="LlamaForCausalLM"):
    return SimpleNamespace(model_config=SimpleNamespace(dtype=dtype, architectures=[arch]))


@needs_kernels
def test_platform_priority(monkeypatch):
    from vllm_x86.runtime.ops import registry

    monkeypatch.delenv("VLLM_X86_FP32_RESIDUAL", raising=False)
    monkeypatch.setenv("VLLM_X86_OPS", "1")
    eager = registry.ir_providers(_config(), inductor=False)
    assert eager["fused_add_rms_norm"] == ["x86_f32res", "x86_f32res_torch"]
    assert eager["rms_norm"] == ["x86", "native"]
    assert registry.ir_providers(_config(), inductor=True) == {
        "fused_add_rms_norm": ["x86_f32res_torch"]
    }
    default = {"rms_norm": ["x86", "native"], "fused_add_rms_norm": ["x86", "native"]}
    assert registry.ir_providers(_config(torch.float32), inductor=False) == default
    assert registry.ir_providers(_config(arch="GraniteForCausalLM"), inductor=False) == default
    assert registry.ir_providers(_config(arch="GraniteForCausalLM"), inductor=True) == {}
    monkeypatch.setenv("VLLM_X86_FP32_RESIDUAL", "0")
    assert registry.ir_providers(_config(), inductor=False) == default
    assert layernorm.fp32_residual_applies(_config()) == "VLLM_X86_FP32_RESIDUAL=0"


@needs_kernels
@pytest.mark.parametrize("prio", [["x86_f32res", "x86_f32res_torch"], ["x86_f32res_torch"]])
def test_compiled_graph_carries_a_float32_residual(prio):
    """torch.compile traces the IR op with its fake: where the platform chose a
    float32-residual provider, the fake says float32, as the provider returns."""
    from vllm import ir

    assert layernorm.register()
    op = ir.ops.fused_add_rms_norm

    def two_layers(x0, x1, emb, w):
        y0, r = op(x0, emb, w, 1e-5)
        y1, r = op(x1, r, w, 1e-5)
        return y0, y1, r

    args = (
        rand((4, 576), torch.bfloat16, 1),
        rand((4, 576), torch.bfloat16, 2),
        rand((4, 576), torch.bfloat16, 3),
        rand((576,), torch.bfloat16, 4),
    )
    from torch._subclasses.fake_tensor import FakeTensorMode

    def fake_residual_dtype():
        with FakeTensorMode() as mode:
            fakes = [mode.from_tensor(a) for a in args]
            return op(fakes[0], fakes[2], fakes[3], 1e-5)[1].dtype

    with op.set_priority(prio):
        assert fake_residual_dtype() == torch.float32
        eager = two_layers(*args)
        torch._dynamo.reset()
        compiled = torch.compile(two_layers, backend="aot_eager", fullgraph=True)(*args)
    torch._dynamo.reset()
    assert eager[2].dtype == compiled[2].dtype == torch.float32
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
    with op.set_priority(["native"]):  # vLLM's own: rounded, as before
        assert two_layers(*args)[2].dtype == torch.bfloat16
        assert fake_residual_dtype() == torch.bfloat16


# ---------------------------------------------------------------- logits


def test_refined_logits_break_a_tie_bf16_rounding_made():
    """Two tokens 0.04 apart at logit ~25 round to the same bf16 value (step 0.125):
    the bf16 argmax takes the first; the refined logits take the float32 best."""
    k = 64
    h = torch.full((1, k), 0.5).to(torch.bfloat16)
    w = torch.zeros(100, k)
    w[3, :] = 25.0 / (0.5 * k)  # logit 25.0
    w[7, :] = 25.0 / (0.5 * k)
    w[7, 0] += 0.04 / 0.5  # logit 25.04
    w[11, :] = 24.0 / (0.5 * k)
    w = w.to(torch.bfloat16)
    exact = h.float() @ w.float().t()
    assert int(exact.argmax()) == 7 and float(exact[0, 7] - exact[0, 3]) > 0.03
    bf16 = h @ w.t()
    assert bf16.dtype == torch.bfloat16 and int(bf16.argmax()) == 3  # the tie, first wins
    got = refine_top_logits(bf16, h, w)
    assert got.dtype == torch.float32 and int(got.argmax()) == 7
    assert torch.allclose(got[0, [3, 7]], exact[0, [3, 7]], atol=1e-5, rtol=0)
    assert float(got[0, 11]) == float(bf16[0, 11])  # far from the best: left as it was


def test_refined_argmax_is_the_float32_argmax_over_random_rows():
    h = rand((64, 576), torch.bfloat16, 1)
    w = rand((4096, 576), torch.bfloat16, 2, 0.3)
    exact = h.float() @ w.float().t()
    got = refine_top_logits(h @ w.t(), h, w)
    assert torch.equal(got.argmax(-1), exact.argmax(-1))
    best = exact.max(-1, keepdim=True).values
    assert torch.allclose(got.gather(1, exact.argmax(-1, keepdim=True)), best, atol=1e-4)


def test_refined_logits_with_many_near_ties_widen_the_candidates():
    h = torch.ones(2, 8, dtype=torch.bfloat16)
    w = torch.ones(40, 8)
    w[29, 0] += 0.01  # one of 40 near-equal tokens is best
    w = w.to(torch.bfloat16)
    got = refine_top_logits(h @ w.t(), h, w)
    assert got.argmax(-1).tolist() == [29, 29]


def test_which_heads_and_processors_are_refined(monkeypatch):
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    monkeypatch.delenv("VLLM_X86_FP32_RESIDUAL", raising=False)
    plain = SimpleNamespace(logits_as_input=False, soft_cap=None, scale=1.0)
    assert refinable(plain) is None
    assert "soft-capped" in refinable(SimpleNamespace(logits_as_input=False, soft_cap=30.0))
    monkeypatch.setenv("VLLM_X86_FP32_RESIDUAL", "0")
    assert refinable(plain) == "VLLM_X86_FP32_RESIDUAL=0"
    h = torch.zeros(2, 16, dtype=torch.bfloat16)
    head = SimpleNamespace(
        quant_method=UnquantizedEmbeddingMethod(),
        tp_size=1,
        weight=torch.zeros(32, 16, dtype=torch.bfloat16),
    )
    assert head_weight(head, h) is head.weight
    assert head_weight(head, h.float()) is None  # float32 model: nothing to refine
    assert head_weight(SimpleNamespace(**{**vars(head), "quant_method": object()}), h) is None
    empty = SimpleNamespace(**{**vars(head), "weight": torch.empty(0, dtype=torch.bfloat16)})
    assert head_weight(empty, h) is None
