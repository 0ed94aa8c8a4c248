"""GPTQ for x86_int4 (quant/gptq.py): the codes it writes have RTN's format, and the
layer's output error on the inputs it was calibrated with is lower than RTN's; the
converter's calibration, one decoder layer at a time, sees what a pass of the whole
model sees, and keeps one decoder layer's Hessians at a time."""

from __future__ import annotations

import weakref

import pytest
import torch

from vllm_x86.runtime.quant.methods import dequantize_int4, quantize_int4
from vllm_x86.tools.quantize import gptq


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
    rq, rs, rz = quantize_int4(wg, 64, True, "minmax")

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
    from vllm_x86.tools.quantize.quality import eval_text

    calib = gptq.calib_text()
    assert len(calib) > 100_000
    sample = eval_text()[5000:5200]
    assert sample not in calib


def test_converter_refuses_gptq_when_the_hessians_do_not_fit(tiny_bf16, tmp_path, monkeypatch):
    """A model whose calibration (one decoder layer's X^T X matrices, hidden states,
    codes) would not fit in memory gets a sentence naming --method rtn, before any
    calibration runs, and no output directory."""
    from vllm_x86.tools.quantize import convert
    from vllm_x86.tools.quantize.convert import ConvertError, quantize_checkpoint

    monkeypatch.setattr(convert, "_available_memory", lambda: 100_000)
    with pytest.raises(ConvertError, match="--method rtn") as e:
        quantize_checkpoint(tiny_bf16, tmp_path / "out", 4, method="gptq", progress=None)
    assert "one decoder layer's inputs" in str(e.value) and "GiB for this model" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_converter_gptq_without_a_tokenizer_says_so(tiny_bf16, tmp_path):
    """tiny_bf16's tokenizer_config.json names no tokenizer transformers can build."""
    from vllm_x86.tools.quantize.convert import ConvertError, quantize_checkpoint

    with pytest.raises(ConvertError, match="(?s)needs the model.s tokenizer.*--method rtn"):
        quantize_checkpoint(tiny_bf16, tmp_path / "out", 4, method="gptq", progress=None)
    assert not (tmp_path / "out").exists()


def _tiny_model(arch: str, layers: int = 2, **extra):
    """A small random transformers model of `arch` (bf16, as the converter loads a bf16
    checkpoint) and calibration ids for it."""
    from transformers import AutoModelForCausalLM

    from vllm_x86.tools.conformance.tiny import tiny_config

    cfg = tiny_config(arch, {"num_hidden_layers": layers, **extra})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    ids = torch.randint(0, cfg.vocab_size, (3, 48), generator=torch.Generator().manual_seed(1))
    return model, ids


def _in_layers(name: str, _linear=None) -> int | None:
    return 64 if ".layers." in name else None


def _collect(into: dict):
    def on_layer(_i, hs):
        into.update({k: v.clone() for k, v in hs.items()})

    return on_layer


@pytest.mark.parametrize(
    "arch,extra",
    [
        ("LlamaForCausalLM", {}),
        ("Qwen2ForCausalLM", {}),
        ("Qwen3ForCausalLM", {}),
        # layer 1 attends within a window of 16 of the 48 tokens, layer 0 to all: each
        # layer must get its own mask
        ("Qwen2ForCausalLM", {"use_sliding_window": True, "max_window_layers": 1}),
    ],
)
def test_sequential_without_quantization_sees_what_one_pass_sees(arch, extra):
    model, ids = _tiny_model(arch, **extra)
    if extra:
        assert model.config.layer_types == ["full_attention", "sliding_attention"]
    whole = gptq.hessians(model, ids, lambda name: _in_layers(name) is not None)
    seq: dict[str, torch.Tensor] = {}
    codes = gptq.sequential_gptq(model, ids, _in_layers, quantize=False, on_layer=_collect(seq))
    assert codes == {}
    assert set(seq) == set(whole) and len(whole) == 14  # 7 Linear layers x 2
    for name, h in whole.items():
        assert torch.equal(seq[name], h), name


def test_sequential_quantizes_layer_by_layer():
    """Layer 0 is calibrated on the model's own inputs, exactly as in one pass of the
    whole model, and its codes are GPTQ's for that H; layer 1 is calibrated on what the
    quantized layer 0 puts out, and its weights end as their quantized values."""
    from vllm_x86.runtime.quant.methods import dequantize_int4

    model, ids = _tiny_model("LlamaForCausalLM")
    whole = gptq.hessians(model, ids, lambda name: _in_layers(name) is not None)
    weights = {n: mod.weight.detach().clone() for n, mod in model.named_modules() if n in whole}
    seq: dict[str, torch.Tensor] = {}
    codes = gptq.sequential_gptq(model, ids, _in_layers, on_layer=_collect(seq))
    assert set(codes) == set(whole)
    for name in whole:
        if ".layers.0." in name:
            assert torch.equal(seq[name], whole[name]), name
            want = gptq.quantize_int4_gptq(weights[name], whole[name], 64)
            for got, exp in zip(codes[name].unpack(), want):
                assert torch.equal(got, exp), name
        else:
            # inputs of the quantized layer 0: visibly not the unquantized model's
            rel = (seq[name] - whole[name]).norm() / whole[name].norm()
            assert rel > 1e-3, (name, float(rel))
        q, s, z = codes[name].unpack()
        mod = model.get_submodule(name)
        assert torch.equal(mod.weight, dequantize_int4(q, s, z, 64).to(torch.bfloat16))
        assert not torch.equal(mod.weight, weights[name])


def test_one_decoder_layers_hessians_alive_at_a_time():
    model, ids = _tiny_model("LlamaForCausalLM", layers=3)
    alive: list[weakref.ref] = []
    peak = []

    def on_layer(_i, hs):
        alive[:] = [r for r in alive if r() is not None]
        alive.extend(weakref.ref(h) for h in hs.values())
        peak.append(len(alive))

    codes = gptq.sequential_gptq(model, ids, _in_layers, on_layer=on_layer)
    assert len(codes) == 21
    assert peak == [7, 7, 7]  # each layer's 7 Linear layers, none of the layer before
    assert all(r() is None for r in alive)


def test_calibration_bytes_counts_one_layer():
    model, _ = _tiny_model("LlamaForCausalLM", layers=3)
    wanted = lambda name: ".layers." in name and not name.endswith("down_proj")  # noqa: E731
    # per layer: q, k, v, o, gate, up take 128 inputs; GPTQ's 3 working copies of the largest
    hess = 6 * 4 * 128**2 + 3 * 4 * 128**2
    hidden = 2 * 32 * 512 * 128 * 2  # inputs and outputs, bf16
    weights = 3 * 128 * (128 + 64 + 64 + 128 + 256 + 256)  # q, k, v, o, gate, up
    assert gptq.calibration_bytes(model, wanted, 32, 512) == hess + hidden + weights // 2


def test_codes_unpack_to_what_gptq_returned():
    w, x = _layer(n=32, k=128)
    r = gptq.quantize_int4_gptq(w, x.t() @ x, 64)
    c = gptq.Codes.of(*r)
    assert c.nibbles.dtype == torch.uint8 and c.nibbles.shape == (32, 64)
    for got, exp in zip(c.unpack(), r):
        assert torch.equal(got, exp)


def test_the_lm_head_is_calibrated_on_the_quantized_models_final_norm_outputs():
    """With head_group, sequential_gptq ends with the LM head: its codes are GPTQ's for
    H = X^T X of what the final norm puts out in the model whose layers it has just
    quantized (an independent forward pass of that model), and with a lower output
    error on those inputs than round to nearest; without head_group there are none."""
    model, ids = _tiny_model("LlamaForCausalLM")
    head = model.get_output_embeddings().weight.detach().float().clone()
    codes = gptq.sequential_gptq(model, ids, _in_layers, head_group=64)
    assert gptq.HEAD in codes
    with torch.no_grad():
        xs = [model.model(row[None], use_cache=False).last_hidden_state[0].float() for row in ids]
    h = sum(x.t() @ x for x in xs)
    want = gptq.quantize_int4_gptq(head, h, 64)
    got = codes[gptq.HEAD].unpack()
    # the same H up to float32 summation order: the same codes on all but a few weights
    assert (got[0] != want[0]).float().mean() < 0.01
    x = torch.cat(xs)
    assert _out_err(x, head, *got, 64) < 0.8 * _out_err(x, head, *quantize_int4(head, 64, True), 64)
    model2, ids2 = _tiny_model("LlamaForCausalLM")
    assert gptq.HEAD not in gptq.sequential_gptq(model2, ids2, _in_layers)


def test_final_norm_is_found_or_named_missing():
    model, _ = _tiny_model("Qwen3ForCausalLM")
    assert gptq.final_norm(model) is model.model.norm
    del model.model.norm
    with pytest.raises(ValueError, match="no final norm"):
        gptq.final_norm(model)


def test_lm_head_codes_load_checked_and_padded(tmp_path):
    """The converter's head codes file loads as quantize_int4's triple; rows vLLM pads
    the vocabulary with get zero codes and scales; a file for another head (rows,
    columns or groups) or a damaged one is a FormatError that says what to do."""
    from safetensors.torch import save_file

    from vllm_x86.runtime.quant.format import FormatError
    from vllm_x86.runtime.quant.lm_head import load_codes

    w, x = _layer(n=96, k=128)
    q, s, z = gptq.quantize_int4_gptq(w, x.t() @ x, 64)
    c = gptq.Codes.of(q, s, z)
    path = tmp_path / "lm_head.safetensors"
    tensors = {"qweight": c.nibbles, "scale": c.scale, "zero": c.zero.to(torch.uint8)}
    save_file(tensors, str(path), metadata={"group_size": "64"})
    got = load_codes(str(path), 96, 128, 64)
    for a, b in zip(got, (q, s, z)):
        assert torch.equal(a, b)
    gq, gs, gz = load_codes(str(path), 128, 128, 64)  # 32 padded rows
    assert torch.equal(gq[:96], q) and not gq[96:].any()
    assert torch.equal(gs[:, :96], s) and not gs[:, 96:].float().any() and not gz[:, 96:].any()
    for n, k, g in ((64, 128, 64), (96, 256, 64), (96, 128, 128)):
        with pytest.raises(FormatError, match="not for this model's"):
            load_codes(str(path), n, k, g)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(FormatError, match="could not be read.*quantize the bf16 model again"):
        load_codes(str(path), 96, 128, 64)


def test_converter_lm_head_values(tiny_bf16, tmp_path):
    """--lm-head int4 without GPTQ writes the bf16 head and asks for INT4 while loading
    (format version 2, no codes file), and says so; int8 likewise; another value is a
    sentence."""
    import json

    from vllm_x86.tools.quantize.convert import ConvertError, quantize_checkpoint

    for head, bits in (("int4", 4), ("int8", 8)):
        said: list[str] = []
        out = tmp_path / head
        quantize_checkpoint(tiny_bf16, out, 4, method="rtn", lm_head=head, progress=said.append)
        cfg = json.loads((out / "config.json").read_text())["quantization_config"]
        assert cfg["lm_head"] == bits and "lm_head_codes" not in cfg
        assert cfg["format_version"] == 2 and not (out / "x86").exists()
        assert any(f"quantized to INT{bits} while loading" in m for m in said), said
    with pytest.raises(ConvertError, match="--lm-head must be int8 or int4, not 'int2'"):
        quantize_checkpoint(tiny_bf16, tmp_path / "bad", 4, method="rtn", lm_head="int2")
