"""Which weights `x86_int8` and `x86_int4` quantize: the one rule.

Two readers use it: the quantization config (config.py ``get_quant_method``), when vLLM
builds a model's layers, and the conformance suite's reference (fake.py), which gives
transformers the same weights quantized and dequantized. Change what is quantized
here, and both follow.

A weight belongs to one kind:

``linear``
    the linear layers of attention and MLP blocks, shared experts included (vLLM's
    ``LinearBase`` layers; transformers' ``nn.Linear`` and ``Conv1D``);
``moe_experts``
    the routed experts of an MoE block (vLLM's fused-MoE layer; transformers' 3-D
    expert tensors, or its ``nn.Linear`` layers inside an ``experts`` list);
``lm_head``
    the output projection;
``embedding``
    the input embedding table.

A weight of a quantized kind still stays in bf16 where the kernel cannot take its
shape (methods.py ``bf16_reason``: output channels not a multiple of 16 or 32, input
channels not a multiple of 64 or 32): the layer then warns once and runs bf16.
"""

from __future__ import annotations

LINEAR = "linear"
MOE_EXPERTS = "moe_experts"
LM_HEAD = "lm_head"
EMBEDDING = "embedding"

# The kinds quantized to the method's bits. The routed experts of MoE blocks are not
# (yet): their bf16 fused-MoE kernel runs them.
QUANTIZED_KINDS: frozenset[str] = frozenset({LINEAR})


def weight_bits(kind: str, bits: int, lm_head: bool) -> int | None:
    """The bits a weight of `kind` is quantized to under a method of `bits` (8 or 4),
    or None for bf16. The LM head is INT8 on request (lm_head.py), whatever `bits`."""
    if kind == LM_HEAD:
        return 8 if lm_head else None
    return bits if kind in QUANTIZED_KINDS else None


def options(
    bits: int,
    group_size: int | None = None,
    zero_point: bool | None = None,
    lm_head: bool | None = None,
) -> tuple[int, bool, bool]:
    """(group_size, zero_point, lm_head) with the unset ones from the environment
    (VLLM_X86_QUANT_GROUP_SIZE, VLLM_X86_QUANT_ZERO_POINT, VLLM_X86_QUANT_LM_HEAD):
    what a model quantized while it loads uses."""
    from vllm_x86 import envs

    if group_size is None:
        group_size = int(envs.get("VLLM_X86_QUANT_GROUP_SIZE"))
    if zero_point is None:
        zero_point = envs.get_bool("VLLM_X86_QUANT_ZERO_POINT")
    if lm_head is None:
        lm_head = envs.get_bool("VLLM_X86_QUANT_LM_HEAD")
    return group_size, bool(zero_point) and bits == 4, bool(lm_head)
