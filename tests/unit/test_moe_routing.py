"""Sigmoid MoE routing on vLLM's CPU router (vllm_x86/runtime/ops/moe_routing.py).

- ``sigmoid_topk`` against its reference (ops/reference.py) over expert counts, top-k,
  token counts, logits dtypes, non-contiguous logits, with and without a correction
  bias, renormalisation and a routed scaling factor: the same experts, weights within
  float32 rounding (1e-6 relative);
- the whole path (vLLM's ``CPURouter`` after the op table's router row switched its
  class, ``select_experts``) against transformers' own routers, LagunaTopKRouter and
  MiniMaxM2TopKRouter, with random weights and correction biases;
- the router row: it applies exactly where vLLM's CPU router would assert softmax;
  softmax, grouped and custom-function routers keep vLLM's code; an unknown scoring
  function raises a clear error.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vllm_x86.runtime.ops import moe_routing, reference, registry

_CPU_ROUTER = "vllm.model_executor.layers.fused_moe.router.cpu_router:CPURouter"


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def distinct_logits(tokens: int, experts: int, dtype, seed: int) -> torch.Tensor:
    """Logits without ties in any dtype: each row a permutation of multiples of 1/16
    in [-8, 8) (exact in bf16), so every expert has its own sigmoid score."""
    g = gen(seed)
    rows = [(torch.randperm(experts, generator=g) - experts // 2) / 16.0 for _ in range(tokens)]
    return torch.stack(rows).to(dtype)


def by_expert(weights: torch.Tensor, ids: torch.Tensor):
    """(ids, weights) of each token in expert order, to compare selections."""
    order = ids.long().argsort(dim=-1)
    return ids.long().gather(1, order), weights.float().gather(1, order)


def assert_same_routing(got, want, rtol=1e-6, atol=1e-7):
    gi, gw = by_expert(*got)
    wi, ww = by_expert(*want)
    assert torch.equal(gi, wi)
    torch.testing.assert_close(gw, ww, rtol=rtol, atol=atol)


@pytest.mark.parametrize("experts,top_k", [(8, 2), (60, 4), (128, 8), (256, 1)])
@pytest.mark.parametrize("tokens", [1, 7, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("renormalize,scale", [(True, 1.0), (True, 2.5), (False, 1.0)])
def test_sigmoid_topk_matches_reference(experts, top_k, tokens, dtype, bias, renormalize, scale):
    logits = distinct_logits(tokens, experts, dtype, experts + tokens)
    b = torch.randn(experts, generator=gen(tokens)) * 0.3 if bias else None
    w, ids = moe_routing.sigmoid_topk(logits, top_k, renormalize, b, scale)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32
    assert w.shape == ids.shape == (tokens, top_k)
    assert w.is_contiguous() and ids.is_contiguous()
    assert_same_routing((w, ids), reference.sigmoid_topk(logits, top_k, renormalize, b, scale))
    if renormalize:
        torch.testing.assert_close(w.sum(-1), torch.full((tokens,), scale), rtol=1e-6, atol=0)


def test_sigmoid_topk_non_contiguous_logits():
    wide = distinct_logits(16, 64, torch.float32, 3)
    logits = wide[:, ::2]  # every other expert of a wider tensor
    assert not logits.is_contiguous()
    b = torch.randn(32, generator=gen(4))
    got = moe_routing.sigmoid_topk(logits, 4, True, b, 1.0)
    assert_same_routing(got, reference.sigmoid_topk(logits.contiguous(), 4, True, b, 1.0))
    t = distinct_logits(12, 32, torch.float32, 5).t().contiguous().t()  # column-major
    assert not t.is_contiguous()
    got = moe_routing.sigmoid_topk(t, 3, True, None, 1.0)
    assert_same_routing(got, reference.sigmoid_topk(t.contiguous(), 3, True, None, 1.0))


def test_bias_steers_the_choice_not_the_weights():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 10.0])  # the worst-scored expert is chosen
    w, ids = moe_routing.sigmoid_topk(logits, 2, False, bias, 1.0)
    assert sorted(ids[0].tolist()) == [0, 3]
    s = torch.sigmoid(logits[0])
    torch.testing.assert_close(by_expert(w, ids)[1][0], torch.stack([s[0], s[3]]))


# ------------------------------------------------ vLLM's CPURouter through the op table


class _Runner(nn.Module):
    """Stands for vLLM's MoE runner module: holds a router as `.router`."""

    def __init__(self, router):
        super().__init__()
        self.router = router


def _cpu_router(**kw):
    from vllm.model_executor.layers.fused_moe.router.cpu_router import CPURouter

    args = dict(top_k=2, global_num_experts=8, renormalize=True, scoring_func="sigmoid")
    args.update(kw)
    return CPURouter(**args)


def _install(*routers) -> dict[str, int]:
    model = nn.Sequential(*[_Runner(r) for r in routers])
    return registry.apply_module_overrides(model)


@pytest.fixture(autouse=True)
def _ops_on(monkeypatch):
    monkeypatch.setenv("VLLM_X86_OPS", "1")


def test_stock_cpu_router_rejects_sigmoid():
    """The gap the router row fills. When vLLM's CPU router routes sigmoid itself, this
    fails, and the row (and this file) can go."""
    router = _cpu_router()
    with pytest.raises(AssertionError):
        router.select_experts(torch.zeros(3, 16), torch.randn(3, 8))


def test_router_row_applies_only_where_vllm_asserts_softmax():
    sigmoid = _cpu_router(e_score_correction_bias=torch.zeros(8))
    softmax = _cpu_router(scoring_func="softmax")
    grouped = _cpu_router(use_grouped_topk=True, num_expert_group=2, topk_group=1)
    custom = _cpu_router(custom_routing_function=lambda **kw: None)
    counts = _install(sigmoid, softmax, grouped, sigmoid, custom)  # one router twice
    assert counts == {_CPU_ROUTER: 1}
    assert isinstance(sigmoid, moe_routing.X86CPURouter)
    for r in (softmax, grouped, custom):
        assert not isinstance(r, moe_routing.X86CPURouter)
    # the softmax path is vLLM's own
    logits = torch.randn(5, 8, generator=gen(1))
    w, ids = softmax.select_experts(torch.zeros(5, 16), logits)
    top = logits.topk(2, dim=-1)
    assert_same_routing((w, ids), (torch.softmax(top.values, -1), top.indices))


def test_router_row_off_with_vllm_x86_ops_0(monkeypatch):
    monkeypatch.setenv("VLLM_X86_OPS", "0")
    router = _cpu_router()
    assert _install(router) == {}
    assert not isinstance(router, moe_routing.X86CPURouter)


def test_unknown_scoring_function_raises_clearly():
    router = _cpu_router(scoring_func="sqrtsigmoid")
    _install(router)
    with pytest.raises(NotImplementedError, match="scoring_func='sqrtsigmoid'"):
        router.select_experts(torch.zeros(2, 16), torch.randn(2, 8))


def test_router_applies_its_scaling_factor():
    router = _cpu_router(routed_scaling_factor=2.5, top_k=3, renormalize=False)
    _install(router)
    logits = distinct_logits(4, 8, torch.float32, 9)
    got = router.select_experts(torch.zeros(4, 16), logits)
    assert_same_routing(got, reference.sigmoid_topk(logits, 3, False, None, 2.5))


# ------------------------------------------------------- against transformers' routers


def _randomize(module: nn.Module, seed: int) -> None:
    g = gen(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        for b in module.buffers():
            b.copy_(torch.randn(b.shape, generator=g) * 0.05)


def test_laguna_routing_matches_transformers():
    from transformers.models.laguna.configuration_laguna import LagunaConfig
    from transformers.models.laguna.modeling_laguna import LagunaTopKRouter

    cfg = LagunaConfig(
        hidden_size=64, num_experts=16, num_experts_per_tok=4, moe_routed_scaling_factor=2.5
    )
    hf = LagunaTopKRouter(cfg)
    _randomize(hf, 0)
    with torch.no_grad():
        hf.e_score_correction_bias.copy_(torch.randn(16, generator=gen(1)) * 0.05)
    x = torch.randn(33, 64, generator=gen(2))
    with torch.no_grad():
        logits, hf_w, hf_ids = hf(x)
    # vLLM's Laguna: renormalize=True; the scaling factor goes to the MoE output
    # (apply_routed_scale_to_output), as transformers applies it after the experts.
    router = _cpu_router(
        top_k=4,
        global_num_experts=16,
        e_score_correction_bias=hf.e_score_correction_bias.detach().float(),
    )
    _install(router)
    got = router.select_experts(x, logits.float())
    assert_same_routing(got, (hf_w, hf_ids))
    # the bias changed some choices, or this test would not test it
    plain = moe_routing.sigmoid_topk(logits, 4, True, None, 1.0)
    assert not torch.equal(by_expert(*plain)[0], by_expert(hf_w, hf_ids)[0])


def test_minimax_m2_routing_matches_transformers():
    from transformers.models.minimax_m2.configuration_minimax_m2 import MiniMaxM2Config
    from transformers.models.minimax_m2.modeling_minimax_m2 import MiniMaxM2TopKRouter

    cfg = MiniMaxM2Config(hidden_size=64, num_local_experts=32, num_experts_per_tok=8)
    hf = MiniMaxM2TopKRouter(cfg)
    _randomize(hf, 3)
    bias = torch.randn(32, generator=gen(4)) * 0.05
    x = torch.randn(17, 64, generator=gen(5))
    with torch.no_grad():
        logits, hf_w, hf_ids = hf(x, bias)
    router = _cpu_router(top_k=8, global_num_experts=32, e_score_correction_bias=bias)
    _install(router)
    got = router.select_experts(x, logits.float())
    assert_same_routing(got, (hf_w, hf_ids))
    plain = moe_routing.sigmoid_topk(logits, 8, True, None, 1.0)
    assert not torch.equal(by_expert(*plain)[0], by_expert(hf_w, hf_ids)[0])
