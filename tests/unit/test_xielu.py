"""xIELU (Apertus): the op table's XIELU holds its parameters in float32 in a float32
model (vLLM's holds them in bf16 whatever the model dtype) and matches the float64
reference there; bf16 models keep vLLM's bf16 parameters."""

from __future__ import annotations

import pytest
import torch
from vllm.model_executor.layers.activation import XIELU

from vllm_x86.runtime.ops import reference, registry
from vllm_x86.runtime.ops.xielu import X86XIELUMixin


class _X86XIELU(X86XIELUMixin, XIELU):
    """The class the op table's customop row builds (without registering it)."""


def _load(act, values: dict[str, torch.Tensor]):
    """What vLLM's weight loader does: copy the checkpoint's tensors into the module's."""
    with torch.no_grad():
        for name, t in values.items():
            getattr(act, name).copy_(t)
    return act


# the tiny Apertus checkpoint's values (float32, not bf16-representable)
CKPT = {
    "alpha_p": torch.tensor([0.20341234]),
    "alpha_n": torch.tensor([-1.05021234]),
    "beta": torch.tensor(0.5),
    "eps": torch.tensor(-1e-6),
}


@pytest.fixture(autouse=True)
def _vllm_config():
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        yield


def _stock() -> XIELU:
    """vLLM's own class, even where the op table has replaced it (XIELU() would then
    build the plugin's)."""
    act = object.__new__(XIELU)
    XIELU.__init__(act)
    return act


def _built(cls, dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # as vLLM sets it while it builds the model
    try:
        act = _stock() if cls is XIELU else cls()
        assert type(act) is cls
        return _load(act, CKPT)
    finally:
        torch.set_default_dtype(old)


def _x() -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.randn(5, 7, 96) * 3
    x[0, 0, :4] = torch.tensor([0.0, -1e-7, 1e-7, -50.0])  # at and around eps, far left
    return x


def test_float32_model_holds_float32_parameters_and_matches_the_reference():
    act = _built(_X86XIELU, torch.float32)
    for name in ("alpha_p", "alpha_n", "beta", "eps"):
        assert getattr(act, name).dtype == torch.float32
    assert act.alpha_p.item() == CKPT["alpha_p"].item()
    x = _x()
    want = reference.xielu(x.double(), *CKPT.values())
    got = act.forward_native(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=2e-6, atol=1e-6)


def test_stock_vllm_xielu_in_a_float32_model_is_off_by_bf16_rounding():
    """What the row fixes: vLLM's class rounds the coefficients to bf16."""
    stock = _built(XIELU, torch.float32)
    assert stock.alpha_p.dtype == torch.bfloat16
    x = _x()
    want = reference.xielu(x.double(), *CKPT.values())
    err = (stock.forward_native(x).double() - want).abs().max().item()
    assert err > 1e-3


def test_bf16_model_keeps_vllms_bf16_parameters():
    ours, stock = _built(_X86XIELU, torch.bfloat16), _built(XIELU, torch.bfloat16)
    assert ours.alpha_p.dtype == stock.alpha_p.dtype == torch.bfloat16
    x = _x().to(torch.bfloat16)
    assert torch.equal(ours.forward_native(x), stock.forward_native(x))


def test_an_explicit_dtype_is_kept():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        assert _X86XIELU(dtype=torch.bfloat16).alpha_p.dtype == torch.bfloat16
    finally:
        torch.set_default_dtype(old)


def test_the_op_table_row_names_vllms_xielu():
    (row,) = [r for r in registry.OVERRIDES if r.target.endswith(":XIELU")]
    assert row.kind == "customop" and not row.cpp
    assert registry._load(row.target) is XIELU
    assert registry._load(row.impl) is X86XIELUMixin


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_keeps_the_input_dtype(dtype):
    x = _x().to(dtype)
    assert reference.xielu(x, *CKPT.values()).dtype == dtype
