"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest
import torch

AMX = bool(torch.cpu._is_amx_tile_supported())
# vLLM CPU's own INT8/INT4 kernels (VLLM_X86_QUANT_KERNEL=vllm, INT4 groups of 32)
needs_amx = pytest.mark.skipif(not AMX, reason="the CPU has no AMX (vLLM CPU's INT8/INT4 kernels)")


def _quant_isa() -> str | None:
    from vllm_x86.runtime.quant.methods import quant_isa

    return quant_isa()


QUANT_ISA = _quant_isa()
# the plugin's INT8/INT4 kernels: AMX, else AVX-512 VNNI
needs_quant_kernels = pytest.mark.skipif(
    QUANT_ISA is None,
    reason="the CPU has neither AMX nor AVX-512 VNNI (the plugin's INT8/INT4 kernels)",
)


def _kernel_isas() -> list[str]:
    from vllm_x86.runtime.ops import kernels

    return kernels.available_isas() if kernels.available() else []


# the elementwise kernels' ISAs this CPU can run, lowest first (hardware.KERNEL_ISAS)
KERNEL_ISAS = _kernel_isas()


def last_slots(table: torch.Tensor, lens, bs: int) -> torch.Tensor:
    """The paged KV cache slot (int64) of the last token of each row: row r has lens[r]
    tokens in the blocks of table[r], bs tokens a block."""
    return torch.tensor(
        [int(table[r, (n - 1) // bs]) * bs + (n - 1) % bs for r, n in enumerate(lens)],
        dtype=torch.int64,
    )


@pytest.fixture(params=KERNEL_ISAS)
def isa(request):
    """Each kernel ISA this CPU can run in turn (a lower one than the best is how each
    path is tested here), back to the best afterwards."""
    from vllm_x86.runtime.ops import kernels

    kernels.set_isa(request.param)
    yield request.param
    kernels.set_isa("auto")


@pytest.fixture(scope="session")
def tiny_bf16(tmp_path_factory):
    """A 2-layer random Llama in bf16 whose shapes the kernels take."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=512,
        tie_word_embeddings=True,
    )
    cfg.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    out = tmp_path_factory.mktemp("tiny") / "bf16"
    model.save_pretrained(str(out))
    (out / "tokenizer_config.json").write_text("{}\n")
    return out


def tiny_qwen3_moe_config(moe_intermediate: int = 64):
    """A 1-layer Qwen3-MoE config: 16 experts, top-2, hidden 128, untied embeddings."""
    from transformers import Qwen3MoeConfig

    cfg = Qwen3MoeConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=moe_intermediate,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=16,
        num_experts_per_tok=2,
        tie_word_embeddings=False,
    )
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    return cfg
