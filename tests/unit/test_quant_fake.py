"""The conformance suite's INT8/INT4 reference: fake quantization of a transformers model
(vllm_x86/runtime/quant/fake.py) following the one rule of which weights are quantized
(vllm_x86/runtime/quant/scope.py)."""

from __future__ import annotations

import pytest
import torch

from vllm_x86.runtime.quant import linear as lin
from vllm_x86.runtime.quant import methods as m
from vllm_x86.runtime.quant import scope
from vllm_x86.tools.conformance import fake_quant as fake


def _llama(**kw):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=512,
        tie_word_embeddings=False,
    )
    cfg.update(kw)
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**cfg)).eval()


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _expected(w: torch.Tensor, bits: int, group: int, zero_point: bool) -> torch.Tensor:
    """dequantize(quantize(w)) of the bf16-rounded [N, K] weight, as the test writes it."""
    wb = w.to(torch.bfloat16)
    if bits == 8:
        q, s = m.quantize_int8(wb)
        return m.dequantize_int8(q, s)
    g = m.effective_group_size(wb.shape[1], group)
    q, s, z = m.quantize_int4(wb, g, zero_point)
    return m.dequantize_int4(q, s, z, g)


LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.mark.parametrize(
    "method,bits,zero_point",
    [("x86_int8", 8, False), ("x86_int4", 4, True), ("x86_int4", 4, False)],
)
def test_changes_exactly_the_linear_layers_to_their_dequantized_values(method, bits, zero_point):
    model = _llama()
    before = _state(model)
    report = fake.fake_quantize(model, method, group_size=128, zero_point=zero_point, lm_head=False)
    after = dict(model.named_parameters())
    selected = {n for n in before if n.endswith("weight") and n.split(".")[-2] in LINEARS}
    assert len(selected) == 2 * len(LINEARS)
    for name, w0 in before.items():
        w1 = after[name].detach()
        if name in selected:
            assert report[name].startswith("int8" if bits == 8 else "int4"), report[name]
            exp = _expected(w0, bits, 128, zero_point)
            assert torch.equal(w1, exp), name  # float32 model: the values exactly
            assert not torch.equal(w1, w0), name  # and they did change
        else:
            assert torch.equal(w1, w0), name  # embeddings, norms, LM head untouched
    assert report["lm_head.weight"].startswith("bf16")
    # the int4 groups follow K: 128 for K = 128 and 256
    if bits == 4:
        assert report["model.layers.0.mlp.down_proj.weight"].startswith("int4 g128")


def test_bf16_model_gets_the_values_rounded_to_bf16():
    model = _llama().to(torch.bfloat16)
    w0 = model.model.layers[1].mlp.up_proj.weight.detach().clone()
    fake.fake_quantize(model, "x86_int8", lm_head=False)
    w1 = model.model.layers[1].mlp.up_proj.weight.detach()
    assert w1.dtype == torch.bfloat16
    assert torch.equal(w1, _expected(w0, 8, 128, False).to(torch.bfloat16))


def test_lm_head_in_int8_on_request_and_refused_when_tied():
    model = _llama()
    w0 = model.lm_head.weight.detach().clone()
    e0 = model.model.embed_tokens.weight.detach().clone()
    report = fake.fake_quantize(model, "x86_int4", lm_head=True)
    assert report["lm_head.weight"] == "int8"  # INT8 whatever the layers' bits
    assert torch.equal(model.lm_head.weight.detach(), _expected(w0, 8, 0, False))
    assert torch.equal(model.model.embed_tokens.weight.detach(), e0)
    tied = _llama(tie_word_embeddings=True)
    with pytest.raises(NotImplementedError, match="tied"):
        fake.fake_quantize(tied, "x86_int8", lm_head=True)


def test_shapes_the_kernel_cannot_take_stay_as_they_are():
    # intermediate 200: gate/up have N = 200 (not a multiple of 16), down K = 200
    model = _llama(intermediate_size=200)
    before = _state(model)
    report = fake.fake_quantize(model, "x86_int8", lm_head=False)
    for part in ("gate_proj", "up_proj", "down_proj"):
        name = f"model.layers.0.mlp.{part}.weight"
        n, k = before[name].shape
        assert report[name] == "bf16: " + m.bf16_reason(8, n, k, 0, m.weight_kernel(8, 0))
        assert torch.equal(dict(model.named_parameters())[name].detach(), before[name])
    assert report["model.layers.0.self_attn.q_proj.weight"] == "int8"


def _qwen3_moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=512,
    )
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(cfg).eval()


def test_moe_experts_follow_the_rule():
    model = _qwen3_moe()
    kinds = {w.name: w.kind for w in fake.weights(model)}
    experts = [n for n, k in kinds.items() if k == scope.MOE_EXPERTS]
    assert sorted(experts) == [
        "model.layers.0.mlp.experts.down_proj",
        "model.layers.0.mlp.experts.gate_up_proj",
    ]
    assert scope.MOE_EXPERTS in scope.QUANTIZED_KINDS  # experts are quantized (moe.py)
    before = _state(model)
    report = fake.fake_quantize(model, "x86_int4", group_size=128, zero_point=True, lm_head=False)
    after = dict(model.named_parameters())
    assert report["model.layers.0.self_attn.o_proj.weight"] == "int4 g128 zp"
    # the router is not an nn.Linear in transformers 5 and has 8 outputs: untouched
    gate = "model.layers.0.mlp.gate.weight"
    assert torch.equal(after[gate].detach(), before[gate])
    # each expert's [N, K] matrix is quantized on its own
    w0 = before["model.layers.0.mlp.experts.down_proj"]  # [E, hidden, moe_intermediate]
    assert report["model.layers.0.mlp.experts.down_proj"] == "int4 g64 zp"  # K = 64
    for e in range(w0.shape[0]):
        exp = _expected(w0[e], 4, 128, True)
        assert torch.equal(after["model.layers.0.mlp.experts.down_proj"][e].detach(), exp)


def test_conv1d_weights_are_quantized_along_their_input_channels():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_embd=128, n_layer=1, n_head=4, vocab_size=512, n_positions=64)
    ).eval()
    w0 = model.transformer.h[0].mlp.c_fc.weight.detach().clone()  # Conv1D: [K, N]
    report = fake.fake_quantize(model, "x86_int8", lm_head=False)
    assert report["transformer.h.0.mlp.c_fc.weight"] == "int8"
    exp = _expected(w0.t(), 8, 0, False).t()  # per output channel = per column here
    assert torch.equal(model.transformer.h[0].mlp.c_fc.weight.detach(), exp)


def test_the_rule():
    assert scope.weight_bits(scope.LINEAR, 4, lm_head=False) == 4
    assert scope.weight_bits(scope.LM_HEAD, 4, lm_head=True) == 8
    assert scope.weight_bits(scope.LM_HEAD, 8, lm_head=False) is None
    assert scope.weight_bits(scope.EMBEDDING, 8, lm_head=True) is None
    assert scope.weight_bits(scope.MOE_EXPERTS, 8, lm_head=False) == 8
    assert scope.weight_bits("router", 8, lm_head=False) is None
    with pytest.raises(ValueError, match="unknown method"):
        fake.fake_quantize(_llama(), "int8")


def test_the_config_asks_the_same_rule(monkeypatch):
    """x86_int8's config gives a linear layer a method exactly when scope.py says so."""
    from vllm.model_executor.layers.linear import LinearBase

    from vllm_x86.runtime.quant import config

    layer = LinearBase.__new__(LinearBase)
    torch.nn.Module.__init__(layer)
    cfg = config.X86Int8Config(lm_head=False)
    assert config.layer_kind(layer) == scope.LINEAR
    assert isinstance(
        cfg.get_quant_method(layer, "model.layers.0.mlp.down_proj"), lin.X86Int8Linear
    )
    monkeypatch.setattr(scope, "QUANTIZED_KINDS", frozenset())
    assert cfg.get_quant_method(layer, "model.layers.0.mlp.down_proj") is None


def _mamba1(arch: str):
    """A tiny random Mamba or Jamba (Mamba-1 mixers; Jamba also attention and MoE)."""
    from transformers import JambaConfig, JambaForCausalLM, MambaConfig, MambaForCausalLM

    torch.manual_seed(0)
    if arch == "mamba":
        return MambaForCausalLM(
            MambaConfig(hidden_size=128, num_hidden_layers=2, vocab_size=512, state_size=16)
        ).eval()
    return JambaForCausalLM(
        JambaConfig(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=512,
            num_experts=4,
            num_experts_per_tok=2,
            expert_layer_period=2,
            expert_layer_offset=1,
            attn_layer_period=2,
            attn_layer_offset=1,
            mamba_d_state=16,
            use_mamba_kernels=False,
        )
    ).eval()


def test_mamba1_mixers_stay_bf16_as_vllm_builds_them():
    """vLLM builds a Mamba-1 mixer (MambaMixer) without the quantization config, so the
    reference leaves its Linear layers in bf16; Mamba-2's mixer takes the config."""
    import inspect

    from vllm.model_executor.layers.mamba.mamba_mixer import MambaMixer
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

    assert "quant_config" not in inspect.signature(MambaMixer.__init__).parameters
    assert "quant_config" in inspect.signature(MambaMixer2.__init__).parameters

    mamba = _mamba1("mamba")
    before = _state(mamba)
    report = fake.fake_quantize(mamba, "x86_int8", lm_head=False)
    mixer = {n for n in report if ".mixer." in n}
    assert {n.split(".")[-2] for n in mixer} == {"in_proj", "x_proj", "dt_proj", "out_proj"}
    assert all(report[n] == "bf16: scope.py does not quantize mamba1_mixer weights" for n in mixer)
    after = dict(mamba.named_parameters())
    assert all(torch.equal(after[n].detach(), before[n]) for n in before)

    jamba = _mamba1("jamba")
    kinds = {w.name: w.kind for w in fake.weights(jamba)}
    assert {n.split(".")[-2] for n, k in kinds.items() if k == scope.MAMBA1_MIXER} == {
        "in_proj",
        "x_proj",
        "dt_proj",
        "out_proj",
    }
    report = fake.fake_quantize(jamba, "x86_int8", lm_head=False)
    # the attention layer, the dense MLP of the Mamba layer and the experts: quantized
    assert report["model.layers.1.self_attn.o_proj.weight"] == "int8"
    assert report["model.layers.0.feed_forward.down_proj.weight"] == "int8"
    assert any(k == scope.MOE_EXPERTS and report[n] == "int8" for n, k in kinds.items())
    assert report["model.layers.0.mamba.in_proj.weight"].startswith("bf16: ")


def test_llama4_experts_are_quantized_expert_by_expert_in_their_layout():
    """Llama 4's fused experts are stored [experts, in, out] without saying so
    (``is_transposed``); each expert's [out, in] matrix is quantized on its own."""
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    torch.manual_seed(0)
    model = Llama4ForCausalLM(
        Llama4TextConfig(
            hidden_size=128,
            intermediate_size=128,
            intermediate_size_mlp=256,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            vocab_size=512,
            num_local_experts=4,
            num_experts_per_tok=1,
        )
    ).eval()
    before = _state(model)
    report = fake.fake_quantize(model, "x86_int8", lm_head=False)
    after = dict(model.named_parameters())
    for part in ("gate_up_proj", "down_proj"):
        name = f"model.layers.0.feed_forward.experts.{part}"
        assert report[name] == "int8"
        for e in range(4):
            exp = _expected(before[name][e].t(), 8, 0, False).t()
            assert torch.equal(after[name][e].detach(), exp), (name, e)
    assert report["model.layers.0.feed_forward.shared_expert.down_proj.weight"] == "int8"


def test_a_fused_experts_module_of_unknown_layout_is_an_error():
    class Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_up_proj = torch.nn.Parameter(torch.zeros(4, 128, 256))

    model = _llama()
    model.model.layers[0].mlp.experts = Experts()
    with pytest.raises(NotImplementedError, match="EXPERTS_TRANSPOSED"):
        fake.weights(model)


@pytest.mark.parametrize("arch", ["mamba", "jamba"])
def test_converter_keeps_the_mamba1_mixers_the_reference_keeps(tmp_path, arch):
    """`vllm-x86 quantize` leaves exactly the Linear weights in bf16 that vLLM builds
    unquantized (Mamba-1 mixers), told apart in the checkpoint by its model type."""
    from safetensors import safe_open

    from vllm_x86.tools.quantize.convert import quantize_checkpoint

    model = _mamba1(arch).to(torch.bfloat16)
    src = tmp_path / "bf16"
    model.save_pretrained(str(src))
    mixer = {
        w.name for w in fake.weights(model) if w.kind == scope.MAMBA1_MIXER
    }  # the reference's rule, from the modules
    assert mixer
    if arch == "mamba":  # nothing but Mamba-1 mixers in its blocks: nothing to quantize
        from vllm_x86.tools.quantize.convert import ConvertError

        with pytest.raises(ConvertError, match="nothing to quantize"):
            quantize_checkpoint(src, tmp_path / "q", 8, progress=None)
        return
    quantize_checkpoint(src, tmp_path / "q", 8, progress=None)
    with safe_open(str(next((tmp_path / "q").glob("*.safetensors"))), "pt") as f:
        dtypes = {k: f.get_tensor(k).dtype for k in f.keys()}
    for name in mixer:
        assert dtypes[name] == torch.bfloat16, name
        assert name.removesuffix(".weight") + ".weight_scale" not in dtypes
    packed = {k for k, d in dtypes.items() if d == torch.int8}
    assert "model.layers.1.self_attn.o_proj.weight" in packed
    assert "model.layers.0.feed_forward.down_proj.weight" in packed
