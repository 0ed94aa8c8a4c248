"""GPTQ for x86_int4 (quant/gptq.py): the codes it writes have RTN's format, and the
layer's output error on the inputs it was calibrated with is lower than RTN's."""

from __future__ import annotations

import pytest
import torch

from vllm_x86.quant import gptq
from vllm_x86.quant.methods import dequantize_int4, quantize_int4


def _layer(n=256, k=256, rows=2048, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    mix = torch.randn(k, k, generator=g) * 0.15 + torch.eye(k)
    scale = torch.rand(k, generator=g) * 3 + 0.1  # channels of unequal weight
    x = (torch.randn(rows, k, generator=g) @ mix) * scale  # correlated inputs
    return w, x


def _out_err(x, w, q, s, z, group):
    return ((x @ (dequantize_int4(q, s, z, group) - w).t()) ** 2).mean().item()


@pytest.mark.parametrize("group", [32, 64, 128])
def test_gptq_has_rtn_format_and_lower_output_error(group):
    w, x = _layer()
    q, s, z = gptq.quantize_int4_gptq(w, x.t() @ x, group)
    rq, rs, rz = quantize_int4(w, group, True)
    assert q.dtype == rq.dtype == torch.int32 and q.shape == rq.shape
    assert s.dtype == torch.bfloat16 and s.shape == rs.shape
    assert z.dtype == torch.int32 and z.shape == rz.shape
    assert 0 <= int(q.min()) and int(q.max()) <= 15 and 0 <= int(z.min()) and int(z.max()) <= 15
    gptq_err, rtn_err = _out_err(x, w, q, s, z, group), _out_err(x, w, rq, rs, rz, group)
    assert gptq_err < 0.7 * rtn_err, (gptq_err, rtn_err)


def test_held_out_inputs_also_gain():
    """Calibrated on one sample, measured on another from the same distribution."""
    w, x = _layer(seed=1)
    _, held_out = _layer(seed=1, rows=4096)
    held_out = held_out[2048:]
    q, s, z = gptq.quantize_int4_gptq(w, x.t() @ x, 64)
    rq, rs, rz = quantize_int4(w, 64, True)
    assert _out_err(held_out, w, q, s, z, 64) < 0.8 * _out_err(held_out, w, rq, rs, rz, 64)


def test_group_search_never_worse_than_min_max():
    g = torch.Generator().manual_seed(2)
    wg = torch.randn(512, 64, generator=g) * 0.03
    wg[::7, 3] = 0.4  # outliers: the case where clipping the range pays
    imp = torch.rand(64, generator=g) + 0.5
    s, z = gptq.group_params(wg, imp)
    rq, rs, rz = quantize_int4(wg, 64, True)

    def err(scale, zero):
        code = (torch.round(wg / scale[:, None]) + zero[:, None]).clamp(0, 15)
        return (((code - zero[:, None]) * scale[:, None] - wg) ** 2 * imp).sum(-1)

    searched, minmax = err(s, z), err(rs[0].float(), rz[0].float())
    assert bool((searched <= minmax + 1e-12).all())
    assert float(searched.sum()) < 0.95 * float(minmax.sum())
    assert torch.equal(s.to(torch.bfloat16).float(), s)  # representable as bf16


def test_dead_input_channels_do_not_break_it():
    w, x = _layer(n=64, k=128)
    x[:, 5] = 0.0  # a channel calibration never sees
    q, s, z = gptq.quantize_int4_gptq(w, x.t() @ x, 64)
    d = dequantize_int4(q, s, z, 64)
    assert torch.isfinite(d).all()
    with pytest.raises(ValueError, match="not a multiple of the group size"):
        gptq.quantize_int4_gptq(w[:, :96], torch.eye(96), 64)


def test_hessians_are_xtx_of_each_linear_input():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50, 16)
            self.up = torch.nn.Linear(16, 32)
            self.down = torch.nn.Linear(32, 16)
            self.head = torch.nn.Linear(16, 50)

        def forward(self, ids, use_cache=False):
            h = self.emb(ids)
            self.seen = h
            return self.head(self.down(torch.relu(self.up(h))))

    torch.manual_seed(0)
    m = Block()
    ids = torch.randint(0, 50, (3, 10))
    hs = gptq.hessians(m, ids, lambda name: name != "head")
    assert set(hs) == {"up", "down"}
    x = m.emb(ids).reshape(-1, 16).detach()
    torch.testing.assert_close(hs["up"], x.t() @ x)
    hidden = torch.relu(m.up(x)).detach()
    torch.testing.assert_close(hs["down"], hidden.t() @ hidden, rtol=1e-4, atol=1e-4)


def test_calibration_text_is_not_the_evaluation_text():
    from vllm_x86.quant.quality import eval_text

    calib = gptq.calib_text()
    assert len(calib) > 100_000
    sample = eval_text()[5000:5200]
    assert sample not in calib


def test_converter_refuses_gptq_when_the_hessians_do_not_fit(tiny_bf16, tmp_path, monkeypatch):
    """A model whose X^T X matrices would not fit in memory gets a sentence naming
    --method rtn, before any calibration runs, and no output directory."""
    from vllm_x86.quant import convert
    from vllm_x86.quant.convert import ConvertError, quantize_checkpoint

    monkeypatch.setattr(convert, "_available_memory", lambda: 100_000)
    with pytest.raises(ConvertError, match="--method rtn") as e:
        quantize_checkpoint(tiny_bf16, tmp_path / "out", 4, method="gptq", progress=None)
    assert "GiB for this model" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_converter_gptq_without_a_tokenizer_says_so(tiny_bf16, tmp_path):
    """tiny_bf16's tokenizer_config.json names no tokenizer transformers can build."""
    from vllm_x86.quant.convert import ConvertError, quantize_checkpoint

    with pytest.raises(ConvertError, match="(?s)needs the model.s tokenizer.*--method rtn"):
        quantize_checkpoint(tiny_bf16, tmp_path / "out", 4, method="gptq", progress=None)
    assert not (tmp_path / "out").exists()
