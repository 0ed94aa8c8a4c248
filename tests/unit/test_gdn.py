"""Gated DeltaNet: the plugin's float32 gates and gated delta rule (ops/reference.py,
run by ops/gdn.py for float32 models) against two independent implementations:

- transformers' torch_chunk_gated_delta_rule and torch_recurrent_gated_delta_rule
  (what the conformance suite's reference model runs), one sequence at a time: equal
  within float32 rounding (1e-5 absolute on outputs of size ~1);
- vLLM's bf16 CPU kernels (_C.fused_gdn_gating_cpu, _C.chunk_gated_delta_rule_cpu),
  on the same packed variable-length batch, slots and state layout that vLLM's CPU
  path uses: equal within bf16 rounding (2e-2). This pins the state layout
  ([slots, Hv, K, V]) and the meaning of every argument to vLLM's.

Shapes: Hv = Hk and Hv = 2 Hk (Qwen3-Next's GQA), head dims 32 and 64, odd lengths,
several sequences, fresh and carried-over states.
"""

from __future__ import annotations

import pytest
import torch

from vllm_x86.runtime.ops import reference


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def inputs(lens, hk, hv, dk, dv, seed=0, dtype=torch.float32):
    t = sum(lens)
    r = gen(seed)
    q = torch.randn(1, t, hk, dk, generator=r).to(dtype)
    k = torch.randn(1, t, hk, dk, generator=r).to(dtype)
    v = torch.randn(1, t, hv, dv, generator=r).to(dtype)
    a = torch.randn(t, hv, generator=r).to(dtype)
    b = torch.randn(t, hv, generator=r).to(dtype)
    A_log = torch.rand(hv, generator=r).log()
    dt_bias = torch.randn(hv, generator=r)
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    return q, k, v, a, b, A_log, dt_bias, cu


def test_fused_gdn_gating_formula():
    _, _, _, a, b, A_log, dt_bias, _ = inputs([9], 2, 4, 32, 32)
    g, beta = reference.fused_gdn_gating(A_log, a, b, dt_bias)
    assert g.dtype == beta.dtype == torch.float32
    assert torch.allclose(g, -A_log.exp() * torch.log1p(torch.exp(a + dt_bias)), atol=1e-6)
    assert torch.allclose(beta, 1 / (1 + torch.exp(-b)), atol=1e-6)
    assert (g < 0).all()


@pytest.mark.parametrize("hk,hv,dk,dv", [(2, 2, 32, 32), (2, 4, 64, 32), (3, 6, 32, 64)])
@pytest.mark.parametrize("lens", [[1], [7], [70], [5, 1, 33]])
def test_gated_delta_rule_matches_transformers(hk, hv, dk, dv, lens):
    from transformers.models.qwen3_next.modeling_qwen3_next import (
        torch_chunk_gated_delta_rule,
        torch_recurrent_gated_delta_rule,
    )

    q, k, v, a, b, A_log, dt_bias, cu = inputs(lens, hk, hv, dk, dv, seed=len(lens) + dk)
    g, beta = reference.fused_gdn_gating(A_log, a, b, dt_bias)
    n = len(lens)
    slots = torch.tensor([2 * i + 1 for i in range(n)], dtype=torch.int32)  # not 0..n-1
    state = torch.randn(2 * n + 1, hv, dk, dv, generator=gen(7)) * 0.5
    state[slots[0]] = 0  # one fresh sequence, the others carry a state over
    before = state.clone()
    out = reference.gated_delta_rule(q, k, v, g, beta, state, cu, slots, True)
    assert out.shape == (1, sum(lens), hv, dv)
    untouched = [s for s in range(state.shape[0]) if s not in slots.tolist()]
    assert torch.equal(state[untouched], before[untouched])

    rep = hv // hk
    for i, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        args = (
            q[:, s:e].repeat_interleave(rep, dim=2),
            k[:, s:e].repeat_interleave(rep, dim=2),
            v[:, s:e],
            g[None, s:e],
            beta[None, s:e],
        )
        init = before[slots[i]][None]
        for fn in (torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule):
            o, final = fn(
                *args,
                initial_state=init,
                output_final_state=True,
                use_qk_l2norm_in_kernel=True,
            )
            torch.testing.assert_close(out[:, s:e], o, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(state[slots[i]], final[0], atol=1e-5, rtol=1e-5)


def test_gated_delta_rule_decode_steps_equal_one_prefill():
    """Decoding token by token from the carried state gives what one prefill gives."""
    q, k, v, a, b, A_log, dt_bias, cu = inputs([12], 2, 4, 32, 32, seed=3)
    g, beta = reference.fused_gdn_gating(A_log, a, b, dt_bias)
    one = torch.zeros(2, 4, 32, 32)
    full = reference.gated_delta_rule(q, k, v, g, beta, one, cu, torch.tensor([1]), True)
    step = torch.zeros(2, 4, 32, 32)
    outs = []
    for j in range(12):
        sl = slice(j, j + 1)
        outs.append(
            reference.gated_delta_rule(
                q[:, sl], k[:, sl], v[:, sl], g[sl], beta[sl], step,
                torch.tensor([0, 1]), torch.tensor([1]), True,
            )
        )  # fmt: skip
    torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(step, one, atol=1e-6, rtol=1e-6)


def _vllm_cpu_gdn_kernels():
    try:
        import vllm._custom_ops as ops
    except Exception as e:  # pragma: no cover - vLLM is a dependency
        pytest.skip(f"vLLM not importable: {e}")
    if not hasattr(torch.ops._C, "chunk_gated_delta_rule_cpu"):
        pytest.skip("this vLLM build has no CPU GDN kernels")
    return ops


@pytest.mark.parametrize("hk,hv", [(2, 2), (2, 4)])
def test_matches_vllm_bf16_cpu_kernels(hk, hv):
    ops = _vllm_cpu_gdn_kernels()
    lens = [5, 17, 1]
    dk = dv = 128  # the head dim of every Qwen3-Next / Qwen3.5 model; the kernel takes few others
    q, k, v, a, b, A_log, dt_bias, cu = inputs(lens, hk, hv, dk, dv, seed=11)
    bf = torch.bfloat16
    q, k, v, a, b, A_log, dt_bias = (x.to(bf) for x in (q, k, v, a, b, A_log, dt_bias))
    slots = torch.tensor([3, 0, 2], dtype=torch.int32)
    state = torch.randn(4, hv, dk, dv, generator=gen(5)) * 0.5
    state[1] = 7.0  # a slot no sequence uses

    g_ref, beta_ref = reference.fused_gdn_gating(A_log, a, b, dt_bias)
    g_k, beta_k = ops.fused_gdn_gating_cpu(A_log=A_log, a=a, b=b, dt_bias=dt_bias)
    torch.testing.assert_close(g_k.float().reshape_as(g_ref), g_ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(beta_k.float().reshape_as(beta_ref), beta_ref, atol=2e-2, rtol=2e-2)

    st_ref = state.clone()
    out_ref = reference.gated_delta_rule(q, k, v, g_ref, beta_ref, st_ref, cu, slots, True)
    st_k = state.clone()
    out_k, _ = ops.chunk_gated_delta_rule_cpu(
        query=q,
        key=k,
        value=v,
        g=g_k,
        beta=beta_k,
        initial_state=st_k,
        output_final_state=True,
        cu_seqlens=cu,
        head_first=False,
        use_qk_l2norm_in_kernel=True,
        initial_state_indices=slots,
    )
    torch.testing.assert_close(out_k.float(), out_ref.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(st_k, st_ref, atol=2e-2, rtol=2e-2)
    assert torch.equal(st_k[1], state[1])


def test_layer_rows_name_vllm_pluggable_layers():
    """The op table's layer rows replace vLLM PluggableLayers (looked up by class name
    when a model builds one) with a subclass that has the plugin's mixin."""
    from vllm.model_executor.custom_op import PluggableLayer

    from vllm_x86.runtime.ops import registry

    rows = [r for r in registry.OVERRIDES if r.kind == "layer" and "gdn" in r.target]
    assert {r.target.split(":")[1] for r in rows} == {
        "QwenGatedDeltaNetAttention",
        "OlmoHybridGatedDeltaNetAttention",
    }
    for row in rows:
        base = registry._load(row.target)
        mixin = registry._load(row.impl)
        assert issubclass(base, PluggableLayer)
        assert "_forward_core" in vars(mixin)
        assert not row.cpp
