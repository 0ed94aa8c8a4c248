"""MoE experts in the prepacked format (`vllm-x86 quantize`, format version 2): the
converter packs each expert's gate, up and down as moe.py packs them while loading
(moe.pack_experts), the prepacked method creates the packed parameters and its loader
puts each expert's tensors where the quantize-while-loading method puts its own: the
parameters are equal, byte for byte, and so is the output. Shapes the kernel does not
take are written as they are and treated as `--quantization` treats them; checkpoints
of format version 1 (experts in bf16) load as before, quantized while loading.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from tests.unit.conftest import needs_quant_kernels, tiny_qwen3_moe_config

# (bits, group size, zero point, layout) of the prepacked formats
FORMATS = [
    (8, 128, False, "vllm-x86-int8-w8a16-amx-1"),
    (4, 128, True, "vllm-x86-int4-w4a16-amx-1"),
    (4, 64, False, "vllm-x86-int4-w4a16-amx-1"),
    (4, 32, True, "vllm-x86-int4-w4a16-amx-1"),
]


def _config(bits, group, zero_point, prepacked=False, layout=None, packed_experts=None):
    from vllm_x86.runtime.quant.config import X86Int4Config, X86Int8Config

    cls = X86Int8Config if bits == 8 else X86Int4Config
    return cls(
        group_size=group,
        zero_point=zero_point,
        lm_head=False,
        prepacked=prepacked,
        layout=layout,
        format_version=2 if prepacked else None,
        packed_experts=packed_experts,
    )


def _moe(h, i, bias=False, use_ep=False, tp_size=1):
    """What the methods read of vLLM's FusedMoEConfig."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    return SimpleNamespace(
        hidden_dim=h,
        intermediate_size_per_partition=i,
        has_bias=bias,
        is_act_and_mul=True,
        activation=MoEActivation.SILU,
        moe_parallel_config=SimpleNamespace(use_ep=use_ep, tp_size=tp_size),
    )


def _layer():
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    layer = torch.nn.Module()
    layer.activation = MoEActivation.SILU
    layer.apply_router_weight_on_input = False
    layer.expert_map = None
    return layer


def _weights(e, h, i, seed=0):
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(e, 2 * i, h, generator=g) / h**0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, h, i, generator=g) / i**0.5).to(torch.bfloat16)
    return w13, w2


def _on_the_fly(cfg, moe, w13, w2):
    from vllm_x86.runtime.quant.moe import X86QuantMoEMethod

    layer = _layer()
    layer.w13_weight = torch.nn.Parameter(w13.clone(), requires_grad=False)
    layer.w2_weight = torch.nn.Parameter(w2.clone(), requires_grad=False)
    method = X86QuantMoEMethod(cfg, moe)
    layer.quant_method = method
    method.process_weights_after_loading(layer)
    return method, layer


def _prepacked(cfg, moe, w13, w2, order_seed=3):
    """The prepacked method's layer, its tensors loaded as vLLM's expert loader hands
    them over (one expert and shard at a time, in a shuffled order)."""
    from vllm_x86.runtime.quant.moe import X86QuantMoEMethod, pack_experts

    e, two_i, h = w13.shape
    i = two_i // 2
    layer = _layer()
    method = X86QuantMoEMethod(cfg, moe, prepacked=True)
    layer.quant_method = method
    method.create_weights(layer, e, h, i, torch.bfloat16, weight_loader=None)
    loads = []
    for x in range(e):
        packed = pack_experts(
            cfg.BITS, method.kernel, w13[x, :i], w13[x, i:], w2[x], cfg.group_size, cfg.zero_point
        )
        for shard, tensors in packed.items():
            for name, t in tensors.items():
                loads.append((x, shard, name, t.clone()))
    perm = torch.randperm(len(loads), generator=torch.Generator().manual_seed(order_seed))
    for j in perm.tolist():
        x, shard, name, t = loads[j]
        param = getattr(layer, f"{'w2' if shard == 'w2' else 'w13'}_{name}")
        assert param.weight_loader(
            param=param,
            loaded_weight=t,
            weight_name=f"experts.{x}.{shard}.{name}",
            shard_id=shard,
            expert_id=x,
            return_success=True,
        )
    method.process_weights_after_loading(layer)
    return method, layer


@needs_quant_kernels
@pytest.mark.parametrize("bits,group,zero_point,layout", FORMATS)
def test_packed_shapes_are_those_of_quantize_pack(bits, group, zero_point, layout):
    from vllm_x86.runtime.quant import methods as m

    kernel = "w8a16" if bits == 8 else m.int4_layout_kernel(layout)
    for n, k in ((128, 256), (64, 128), (256, 64)):
        w = torch.randn(n, k).to(torch.bfloat16)
        g = m.effective_group_size(k, group) if bits == 4 else None
        got = m.quantize_pack(bits, kernel, w, g, zero_point)
        want = m.packed_shapes(bits, kernel, n, k, g)
        assert set(got) == set(want)
        for name, (shape, dtype, _) in want.items():
            assert (tuple(got[name].shape), got[name].dtype) == (shape, dtype), name


@needs_quant_kernels
@pytest.mark.parametrize("bits,group,zero_point,layout", FORMATS)
def test_packed_gate_and_up_are_gate_and_up_packed_alone(bits, group, zero_point, layout):
    """pack_experts splits the packed w13 at half its rows: the halves are what packing
    gate and up on their own gives, so the split puts each in its place."""
    from vllm_x86.runtime.quant import methods as m
    from vllm_x86.runtime.quant.moe import expert_group, pack_experts

    kernel = "w8a16" if bits == 8 else m.int4_layout_kernel(layout)
    h, i = 128, 64
    w13, w2 = _weights(1, h, i)
    gate, up = w13[0, :i], w13[0, i:]
    got = pack_experts(bits, kernel, gate, up, w2[0], group, zero_point)
    g = expert_group(bits, h, group)
    for shard, w in (("w1", gate), ("w3", up)):
        alone = m.quantize_pack(bits, kernel, w, g, zero_point)
        assert set(alone) == set(got[shard])
        for name, t in alone.items():
            assert torch.equal(got[shard][name], t), (shard, name)
    down = m.quantize_pack(bits, kernel, w2[0], expert_group(bits, i, group), zero_point)
    assert all(torch.equal(got["w2"][name], t) for name, t in down.items())


@needs_quant_kernels
@pytest.mark.parametrize("bits,group,zero_point,layout", FORMATS)
def test_prepacked_experts_equal_quantized_while_loading(bits, group, zero_point, layout):
    e, h, i, rows = 8, 256, 128, 9
    w13, w2 = _weights(e, h, i)
    moe = _moe(h, i)
    live, live_layer = _on_the_fly(_config(bits, group, zero_point), moe, w13, w2)
    cfg = _config(bits, group, zero_point, True, layout, ["model.layers.0.mlp.experts"])
    pre, pre_layer = _prepacked(cfg, moe, w13, w2)
    assert pre.kernel == live.kernel
    want = dict(live_layer.named_parameters())
    got = dict(pre_layer.named_parameters())
    assert set(got) == set(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
    assert pre_layer.x86_moe_elements == live_layer.x86_moe_elements == e * 3 * h * i
    assert (pre_layer.x86_w13_group, pre_layer.x86_w2_group) == (
        live_layer.x86_w13_group,
        live_layer.x86_w2_group,
    )
    g = torch.Generator().manual_seed(5)
    x = torch.randn(rows, h, generator=g).to(torch.bfloat16)
    w, ids = torch.softmax(torch.randn(rows, e, generator=g), -1).topk(2, dim=-1)
    ids = ids.to(torch.int32)
    y_live = live.apply(live_layer, x, w, ids, None, None)
    y_pre = pre.apply(pre_layer, x, w, ids, None, None)
    assert torch.equal(y_pre, y_live)
    assert float(y_live.float().abs().max()) > 0


@needs_quant_kernels
def test_packed_loader_refuses_bf16_and_wrong_shapes():
    from vllm_x86.runtime.quant.moe import X86QuantMoEMethod

    h, i = 128, 64
    layer = _layer()
    cfg = _config(8, 128, False, True, "vllm-x86-int8-w8a16-amx-1", ["x"])
    method = X86QuantMoEMethod(cfg, _moe(h, i), prepacked=True)
    method.create_weights(layer, 4, h, i, torch.bfloat16, weight_loader=None)
    p = layer.w13_weight
    assert p.dtype == torch.int8 and tuple(p.shape) == (4, 2 * i // 16, 16 * h)
    with pytest.raises(ValueError, match="dtype torch.bfloat16 where torch.int8.*quantize"):
        p.weight_loader(p, torch.zeros(i, h, dtype=torch.bfloat16), "w", "w1", 0)
    with pytest.raises(ValueError, match=r"shape \(8, 2048\) where \(4, 2048\) belongs"):
        p.weight_loader(p, torch.zeros(8, 16 * h, dtype=torch.int8), "w", "w3", 0)
    with pytest.raises(ValueError, match="tensor parallel size 1"):
        X86QuantMoEMethod(cfg, _moe(h, i, tp_size=2), prepacked=True).create_weights(
            _layer(), 4, h, i, torch.bfloat16, weight_loader=None
        )


@needs_quant_kernels
def test_config_picks_the_method_by_packed_experts(monkeypatch):
    """Listed layers: packed in the checkpoint; unlisted (a version-1 checkpoint, or a
    shape the converter did not pack): quantized while loading, as --quantization."""
    from vllm.model_executor.layers import fused_moe

    from vllm_x86.runtime.quant import format as qformat
    from vllm_x86.runtime.quant.moe import X86QuantMoEMethod

    layout = "vllm-x86-int4-w4a16-amx-1"
    cfg = _config(4, 128, True, True, layout, ["model.layers.0.mlp.experts"])
    layer = SimpleNamespace(moe_config=_moe(128, 64))
    # vLLM names the routed experts module below the checkpoint's experts
    got = cfg._moe_method(layer, "model.layers.0.mlp.experts.routed_experts")
    assert isinstance(got, X86QuantMoEMethod) and got.prepacked and got.kernel == "w4a16"
    other = cfg._moe_method(layer, "model.layers.1.mlp.experts.routed_experts")
    assert isinstance(other, X86QuantMoEMethod) and not other.prepacked
    assert not cfg._moe_method(layer, "model.layers.0.mlp.experts0").prepacked
    # format version 1: no packed_experts
    old = _config(4, 128, True, True, layout)
    assert not old._moe_method(layer, "model.layers.0.mlp.experts.routed_experts").prepacked
    # a listed layer that cannot run the packed experts: an error, not bf16 experts
    ep = SimpleNamespace(moe_config=_moe(128, 64, use_ep=True))
    with pytest.raises(qformat.FormatError, match="packed and they cannot run here.*expert"):
        cfg._moe_method(ep, "model.layers.0.mlp.experts")
    # unlisted and a shape the kernel refuses: vLLM's bf16 experts, as --quantization
    # (vLLM's method, stood in for: building it needs an engine's config)
    monkeypatch.setattr(fused_moe, "UnquantizedFusedMoEMethod", lambda moe: ("bf16", moe))
    narrow = SimpleNamespace(moe_config=_moe(128, 40))
    assert cfg._moe_method(narrow, "model.layers.5.mlp.experts") == ("bf16", narrow.moe_config)


def test_format_versions():
    from vllm_x86.runtime.quant import format as qf

    # 2 is written; 3 only by checkpoints with the LM head's INT4 codes
    assert qf.FORMAT_VERSION == 2 and qf.HEAD_CODES_VERSION == 3 and qf.READS == (1, 2, 3)
    good = {"prepacked": True, "layout": qf.expected_layout("x86_int8")}
    for v in (1, 2, 3):
        qf.check_config({**good, "format_version": v}, "x86_int8")
    with pytest.raises(qf.FormatError, match="version 4; this vllm-x86 reads versions 1, 2, 3"):
        qf.check_config({**good, "format_version": 4}, "x86_int8")


# ------------------------------------------------------------------ converter


def _tiny_moe(path, moe_intermediate):
    """A 1-layer random Qwen3-MoE in bf16 (16 experts; router 16 x 128)."""
    from transformers import Qwen3MoeForCausalLM

    cfg = tiny_qwen3_moe_config(moe_intermediate)
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(cfg).to(torch.bfloat16).save_pretrained(str(path))
    return path


@needs_quant_kernels
@pytest.mark.parametrize("bits", [8, 4])
def test_converter_packs_the_experts(tmp_path, bits):
    from safetensors import safe_open

    from vllm_x86.runtime.quant import format as qf
    from vllm_x86.runtime.quant import methods as m
    from vllm_x86.runtime.quant.moe import pack_experts
    from vllm_x86.tools.quantize.convert import quantize_checkpoint

    src = _tiny_moe(tmp_path / "bf16", 64)
    said: list[str] = []
    out = tmp_path / "q"
    quantize_checkpoint(src, out, bits, method="rtn", progress=said.append)
    msg = next(s for s in said if s.startswith("MoE:"))
    assert f"48 routed-expert weight tensors (1 layers) are packed in INT{bits}" in msg, msg
    assert "1 router weights stay" in msg and "written in" not in msg
    qcfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qcfg["format_version"] == qf.FORMAT_VERSION == 2
    assert qcfg["moe_experts"] == "packed"
    assert qcfg["packed_experts"] == ["model.layers.0.mlp.experts"]
    assert not any("experts" in x or x.endswith(".gate") for x in qcfg["quantized_layers"])
    manifest = json.loads((out / qf.MANIFEST).read_text())
    assert manifest["packed_expert_layers"] == 1 and manifest["kept_expert_layers"] == {}
    want_dtype = torch.int8 if bits == 8 else torch.uint8
    kernel = "w8a16" if bits == 8 else m.int4_layout_kernel(qcfg["layout"])
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        bf = {k: f.get_tensor(k) for k in f.keys() if ".experts.3." in k}
    with safe_open(str(next(out.glob("*.safetensors"))), "pt") as f:
        keys = set(f.keys())
        p = "model.layers.0.mlp.experts.3."
        for proj, (n, k) in (
            ("gate_proj", (64, 128)),
            ("up_proj", (64, 128)),
            ("down_proj", (128, 64)),
        ):
            t = f.get_tensor(p + proj + ".weight")
            # 1 byte (INT8) or half a byte (INT4) per weight
            assert t.dtype == want_dtype and t.numel() == n * k * bits // 8, (proj, t.shape)
            assert p + proj + ".weight_scale" in keys
        assert f.get_tensor("model.layers.0.mlp.gate.weight").dtype == torch.bfloat16
        want = pack_experts(
            bits,
            kernel,
            bf[p + "gate_proj.weight"],
            bf[p + "up_proj.weight"],
            bf[p + "down_proj.weight"],
            qcfg["group_size"] or 128,
            qcfg["zero_point"],
        )
        for shard, proj in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
            for name, t in want[shard].items():
                assert torch.equal(f.get_tensor(f"{p}{proj}.{name}"), t), (proj, name)


@needs_quant_kernels
def test_converter_writes_experts_the_kernel_refuses_as_they_are(tmp_path):
    """moe_intermediate_size 48: the INT8 kernel needs K (of down) a multiple of 64, so
    moe.py keeps such experts in bf16; the converter writes them as they are, lists
    no packed layer, and says why; the loader's rule then keeps them in bf16."""
    from safetensors import safe_open

    from vllm_x86.runtime.quant.moe import expert_kernel, moe_problem
    from vllm_x86.tools.quantize.convert import quantize_checkpoint

    src = _tiny_moe(tmp_path / "bf16", 48)
    said: list[str] = []
    out = tmp_path / "q"
    quantize_checkpoint(src, out, 8, method="rtn", progress=said.append)
    why = next(s for s in said if "model.layers.0.mlp.experts:" in s)
    assert "experts stay as they are" in why and "K of 64" in why, why
    assert "48 are written in bf16" in next(s for s in said if s.startswith("MoE:"))
    qcfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qcfg["packed_experts"] == [] and qcfg["moe_experts"] == "quantized while loading"
    with safe_open(str(next(out.glob("*.safetensors"))), "pt") as f:
        t = f.get_tensor("model.layers.0.mlp.experts.3.down_proj.weight")
        assert t.dtype == torch.bfloat16 and tuple(t.shape) == (128, 48)
    assert moe_problem(_moe(128, 48), 8, 128, expert_kernel(8, 128)) is not None
