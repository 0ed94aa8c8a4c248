"""How x86_int4 picks each group's scale and zero point (methods.quantize_int4,
VLLM_X86_QUANT_INT4_ROUNDING): the default search against a float32 reference written
group by group, on weights with outliers, all-zero and constant groups; its error never
above min/max rounding's; codes, zero points and scales in the kernels' format."""

from __future__ import annotations

import pytest
import torch

from vllm_x86.runtime.quant import methods as m


def _weights(n=48, k=256, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    w[3, 5] = 0.9  # outliers, one per sign
    w[7, 130] = -1.3
    w[11, 64:128] = 0.0  # an all-zero group (of 64)
    w[12, 0:64] = 0.25  # constant groups, positive and negative
    w[13, 128:192] = -0.125
    w[14, :] = 0.0  # an all-zero row
    w[15, 0:64] = 1e-30  # tiny values
    return w.to(torch.bfloat16)


def _reference(wg: torch.Tensor, zero_point: bool):
    """Float32, one group at a time: the candidates of the search and its objective
    (sum of |w| * error^2), the first of the least kept."""
    wg = wg.float()
    out_s, out_z = [], []
    for grp in wg.reshape(-1, wg.shape[-1]):
        lo0 = min(float(grp.min()), 0.0)
        hi0 = max(float(grp.max()), 0.0)
        if zero_point:
            cands = []
            for a in m.SEARCH_SHRINK:
                lo, hi = (lo0 * a, hi0) if hi0 >= -lo0 else (lo0, hi0 * a)
                s = m._bf16_up(torch.tensor([(hi - lo) / 15.0]))[0]
                cands.append((s, torch.round(-torch.tensor(lo) / s).clamp(0, 15)))
        else:
            eight = torch.tensor(8.0)
            cands = [
                (m._bf16_up(torch.tensor([max(hi0, -lo0) / 7.0]))[0], eight),
                (m._bf16_up(torch.tensor([max(hi0 / 7.0, -lo0 / 8.0)]))[0], eight),
            ]
        best = None
        for s, z in cands:
            q = (torch.round(grp / s) + z).clamp(0, 15)
            err = float((grp.abs() ** m.SEARCH_WEIGHT_POWER * ((q - z) * s - grp) ** 2).sum())
            if best is None or err < best[0]:
                best = (err, s, z)
        out_s.append(best[1])
        out_z.append(best[2])
    shape = wg.shape[:-1]
    return torch.stack(out_s).view(shape), torch.stack(out_z).view(shape)


def _objective(w, q, s, z, group):
    """Per group (rows x groups): sum of |w| * (w - dequantized)^2."""
    n, k = w.shape
    wf = w.float()
    err = (m.dequantize_int4(q, s, z, group) - wf) ** 2 * wf.abs() ** m.SEARCH_WEIGHT_POWER
    return err.view(n, k // group, group).sum(-1)


def _check_format(w, q, s, z, group, zero_point):
    n, k = w.shape
    assert q.dtype == torch.int32 and q.shape == (n, k)
    assert s.dtype == torch.bfloat16 and s.shape == (k // group, n)
    assert z.dtype == torch.int32 and z.shape == (k // group, n)
    assert 0 <= int(q.min()) and int(q.max()) <= 15
    assert 0 <= int(z.min()) and int(z.max()) <= 15
    if not zero_point:
        assert (z == 8).all()
    assert torch.isfinite(s.float()).all() and (s.float() > 0).all()
    d = m.dequantize_int4(q, s, z, group)
    assert torch.isfinite(d).all()
    return d


@pytest.mark.parametrize("zero_point", [True, False])
@pytest.mark.parametrize("group", [64, 128])
def test_search_matches_float32_reference_and_is_never_worse_than_minmax(group, zero_point):
    w = _weights()
    q, s, z = m.quantize_int4(w, group, zero_point, "search")
    d = _check_format(w, q, s, z, group, zero_point)
    mq, ms, mz = m.quantize_int4(w, group, zero_point, "minmax")
    _check_format(w, mq, ms, mz, group, zero_point)

    n, k = w.shape
    ref_s, ref_z = _reference(w.view(n, k // group, group), zero_point)
    wg = w.float().view(n, k // group, group)
    ref_q = (torch.round(wg / ref_s[..., None]) + ref_z[..., None]).clamp(0, 15).view(n, k)
    ref_codes = (ref_q.int(), ref_s.t().to(torch.bfloat16), ref_z.t().int())
    ours, ref_err = _objective(w, q, s, z, group), _objective(w, *ref_codes, group)
    # the reference's choice (or one of equal error, where two candidates tie)
    torch.testing.assert_close(ours, ref_err, rtol=1e-5, atol=1e-30)
    assert (q != ref_codes[0]).float().mean() < 0.01
    # never worse than min/max in its objective, group by group; better in total
    minmax = _objective(w, mq, ms, mz, group)
    assert (ours <= minmax * (1 + 1e-6)).all()
    assert ours.sum() < minmax.sum()
    # all-zero groups and rows dequantize to exact zeros
    assert (d[14] == 0).all()
    assert (d[11, 64:128] == 0).all()
    # constant groups within half a step (codes reach them without clipping)
    step = s.t().float().repeat_interleave(group, dim=1)
    for r, cols in ((12, slice(0, 64)), (13, slice(128, 192))):
        assert ((d[r, cols] - w[r, cols].float()).abs() <= step[r, cols] / 2 + 1e-9).all()


@pytest.mark.parametrize("zero_point", [True, False])
def test_search_keeps_each_groups_largest_magnitude(zero_point):
    """The side of a group with the larger magnitude is never clipped: the outliers come
    back within half a step (one with a rounded zero point)."""
    w = _weights()
    q, s, z = m.quantize_int4(w, 64, zero_point, "search")
    d = m.dequantize_int4(q, s, z, 64)
    step = s.t().float().repeat_interleave(64, dim=1)
    for r, c in ((3, 5), (7, 130)):
        assert abs(float(d[r, c]) - float(w[r, c])) <= float(step[r, c]) + 1e-6


def test_minmax_is_the_rounding_of_before():
    """VLLM_X86_QUANT_INT4_ROUNDING=minmax gives exactly the codes quantize_int4 gave
    before the search (each group's own range)."""
    w = _weights(seed=1)
    for zp in (True, False):
        n, k = w.shape
        wg = w.float().view(n, k // 64, 64)
        if zp:
            lo, hi = wg.amin(-1).clamp(max=0), wg.amax(-1).clamp(min=0)
            scale = m._bf16_up((hi - lo) / 15.0)
            zero = torch.round(-lo / scale).clamp(0, 15)
        else:
            scale = m._bf16_up(wg.abs().amax(-1) / 7.0)
            zero = torch.full_like(scale, 8.0)
        q = (torch.round(wg / scale[..., None]) + zero[..., None]).clamp(0, 15)
        got = m.quantize_int4(w, 64, zp, "minmax")
        assert torch.equal(got[0], q.view(n, k).int())
        assert torch.equal(got[1], scale.t().to(torch.bfloat16))
        assert torch.equal(got[2], zero.t().int())


def test_rows_in_chunks_give_the_same_codes(monkeypatch):
    w = _weights(n=40, k=256, seed=2)
    whole = m.quantize_int4(w, 128, True, "search")
    monkeypatch.setattr(m, "_CHUNK_ELEMENTS", 3 * 256)  # 3 rows a chunk, 40 rows
    chunked = m.quantize_int4(w, 128, True, "search")
    for a, b in zip(whole, chunked):
        assert torch.equal(a, b)


def test_setting_picks_the_rounding(monkeypatch):
    w = _weights(seed=3)
    monkeypatch.delenv("VLLM_X86_QUANT_INT4_ROUNDING", raising=False)
    assert m.int4_rounding() == "search"
    default = m.quantize_int4(w, 64, True)
    assert all(torch.equal(a, b) for a, b in zip(default, m.quantize_int4(w, 64, True, "search")))
    monkeypatch.setenv("VLLM_X86_QUANT_INT4_ROUNDING", "minmax")
    old = m.quantize_int4(w, 64, True)
    assert all(torch.equal(a, b) for a, b in zip(old, m.quantize_int4(w, 64, True, "minmax")))
    assert not torch.equal(old[0], default[0])
    monkeypatch.setenv("VLLM_X86_QUANT_INT4_ROUNDING", "hqq")
    with pytest.raises(ValueError, match="VLLM_X86_QUANT_INT4_ROUNDING must be one of"):
        m.quantize_int4(w, 64, True)


def test_a_wrong_setting_stops_the_config_with_a_sentence(monkeypatch):
    from vllm_x86.runtime.quant import scope

    monkeypatch.setenv("VLLM_X86_QUANT_INT4_ROUNDING", "nearest")
    with pytest.raises(ValueError, match="must be one of search, minmax, not 'nearest'"):
        scope.options(4)
    assert scope.options(8, lm_head="0")[2] == 0  # INT8 alone does not read it


# ---------------------------------------------------------------- groups of 32


def _q4_1_grid(n=64, k=256, seed=3) -> torch.Tensor:
    """Weights as a GGUF Q4_1 file dequantizes them: each group of 32 is d * c + m with
    codes c 0..15, a float scale d and a float offset m (not a multiple of d), in bf16."""
    g = torch.Generator().manual_seed(seed)
    groups = n * k // 32
    d = torch.rand(groups, 1, generator=g) * 0.01 + 0.001
    mn = -d * (torch.rand(groups, 1, generator=g) * 10 + 2)  # offset between codes
    c = torch.randint(0, 16, (groups, 32), generator=g).float()
    c[:, 0], c[:, 1] = 0, 15  # every group spans its 16 values
    return (d * c + mn).view(n, k).to(torch.bfloat16)


@pytest.mark.parametrize("rounding", ["search", "minmax"])
def test_groups_of_32_zero_points_in_eighths(rounding):
    """Groups of 32 hold zero points in eighths of a step: a Q4_1-style weight (offset a
    fraction of a step) comes back (min/max: within 1/16 of a step plus the scale's bf16
    rounding) far closer than with integer zero points, which lose up to half a step; codes 0..15, zero points on
    eighths in 0..15, no NaN on the outlier, zero and constant groups."""
    w = _q4_1_grid()
    q, s, z = m.quantize_int4(w, 32, True, rounding)
    assert z.dtype == torch.float32 and ((z * 8) == torch.round(z * 8)).all()
    assert (z >= 0).all() and (z <= 15).all() and q.min() >= 0 and q.max() <= 15
    d = m.dequantize_int4(q, s, z, 32)
    step = s.t().float().repeat_interleave(32, dim=1)
    err = (d - w.float()).abs() / step
    if rounding == "minmax":  # the search may clip a group's smaller side
        assert float(err.max()) < 1 / 16 + 15 * 2**-7 + 0.01
    qi, si, zi = m.quantize_int4(w, 32, True, rounding, fine=False)
    di = m.dequantize_int4(qi, si, zi, 32)
    assert float((d - w.float()).norm()) < 0.3 * float((di - w.float()).norm())
    q, s, z = m.quantize_int4(_weights(k=256), 32, True, rounding)
    d = m.dequantize_int4(q, s, z, 32)
    assert torch.isfinite(d).all() and (d[14] == 0).all()


def test_grid_kept_only_where_the_weights_sit_on_one():
    """grid_group: groups of 32 for a weight already on a 4-bit grid of 32 (as a
    dequantized Q4_1/Q4_K file), the layer's own groups for any other weight, for
    symmetric groups, for a kernel with integer zero points, and when turned off."""
    grid, other = _q4_1_grid(), _weights(k=256)
    assert m.grid_ratio(grid) < m.GRID_RATIO < m.grid_ratio(other)
    assert m.grid_group(grid, 128, True, "w4a16") == 32
    assert m.grid_group(grid, 64, True, "torch") == 32
    assert m.grid_group(other, 128, True, "w4a16") == 128
    assert m.grid_group(grid, 128, False, "w4a16") == 128
    assert m.grid_group(grid, 128, True, "vllm") == 128


def test_grid_rule_off(monkeypatch):
    monkeypatch.setenv("VLLM_X86_QUANT_INT4_GRID", "0")
    assert m.grid_group(_q4_1_grid(), 128, True, "w4a16") == 128
