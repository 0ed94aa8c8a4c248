"""Tensor parallel with x86_int8 / x86_int4 on the fly: each rank quantizes its share of
a layer as the whole layer is quantized at tensor parallel size 1, or the start is
refused with a sentence (quant/linear.py). The engine runs: tests/e2e/test_parallel.py."""

from __future__ import annotations

import pytest
import torch


def _config(bits, group=128, prepacked=False, layout=None):
    from vllm_x86.runtime.quant.config import X86Int4Config, X86Int8Config

    cls = X86Int8Config if bits == 8 else X86Int4Config
    return cls(
        group_size=group,
        zero_point=False,
        lm_head=False,
        prepacked=prepacked,
        layout=layout,
        format_version=2 if prepacked else None,
    )


def _method(bits, monkeypatch, tp=2, **kw):
    from vllm.model_executor import parameter

    from vllm_x86.runtime.quant import config, linear

    monkeypatch.setattr(linear, "_tp_size", lambda: tp)
    # vLLM's weight parameters ask for the rank (no process group in a unit test)
    monkeypatch.setattr(parameter, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(parameter, "get_tensor_model_parallel_world_size", lambda: tp)
    cls = config.Int8LinearMethod if bits == 8 else config.Int4LinearMethod
    return cls(_config(bits, **kw))


def _create(method, n, k, n_full, k_full):
    layer = torch.nn.Module()
    method.create_weights(
        layer, k, [n], k_full, n_full, torch.bfloat16, weight_loader=lambda *a, **kw: None
    )
    return layer


def test_int8_share_of_a_row_quantizes_with_the_whole_rows_scale():
    from vllm_x86.runtime.quant.methods import quantize_int8

    g = torch.Generator().manual_seed(0)
    w = torch.randn(32, 256, generator=g).to(torch.bfloat16)
    w[:, :128] *= 4  # the row's largest values on the other rank
    q, scale = quantize_int8(w)
    amax = w.float().abs().amax(dim=1)  # what the all-reduce over the ranks gives
    q2, scale2 = quantize_int8(w[:, 128:], amax=amax)
    assert torch.equal(scale2, scale) and torch.equal(q2, q[:, 128:])
    _, own = quantize_int8(w[:, 128:])  # the share's own maximum: another quantization
    assert not torch.equal(own, scale)


def test_int4_refuses_groups_that_straddle_two_ranks(monkeypatch):
    # the tiny Llama's o_proj: K = 128 (groups of 128), 64 per rank at TP=2
    with pytest.raises(ValueError) as e:
        _create(_method(4, monkeypatch, group=128), 128, 64, 128, 128)
    msg = str(e.value)
    assert "tensor parallel size 2" in msg and "128 input channels split into 64" in msg
    assert "VLLM_X86_QUANT_GROUP_SIZE=64" in msg
    layer = _create(_method(4, monkeypatch, group=64), 128, 64, 128, 128)
    assert layer.x86_quantized and layer.x86_k_split
    assert _create(_method(4, monkeypatch, group=128), 128, 256, 256, 256).x86_quantized


def test_a_share_that_cannot_be_quantized_is_refused(monkeypatch):
    # K = 64 is quantized at TP=1; 16 per rank at TP=4 is not a multiple of 64, which
    # the plugin's INT8 kernel needs: refused, not left in bf16
    from vllm_x86.runtime.quant import linear

    monkeypatch.setattr(linear, "int8_kernel", lambda: "w8a16")
    with pytest.raises(ValueError, match=r"splits into 128x16 per rank, which cannot be"):
        _create(_method(8, monkeypatch, tp=4), 128, 16, 128, 64)


def test_prepacked_rows_split_by_their_input_channels(monkeypatch):
    """A row-parallel rank of a prepacked checkpoint loads a contiguous range of each
    packed row (dimension 1, RowParallelLinear's input_dim), and that range is exactly
    the packing of its share of K; the per-channel INT8 scale stays whole."""
    from vllm_x86.runtime.quant.methods import pack_int4_w4a16, pack_int8_w8a16, quantize_int4

    layer = _create(
        _method(8, monkeypatch, prepacked=True, layout="vllm-x86-int8-w8a16-amx-1"),
        32, 128, 32, 256,
    )  # fmt: skip
    assert layer.weight.input_dim == 1 and not hasattr(layer.weight_scale, "input_dim")
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (32, 256), generator=g, dtype=torch.int8)
    whole, share = pack_int8_w8a16(q), pack_int8_w8a16(q[:, 128:])
    size = layer.weight.shape[1]
    assert torch.equal(whole.narrow(1, 1 * size, size), share)  # rank 1 of 2
    codes, scale, zero = quantize_int4(torch.randn(32, 256, generator=g), 64, True)
    whole = pack_int4_w4a16(codes, scale, zero)
    share = pack_int4_w4a16(codes[:, 128:], scale[2:], zero[2:])
    for a, b in zip(whole, share):
        assert torch.equal(a.narrow(1, b.shape[1], b.shape[1]), b)


def test_prepacked_shares_that_cut_a_block_are_refused(monkeypatch):
    method = _method(8, monkeypatch, prepacked=True, layout="vllm-x86-int8-w8a16-amx-1")
    with pytest.raises(ValueError, match="splits into 128x32 per rank, which cannot be"):
        _create(method, 128, 32, 128, 64)


def _moe(h, i_full, tp):
    from types import SimpleNamespace

    return SimpleNamespace(
        hidden_dim=h,
        intermediate_size=i_full,
        intermediate_size_per_partition=i_full // tp,
        moe_parallel_config=SimpleNamespace(tp_size=tp, use_ep=False),
    )


def test_moe_experts_split_as_at_one_rank_or_refused():
    from vllm_x86.runtime.quant.moe import split_refusal

    # the tiny Qwen3-MoE: intermediate 64, 32 per rank, which the INT8 kernel cannot take
    why = split_refusal(_moe(128, 64, 2), 8, 128, "w8a16")
    assert why.startswith("x86_int8 with tensor parallel size 2: the MoE experts' 64")
    assert "cannot be quantized" in why and "--tensor-parallel-size" in why
    assert split_refusal(_moe(128, 256, 2), 8, 128, "w8a16") is None
    assert split_refusal(_moe(128, 64, 1), 8, 128, "w8a16") is None
    # INT4 in groups of 128: 256 over 2 ranks is 128 each (fits); over 4, 64 each (straddles)
    assert split_refusal(_moe(128, 256, 2), 4, 128, "w4a16") is None
    why = split_refusal(_moe(256, 256, 4), 4, 128, "w4a16")
    assert "groups of 128 do not divide" in why and "VLLM_X86_QUANT_GROUP_SIZE=64" in why
