"""MoE experts of x86_int8 / x86_int4 (quant/moe.py) against a float32
dequantize-then-MoE reference (ops/reference.moe_experts), and the rule of which
weights the methods quantize (quant/scope.py).

Tolerances (relative Frobenius error of the layer output, as in test_quant.py): the
plugin's kernels (INT8; INT4 groups of 32/64/128) 5e-3 (measured 2.5-3.2e-3); PyTorch's
weight-only kernels 1e-2. The reference rounds
the gate_up output and the activation to bf16 where the bf16 experts do. A wrong
expert, routing weight, packing or scale gives errors near 1.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.unit.conftest import needs_quant_kernels, tiny_qwen3_moe_config
from vllm_x86.runtime.ops import reference as ref
from vllm_x86.runtime.quant import scope


def _rel(y, want) -> float:
    return float((y.float() - want.float()).norm() / want.float().norm())


def _config(bits, group=128, zero_point=True):
    from vllm_x86.runtime.quant.config import X86Int4Config, X86Int8Config

    if bits == 8:
        return X86Int8Config(group_size=128, zero_point=False, lm_head=False)
    return X86Int4Config(group_size=group, zero_point=zero_point, lm_head=False)


def _experts(e, h, i, bias=False, seed=0):
    """A RoutedExperts stand-in: what the method reads of the layer."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    g = torch.Generator().manual_seed(seed)
    layer = torch.nn.Module()
    w13 = (torch.randn(e, 2 * i, h, generator=g) / h**0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, h, i, generator=g) / i**0.5).to(torch.bfloat16)
    layer.w13_weight = torch.nn.Parameter(w13, requires_grad=False)
    layer.w2_weight = torch.nn.Parameter(w2, requires_grad=False)
    if bias:
        layer.w13_bias = torch.nn.Parameter(
            (0.1 * torch.randn(e, 2 * i, generator=g)).to(torch.bfloat16), requires_grad=False
        )
        layer.w2_bias = torch.nn.Parameter(
            (0.1 * torch.randn(e, h, generator=g)).to(torch.bfloat16), requires_grad=False
        )
    layer.activation = MoEActivation.SILU
    layer.apply_router_weight_on_input = False
    layer.expert_map = None
    moe = SimpleNamespace(hidden_dim=h, intermediate_size_per_partition=i)
    return layer, moe, w13.clone(), w2.clone()


def _method(cfg, moe, layer):
    from vllm_x86.runtime.quant.moe import X86QuantMoEMethod

    method = X86QuantMoEMethod(cfg, moe)
    layer.quant_method = method  # as RoutedExperts holds it
    method.process_weights_after_loading(layer)
    return method


def _route(m_tokens, e, top_k, seed=1, sigmoid=False):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(m_tokens, e, generator=g)
    if sigmoid:  # weights that do not sum to 1 (the plugin's sigmoid router)
        from vllm_x86.runtime.ops.moe_routing import sigmoid_topk

        return sigmoid_topk(logits, top_k, False, None, 2.5)
    w, ids = torch.softmax(logits, dim=-1).topk(top_k, dim=-1)
    return (w / w.sum(-1, keepdim=True)).contiguous(), ids.to(torch.int32).contiguous()


def _deq(w, cfg):
    n, k = w.shape[1:]
    p = scope.plan("experts", n, k, cfg.BITS, cfg.group_size)
    assert p.quantized, p.reason
    return torch.stack([scope.fake_quantize(w[j], p, cfg.zero_point) for j in range(w.shape[0])])


def _a8(method) -> int:
    """From how many tokens an expert's GEMMs take 8-bit activations with `method`'s
    kernels (the plugin's, on AVX-512 VNNI), for the reference; 0: never."""
    return ref.a8_rows() if method.kernel in ("w8a16", "w4a16") else 0


def _apply(method, layer, x, tw, ti):
    return method.apply(layer, x, tw, ti, None, None)


@needs_quant_kernels
@pytest.mark.parametrize("rows", [1, 5, 33])
@pytest.mark.parametrize(
    "bits,group,zero_point,tol",
    [
        (8, None, False, 5e-3),
        (4, 128, True, 5e-3),
        (4, 128, False, 5e-3),
        (4, 64, True, 5e-3),
        (4, 64, False, 5e-3),
        (4, 32, True, 5e-3),  # zero points in eighths
        (4, 32, False, 5e-3),
    ],
)
def test_quantized_experts_match_dequantized_reference(rows, bits, group, zero_point, tol):
    e, h, i = 8, 256, 128
    cfg = _config(bits, group or 128, zero_point)
    layer, moe, w13, w2 = _experts(e, h, i)
    method = _method(cfg, moe, layer)
    # the experts really are stored quantized
    want_dtype = torch.int8 if bits == 8 else torch.uint8
    assert layer.w13_weight.dtype == want_dtype and layer.w2_weight.dtype == want_dtype
    assert layer.w13_weight.shape[0] == e
    bf16_bytes = (w13.numel() + w2.numel()) * 2
    q_bytes = layer.w13_weight.nbytes + layer.w2_weight.nbytes
    assert q_bytes <= bf16_bytes * (bits + 1) / 16  # 1 or 1/2 byte per weight, + sums
    x = torch.randn(rows, h, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    tw, ti = _route(rows, e, 2)
    got = _apply(method, layer, x, tw, ti)
    want = ref.moe_experts(x, _deq(w13, cfg), _deq(w2, cfg), tw, ti, a8_rows=_a8(method))
    assert got.dtype == torch.bfloat16 and got.shape == (rows, h)
    assert _rel(got, want) < tol
    # and the quantization is visible: the bf16 experts' output is further away
    bf16 = ref.moe_experts(x, w13.float(), w2.float(), tw, ti)
    assert _rel(got, bf16) > _rel(got, want)


@needs_quant_kernels
@pytest.mark.parametrize("bits", [8, 4])
def test_experts_with_bias_sigmoid_weights_and_narrow_intermediate(bits):
    """Biases, routing weights that do not sum to 1, intermediate 64 (down's K = 64:
    INT4 groups of 64 for a group-128 config), many experts with few tokens each."""
    e, h, i, rows = 16, 128, 64, 9
    cfg = _config(bits, 128, True)
    layer, moe, w13, w2 = _experts(e, h, i, bias=True)
    method = _method(cfg, moe, layer)
    if bits == 4:
        assert (layer.x86_w13_group, layer.x86_w2_group) == (128, 64)
    x = torch.randn(rows, h, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    tw, ti = _route(rows, e, 2, sigmoid=True)
    assert not torch.allclose(tw.sum(-1), torch.ones(rows))
    got = _apply(method, layer, x, tw, ti)
    want = ref.moe_experts(
        x,
        _deq(w13, cfg),
        _deq(w2, cfg),
        tw,
        ti,
        "silu",
        layer.w13_bias,
        layer.w2_bias,
        a8_rows=_a8(method),
    )
    assert _rel(got, want) < 5e-3


@needs_quant_kernels
def test_router_weight_on_input_top1_and_gelu():
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    e, h, i, rows = 4, 128, 128, 6
    cfg = _config(8)
    layer, moe, w13, w2 = _experts(e, h, i)
    layer.activation = MoEActivation.GELU
    layer.apply_router_weight_on_input = True
    method = _method(cfg, moe, layer)
    x = torch.randn(rows, h, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    tw, ti = _route(rows, e, 1, sigmoid=True)
    got = _apply(method, layer, x, tw, ti)
    want = ref.moe_experts(
        x, _deq(w13, cfg), _deq(w2, cfg), tw, ti, "gelu", weight_on_input=True, a8_rows=_a8(method)
    )
    assert _rel(got, want) < 5e-3


@pytest.mark.parametrize("bits", [8, 4])
def test_torch_weight_only_kernels_for_experts(bits, monkeypatch):
    """Without AMX (or VLLM_X86_QUANT_KERNEL=torch) the experts run PyTorch's kernels."""
    monkeypatch.setenv("VLLM_X86_QUANT_KERNEL", "torch")
    e, h, i, rows = 4, 128, 128, 7
    cfg = _config(bits, 64, True)
    layer, moe, w13, w2 = _experts(e, h, i)
    method = _method(cfg, moe, layer)
    assert method.kernel == "torch"
    x = torch.randn(rows, h, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    tw, ti = _route(rows, e, 2)
    got = _apply(method, layer, x, tw, ti)
    want = ref.moe_experts(x, _deq(w13, cfg), _deq(w2, cfg), tw, ti)
    assert _rel(got, want) < 1e-2


def test_reference_matches_transformers_experts():
    """ops/reference.moe_experts computes what transformers' Qwen3-MoE experts do."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cfg = Qwen3MoeConfig(hidden_size=64, moe_intermediate_size=32, num_experts=4)
    experts = Qwen3MoeExperts(cfg)
    torch.nn.init.normal_(experts.gate_up_proj, std=0.2)
    torch.nn.init.normal_(experts.down_proj, std=0.2)
    x = torch.randn(5, 64)
    tw, ti = _route(5, 4, 2)
    with torch.no_grad():
        want = experts(x, ti.long(), tw)
    got = ref.moe_experts(x, experts.gate_up_proj.data, experts.down_proj.data, tw, ti)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _moe_cfg(h, i, activation="silu", ep=False, swiglu_limit=None):
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    return SimpleNamespace(
        hidden_dim=h,
        intermediate_size_per_partition=i,
        activation=MoEActivation(activation),
        is_act_and_mul=True,
        swiglu_limit=swiglu_limit,
        moe_parallel_config=SimpleNamespace(use_ep=ep),
    )


def test_layers_the_experts_cannot_take_say_why():
    from vllm_x86.runtime.quant.moe import moe_problem

    assert moe_problem(_moe_cfg(256, 128), 8, 128, "w8a16") is None
    assert moe_problem(_moe_cfg(256, 128), 4, 32, "vllm") is None
    p = moe_problem(_moe_cfg(256, 40), 8, 128, "w8a16")  # down's K = 40
    assert "expert down weight 256x40" in p and "K of 64" in p
    p = moe_problem(_moe_cfg(256, 40), 4, 128, "w4a16")
    assert "not a multiple of 32" in p
    assert "expert parallelism" in moe_problem(_moe_cfg(256, 128, ep=True), 8, 128, "w8a16")
    assert "swigluoai" in moe_problem(_moe_cfg(256, 128, "swigluoai"), 8, 128, "w8a16")
    assert "swiglu_limit" in moe_problem(_moe_cfg(256, 128, swiglu_limit=7.0), 8, 128, "w8a16")


@pytest.mark.parametrize(
    "name,kind",
    [
        ("model.layers.0.self_attn.q_proj.weight", "linear"),
        ("model.layers.0.self_attn.qkv_proj", "linear"),
        ("model.layers.0.mlp.down_proj.weight", "linear"),
        ("model.layers.1.mlp.shared_expert.gate_proj.weight", "linear"),  # Qwen2-MoE
        ("model.layers.1.mlp.shared_experts.down_proj.weight", "linear"),  # DeepSeek
        ("model.layers.1.mlp.experts.gate_up_proj", "experts"),  # transformers 5
        ("model.layers.1.mlp.experts.3.w1.weight", "experts"),  # Mixtral on the Hub
        ("model.layers.1.mlp.experts.3.down_proj.weight", "experts"),  # Qwen3-MoE, OLMoE
        ("model.layers.1.block_sparse_moe.experts.0.w2.weight", "experts"),
        ("model.layers.1.mlp.experts", "experts"),  # vLLM's RoutedExperts
        ("model.layers.1.mlp.gate.weight", "router"),
        ("model.layers.1.block_sparse_moe.gate.weight", "router"),
        ("model.layers.1.mlp.gate_proj.weight", "linear"),
        ("model.embed_tokens.weight", "embedding"),
        ("lm_head.weight", "lm_head"),
        ("model.norm.weight", "other"),
    ],
)
def test_kind_of_names(name, kind):
    assert scope.kind_of(name) == kind


def test_plan_is_the_rule():
    assert scope.plan("linear", 256, 576, 8) == scope.Plan(8)
    assert scope.plan("experts", 128, 64, 4, 128) == scope.Plan(4, 64)
    assert not scope.plan("router", 128, 256, 8).quantized
    assert not scope.plan("embedding", 512, 128, 8).quantized
    assert not scope.plan("lm_head", 512, 128, 4).quantized
    assert scope.plan("lm_head", 512, 128, 4, lm_head=True) == scope.Plan(8)  # INT8 head
    assert "K of 64" in scope.plan("linear", 256, 40, 8).reason


def test_fake_quantize_follows_the_rule():
    """The reference side of the rule (quant/fake.py): a transformers MoE model's experts
    and Linear weights are replaced by their dequantized codes, router, norms and
    embeddings not."""
    from transformers import Qwen3MoeForCausalLM

    from vllm_x86.tools.conformance import fake_quant as fake

    cfg = tiny_qwen3_moe_config()
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg).float()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = fake.fake_quantize(model, "x86_int4", group_size=128, zero_point=True, lm_head=False)
    after = model.state_dict()
    experts = "model.layers.0.mlp.experts.gate_up_proj"
    assert report[experts] == "int4 g128 zp"
    assert report["model.layers.0.mlp.experts.down_proj"] == "int4 g64 zp"
    # each expert alone, from its bf16-rounded weight (what vLLM loads and quantizes)
    want = scope.fake_quantize(before[experts][3].to(torch.bfloat16), scope.Plan(4, 128), True)
    assert torch.equal(after[experts][3], want)
    assert not torch.equal(after[experts], before[experts])
    assert not torch.equal(
        after["model.layers.0.self_attn.o_proj.weight"],
        before["model.layers.0.self_attn.o_proj.weight"],
    )
    for same in ("model.layers.0.mlp.gate.weight", "model.embed_tokens.weight", "lm_head.weight"):
        assert torch.equal(after[same], before[same]), same


@pytest.fixture(scope="module")
def tiny_moe_bf16(tmp_path_factory):
    """A 1-layer random Qwen3-MoE in bf16 (8 experts, router 8 x 128: too narrow for
    the kernels; shared by the converter tests)."""
    from transformers import Qwen3MoeForCausalLM

    cfg = tiny_qwen3_moe_config()
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg).to(torch.bfloat16)
    out = tmp_path_factory.mktemp("tiny-moe") / "bf16"
    model.save_pretrained(str(out))
    return out


@needs_quant_kernels
@pytest.mark.parametrize("bits", [8, 4])
def test_converter_packs_experts_keeps_router_and_says_so(tiny_moe_bf16, tmp_path, bits):
    import json

    from safetensors import safe_open

    from vllm_x86.tools.quantize.convert import quantize_checkpoint

    said: list[str] = []
    out = tmp_path / "q"
    quantize_checkpoint(tiny_moe_bf16, out, bits, method="rtn", progress=said.append)
    msg = next(s for s in said if s.startswith("MoE:"))
    # Hub names: 16 experts x (gate, up, down); one router
    assert f"48 routed-expert weight tensors (1 layers) are packed in INT{bits}" in msg, msg
    assert "1 router weights stay" in msg
    qcfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qcfg["moe_experts"] == "packed"
    assert "model.layers.0.self_attn.o_proj" in qcfg["quantized_layers"]
    assert not any(x.endswith(".gate") for x in qcfg["quantized_layers"])
    want = torch.int8 if bits == 8 else torch.uint8
    with safe_open(str(next(out.glob("*.safetensors"))), "pt") as f:
        keys = set(f.keys())
        assert f.get_tensor("model.layers.0.mlp.experts.3.down_proj.weight").dtype == want
        assert f.get_tensor("model.layers.0.mlp.gate.weight").dtype == torch.bfloat16
        assert f.get_tensor("model.layers.0.self_attn.o_proj.weight").dtype == want
    assert "model.layers.0.mlp.experts.3.down_proj.weight_scale" in keys
    assert "model.layers.0.mlp.gate.weight_scale" not in keys


def test_prepacked_checkpoint_with_a_packed_router_is_refused():
    from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    from vllm_x86.runtime.quant import format as qformat
    from vllm_x86.runtime.quant.config import X86Int8Config

    gate = GateLinear.__new__(GateLinear)  # only its type is read
    cfg = X86Int8Config(lm_head=False)
    assert isinstance(
        cfg.get_quant_method(gate, "model.layers.0.mlp.gate"), UnquantizedLinearMethod
    )
    old = X86Int8Config(
        prepacked=True, layout="x", format_version=1, quantized_layers=["model.layers.0.mlp.gate"]
    )
    with pytest.raises(qformat.FormatError, match="quantize the bf16 model again"):
        old.get_quant_method(gate, "model.layers.0.mlp.gate")


@needs_quant_kernels
def test_experts_are_one_op_for_dynamo():
    """vLLM compiles the CPU MoE forward: the data-dependent grouping by expert must
    not be traced (fullgraph fails on a graph break)."""
    e, h, i, rows = 8, 128, 64, 5
    cfg = _config(4, 128, True)
    layer, moe, w13, w2 = _experts(e, h, i)
    method = _method(cfg, moe, layer)
    x = torch.randn(rows, h, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    tw, ti = _route(rows, e, 2)
    compiled = torch.compile(lambda a, b, c: _apply(method, layer, a, b, c), fullgraph=True)
    torch.testing.assert_close(
        compiled(x, tw, ti), _apply(method, layer, x, tw, ti), rtol=0, atol=0
    )
