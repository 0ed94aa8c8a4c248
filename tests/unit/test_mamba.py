"""Mamba-1 on CPU (ops/mamba.py): the plugin's selective_scan_fwd and
selective_state_update against their token-by-token references (ops/reference.py), and
the pieces of vLLM's CPU path the plugin's MambaMixer keeps (the causal conv ops, given
the unpacked weight).

Tolerances: float32 within 2e-5 relative (the op and the reference sum the state
products in different orders); bf16 outputs and states within two bf16 units in the last
place (both compute in float32 and round once; the float32 values may straddle a
rounding boundary).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_x86.runtime.ops import mamba, reference

DTYPES = [torch.float32, torch.bfloat16]


def tol(dtype: torch.dtype) -> dict:
    if dtype == torch.float32:
        return {"rtol": 2e-5, "atol": 2e-5}
    return {"rtol": 2 * 2**-8, "atol": 2e-2}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def scan_inputs(dim, dstate, groups, lens, dtype, seed, slots=None, initial=None):
    """Varlen inputs the way vLLM's MambaMixer passes them (u, delta, z [dim, T]; B, C
    [groups, dstate, T]; A = -exp(A_log) float32; D, dt bias float32)."""
    g = gen(seed)
    total = sum(lens)
    n = len(lens)
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    slots = list(range(1, n + 1)) if slots is None else slots
    initial = [i % 2 == 0 for i in range(n)] if initial is None else initial
    return {
        "u": torch.randn(dim, total, generator=g).to(dtype),
        "delta": (torch.randn(dim, total, generator=g) - 1.0).to(dtype),
        "A": -torch.exp(torch.rand(dim, dstate, generator=g) * 2.0),
        "B": torch.randn(groups, dstate, total, generator=g).to(dtype),
        "C": torch.randn(groups, dstate, total, generator=g).to(dtype),
        "D": torch.randn(dim, generator=g),
        "z": torch.randn(dim, total, generator=g).to(dtype),
        "bias": torch.randn(dim, generator=g) * 0.5,
        "qsl": qsl,
        "slots": torch.tensor(slots, dtype=torch.int32),
        "initial": torch.tensor(initial),
        "states": torch.randn(max(slots) + 2, dim, dstate, generator=g).to(dtype),
    }


def run_scan(fn, x, *, z=True, D=True, bias=True, softplus=True, varlen=True):
    """Call fn with vLLM's argument order on copies; returns (delta, z, states)."""
    delta, zz, states = x["delta"].clone(), x["z"].clone(), x["states"].clone()
    fn(
        x["u"],
        delta,
        x["A"],
        x["B"],
        x["C"],
        x["D"] if D else None,
        zz if z else None,
        x["bias"] if bias else None,
        softplus,
        x["qsl"] if varlen else None,
        x["slots"],
        x["initial"],
        states,
        0,
    )
    return delta, zz, states


def op(*args):
    torch.ops.vllm_x86.selective_scan_fwd(*args)


def assert_same(a, b, dtype):
    for got, want in zip(a, b, strict=True):
        torch.testing.assert_close(got.float(), want.float(), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "dim,dstate,groups", [(24, 16, 1), (64, 16, 2), (96, 8, 1)], ids=lambda v: str(v)
)
@pytest.mark.parametrize(
    "lens",
    [[1], [7, 33, 2], [5, 0, 12], [mamba.BLOCK + 3, 9]],
    ids=["one-token", "three", "with-empty", "over-a-block"],
)
def test_selective_scan_matches_reference(dtype, dim, dstate, groups, lens):
    x = scan_inputs(dim, dstate, groups, lens, dtype, seed=dim + len(lens))
    assert_same(run_scan(op, x), run_scan(reference.selective_scan_fwd, x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("initial", [[False, False], [True, True], [True, False]])
def test_selective_scan_initial_states(dtype, initial):
    x = scan_inputs(32, 16, 1, [6, 11], dtype, seed=3, initial=initial)
    got = run_scan(op, x)
    assert_same(got, run_scan(reference.selective_scan_fwd, x), dtype)
    untouched = [s for s in range(x["states"].shape[0]) if s not in x["slots"].tolist()]
    assert torch.equal(got[2][untouched], x["states"][untouched])


@pytest.mark.parametrize(
    "what",
    [
        {"z": False},
        {"D": False},
        {"bias": False},
        {"softplus": False},
        {"z": False, "D": False, "bias": False},
    ],
    ids=["no-z", "no-D", "no-bias", "no-softplus", "bare"],
)
def test_selective_scan_optional_inputs(what):
    x = scan_inputs(24, 16, 1, [4, 9], torch.float32, seed=5)
    if not what.get("softplus", True):  # dt must stay positive without the softplus
        x = {**x, "delta": x["delta"].abs() * 0.3, "bias": x["bias"].abs()}
    got = run_scan(op, x, **what)
    assert_same(got, run_scan(reference.selective_scan_fwd, x, **what), torch.float32)
    if not what.get("z", True):
        assert torch.equal(got[1], x["z"])  # z is only written when given


@pytest.mark.parametrize("dtype", DTYPES)
def test_selective_scan_batched_layout(dtype):
    """Without query_start_loc: u [batch, dim, L], B and C [batch, groups, dstate, L]."""
    batch, dim, dstate, length = 3, 16, 8, 10
    g = gen(11)
    x = {
        "u": torch.randn(batch, dim, length, generator=g).to(dtype),
        "delta": (torch.randn(batch, dim, length, generator=g) - 1).to(dtype),
        "A": -torch.exp(torch.rand(dim, dstate, generator=g)),
        "B": torch.randn(batch, 1, dstate, length, generator=g).to(dtype),
        "C": torch.randn(batch, 1, dstate, length, generator=g).to(dtype),
        "D": torch.randn(dim, generator=g),
        "z": torch.randn(batch, dim, length, generator=g).to(dtype),
        "bias": torch.randn(dim, generator=g),
        "qsl": None,
        "slots": torch.tensor([2, 1, 3], dtype=torch.int32),
        "initial": torch.tensor([True, False, True]),
        "states": torch.randn(4, dim, dstate, generator=g).to(dtype),
    }
    assert_same(
        run_scan(op, x, varlen=False),
        run_scan(reference.selective_scan_fwd, x, varlen=False),
        dtype,
    )


def test_selective_scan_skips_null_slots():
    """A sequence whose cache slot is null_block_id (0) is padding: nothing written."""
    x = scan_inputs(16, 8, 1, [4, 5, 3], torch.float32, seed=7, slots=[2, 0, 1])
    delta, z, states = run_scan(op, x)
    assert torch.equal(delta[:, 4:9], x["delta"][:, 4:9])
    assert torch.equal(z[:, 4:9], x["z"][:, 4:9])
    assert torch.equal(states[0], x["states"][0])
    assert_same((delta, z, states), run_scan(reference.selective_scan_fwd, x), torch.float32)


def test_selective_scan_in_chunks_equals_one_pass():
    """vLLM's chunked prefill: a prompt scanned in two pieces, the second starting from
    the state the first stored, gives the one-pass outputs and final state."""
    x = scan_inputs(32, 16, 1, [40], torch.float32, seed=9, slots=[1], initial=[False])
    whole = run_scan(op, x)
    cut = 17
    first = {
        **x,
        "u": x["u"][:, :cut],
        "delta": x["delta"][:, :cut],
        "z": x["z"][:, :cut],
        "B": x["B"][..., :cut].contiguous(),
        "C": x["C"][..., :cut].contiguous(),
        "qsl": torch.tensor([0, cut], dtype=torch.int32),
    }
    d1, z1, s1 = run_scan(op, first)
    second = {
        **x,
        "u": x["u"][:, cut:],
        "delta": x["delta"][:, cut:],
        "z": x["z"][:, cut:],
        "B": x["B"][..., cut:].contiguous(),
        "C": x["C"][..., cut:].contiguous(),
        "qsl": torch.tensor([0, 40 - cut], dtype=torch.int32),
        "initial": torch.tensor([True]),
        "states": s1,
    }
    d2, z2, s2 = run_scan(op, second)
    assert_same((torch.cat([d1, d2], -1), torch.cat([z1, z2], -1), s2), whole, torch.float32)


def test_selective_scan_refuses_prefix_caching_arguments():
    x = scan_inputs(16, 8, 1, [3], torch.float32, seed=1)
    args = [x["u"], x["delta"].clone(), x["A"], x["B"], x["C"], x["D"], None, None, True]
    args += [x["qsl"], x["slots"], x["initial"], x["states"].clone(), 0, 16]
    with pytest.raises(NotImplementedError, match="prefix caching"):
        mamba.selective_scan_fwd(*args, torch.zeros(1, dtype=torch.int32))


# ---------------------------------------------------------------- decode step


def update_inputs(batch, dim, dstate, dtype, seed):
    g = gen(seed)
    return {
        "state": torch.randn(batch + 3, dim, dstate, generator=g).to(dtype),
        "x": torch.randn(batch, dim, generator=g).to(dtype),
        "dt": (torch.randn(batch, dim, generator=g) - 1).to(dtype),
        "A": -torch.exp(torch.rand(dim, dstate, generator=g) * 2),
        "B": torch.randn(batch, dstate, generator=g).to(dtype),
        "C": torch.randn(batch, dstate, generator=g).to(dtype),
        "D": torch.randn(dim, generator=g).to(dtype),
        "z": torch.randn(batch, dim, generator=g).to(dtype),
        "bias": torch.randn(dim, generator=g),
    }


def run_update(fn, x, src, dst, z=True):
    state, out = x["state"].clone(), torch.full_like(x["x"], 7.0)
    fn(
        state,
        x["x"],
        x["dt"],
        x["A"],
        x["B"],
        x["C"],
        x["D"],
        x["z"] if z else None,
        x["bias"],
        True,
        src,
        dst,
        0,
        out,
    )
    return out, state


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("dim,dstate", [(24, 16), (1536, 16), (64, 4)])
def test_selective_state_update_matches_reference(dtype, batch, dim, dstate):
    x = update_inputs(batch, dim, dstate, dtype, seed=batch * dim)
    slots = torch.arange(batch, 0, -1, dtype=torch.int32)[:, None]  # [batch, 1], as vLLM
    got = run_update(torch.ops.vllm_x86.selective_state_update, x, slots, slots)
    assert_same(got, run_update(reference.selective_state_update, x, slots, slots), dtype)


def test_selective_state_update_skips_null_slots_and_writes_dst():
    x = update_inputs(3, 16, 8, torch.float32, seed=2)
    src = torch.tensor([1, 0, 2], dtype=torch.int32)
    dst = torch.tensor([4, 0, 5], dtype=torch.int32)
    out, state = run_update(torch.ops.vllm_x86.selective_state_update, x, src, dst, z=False)
    assert torch.equal(out[1], torch.full_like(out[1], 7.0))
    assert torch.equal(state[:4], x["state"][:4])  # sources and the null slot unchanged
    assert_same(
        (out, state),
        run_update(reference.selective_state_update, x, src, dst, z=False),
        torch.float32,
    )


def test_decode_step_continues_the_prefill_scan():
    """A prompt of L tokens scanned, then one decode step, equals a scan of L + 1."""
    x = scan_inputs(32, 16, 1, [9], torch.float32, seed=4, slots=[1], initial=[False])
    d_all, z_all, s_all = run_scan(reference.selective_scan_fwd, x)
    first = {
        **x,
        **{k: x[k][..., :8].contiguous() for k in ("u", "delta", "z", "B", "C")},
        "qsl": torch.tensor([0, 8], dtype=torch.int32),
    }
    _, _, states = run_scan(op, first)
    out = torch.empty(1, 32)
    torch.ops.vllm_x86.selective_state_update(
        states,
        x["u"][:, 8:].t(),
        x["delta"][:, 8:].t(),
        x["A"],
        x["B"][0, :, 8:].t(),
        x["C"][0, :, 8:].t(),
        x["D"],
        x["z"][:, 8:].t(),
        x["bias"],
        True,
        torch.tensor([[1]], dtype=torch.int32),
        torch.tensor([[1]], dtype=torch.int32),
        0,
        out,
    )
    torch.testing.assert_close(out[0], z_all[:, 8], **tol(torch.float32))
    torch.testing.assert_close(states[1], s_all[1], **tol(torch.float32))


def test_vllm_cpu_state_update_is_wrong_for_mamba1():
    """Why the plugin has its own decode step: vLLM's CPU selective_state_update (its
    wrapper adds the head axis Mamba-1 lacks) does not compute the Mamba-1 recurrence.
    When this starts failing, vLLM's kernel can take Mamba-1 decode back."""
    cpu_ssm = pytest.importorskip("vllm.model_executor.layers.mamba.ops.cpu.mamba_ssm")
    x = update_inputs(2, 24, 16, torch.float32, seed=0)
    slots = torch.tensor([[2], [1]], dtype=torch.int32)
    state, out = x["state"].clone(), torch.zeros_like(x["x"])
    cpu_ssm.selective_state_update(
        state,
        x["x"],
        x["dt"],
        x["A"],
        x["B"],
        x["C"],
        x["D"],
        z=x["z"],
        dt_bias=x["bias"],
        dt_softplus=True,
        state_batch_indices=slots,
        dst_state_batch_indices=slots,
        out=out,
    )
    want_out, want_state = run_update(reference.selective_state_update, x, slots, slots)
    assert not torch.allclose(state, want_state, rtol=1e-3, atol=1e-3)


# ---------------------------------------------------------------- causal conv1d


def test_mixer_reads_the_unpacked_conv_weight():
    """vLLM's CPU Linear dispatch packs bf16 [dim, 1, 4] conv weights in place and keeps
    the [dim, width] original in conv1d._cpu_unpacked_conv_weight; the mixer uses it."""

    class Layer(torch.nn.Module):
        def __init__(self, weight, unpacked=None):
            super().__init__()
            self.conv1d = torch.nn.Module()
            self.conv1d.weight = torch.nn.Parameter(weight, requires_grad=False)
            if unpacked is not None:
                self.conv1d._cpu_unpacked_conv_weight = unpacked

    w = torch.randn(8, 4)
    assert torch.equal(mamba._conv_weight(Layer(w.unsqueeze(1))), w)
    packed = torch.randn(8, 4)  # stands for the packed layout: same shape, other order
    assert torch.equal(mamba._conv_weight(Layer(packed, unpacked=w)), w)


@pytest.mark.parametrize("dtype", DTYPES)
def test_vllm_cpu_causal_conv1d_with_the_unpacked_weight(dtype):
    """The conv ops the plugin's mixer keeps from vLLM (prefill with initial states over
    several sequences, then one decode step) against the reference convolution."""
    conv = pytest.importorskip("vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d")
    dim, width, lens = 48, 4, [5, 1, 9]
    g = gen(21)
    x = torch.randn(dim, sum(lens), generator=g).to(dtype)
    w = torch.randn(dim, width, generator=g).to(dtype)
    bias = torch.randn(dim, generator=g).to(dtype)
    states = torch.randn(5, dim, width - 1, generator=g).to(dtype)
    qsl = torch.tensor([0, 5, 6, 15], dtype=torch.int32)
    slots = torch.tensor([3, 1, 4], dtype=torch.int32)
    initial = torch.tensor([True, False, True])
    got_states = states.clone()
    got = conv.causal_conv1d_fn_cpu(
        x,
        w,
        bias,
        conv_states=got_states,
        query_start_loc=qsl,
        cache_indices=slots,
        has_initial_state=initial,
        activation="silu",
    )
    want_states = states.clone().float()
    for i in range(3):
        a, b = qsl[i].item(), qsl[i + 1].item()
        s = slots[i].item()
        init = states[s] if initial[i] else None
        want, nxt = reference.causal_conv1d(x[:, a:b], w, bias, init, silu=True)
        torch.testing.assert_close(got[:, a:b].float(), want, **tol(dtype))
        want_states[s] = nxt
    torch.testing.assert_close(got_states.float(), want_states, **tol(dtype))

    # one decode token per sequence
    xd = torch.randn(3, dim, generator=g).to(dtype)
    dec_states = got_states.clone()
    out = conv.causal_conv1d_update_cpu(
        xd.clone(), dec_states, w, bias, "silu", conv_state_indices=slots
    )
    for i in range(3):
        s = slots[i].item()
        want, nxt = reference.causal_conv1d(xd[i][:, None], w, bias, got_states[s], silu=True)
        torch.testing.assert_close(out[i].float(), want[:, 0], **tol(dtype))
        torch.testing.assert_close(dec_states[s].float(), nxt, **tol(dtype))


def test_reference_conv_is_a_causal_depthwise_conv():
    x, w = torch.randn(6, 10), torch.randn(6, 4)
    want = F.conv1d(F.pad(x, (3, 0))[None], w[:, None, :], groups=6)[0]
    got, state = reference.causal_conv1d(x, w, None, None, silu=False)
    torch.testing.assert_close(got, want)
    assert torch.equal(state, x[:, -3:])
