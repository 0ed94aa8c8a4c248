"""THE table of everything the plugin changes in vLLM's compute.

Each row names a vLLM op (a ``CustomOp`` class), the plugin class that replaces it,
and why. ``register_all()`` installs every row with ``CustomOp.register_oot`` (the
out-of-tree mechanism vLLM provides for hardware plugins); nothing else in the code
base registers ops. Reading this file tells you all the plugin does to vLLM's math.

Each replacement keeps vLLM's op name, so vLLM's ``--compilation-config
'{"custom_ops": ["-rotary_embedding"]}'`` switches the plugin's version off exactly as
it would switch off the stock one.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from vllm_x86.log import get_logger

logger = get_logger("ops")


@dataclass(frozen=True)
class Override:
    vllm_class: str  # "module:Class" of the in-tree CustomOp
    mixin: str  # "module:Class" providing the plugin's forward_cpu
    why: str


_ROPE_WHY = (
    "bit-identical to vLLM's reference (forward_native) in bf16/fp16; stock "
    "_C.rotary_embedding rounds differently and flips SmolLM2's eager bf16 answer"
)
_ROPE_MIXIN = "vllm_x86.ops.rotary_embedding:X86RotaryMixin"
_ROPE = "vllm.model_executor.layers.rotary_embedding"

OVERRIDES: tuple[Override, ...] = (
    Override(f"{_ROPE}.base:RotaryEmbedding", _ROPE_MIXIN, _ROPE_WHY),
    # Subclasses that only change the cos/sin cache and inherit forward_cpu.
    Override(f"{_ROPE}.llama3_rope:Llama3RotaryEmbedding", _ROPE_MIXIN, _ROPE_WHY),
    Override(f"{_ROPE}.linear_scaling_rope:LinearScalingRotaryEmbedding", _ROPE_MIXIN, _ROPE_WHY),
    Override(f"{_ROPE}.ntk_scaling_rope:NTKScalingRotaryEmbedding", _ROPE_MIXIN, _ROPE_WHY),
    Override(
        f"{_ROPE}.dynamic_ntk_scaling_rope:DynamicNTKScalingRotaryEmbedding", _ROPE_MIXIN, _ROPE_WHY
    ),
    Override(
        f"{_ROPE}.dynamic_ntk_alpha_rope:DynamicNTKAlphaRotaryEmbedding", _ROPE_MIXIN, _ROPE_WHY
    ),
    Override(f"{_ROPE}.yarn_scaling_rope:YaRNScalingRotaryEmbedding", _ROPE_MIXIN, _ROPE_WHY),
    Override(f"{_ROPE}.gemma4_rope:Gemma4RotaryEmbedding", _ROPE_MIXIN, _ROPE_WHY),
)

_installed: dict[str, type] = {}


def _load(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def plugin_is_platform() -> bool:
    from vllm.platforms import current_platform

    from vllm_x86.platform import X86Platform

    return isinstance(current_platform, X86Platform)


def register_all() -> dict[str, type]:
    """Install every override (idempotent). Only when the plugin is vLLM's platform:
    with VLLM_X86_DISABLE=1, stock vLLM CPU runs untouched."""
    if _installed or not plugin_is_platform():
        return _installed
    from vllm.model_executor.custom_op import CustomOp, op_registry_oot

    for row in OVERRIDES:
        base = _load(row.vllm_class)
        mixin = _load(row.mixin)
        if base.__name__ in op_registry_oot:
            _installed[base.__name__] = op_registry_oot[base.__name__]
            continue
        cls = type(f"X86{base.__name__}", (mixin, base), {"__doc__": row.why})
        vllm_name = getattr(base, "name", None)
        CustomOp.register_oot(_decorated_op_cls=cls, name=base.__name__)
        if vllm_name is not None:
            # register_oot names the class after the key; keep vLLM's op name so the
            # user's custom_ops "+name"/"-name" settings apply to the override too.
            cls.name = vllm_name
        _installed[base.__name__] = cls
    logger.debug("vllm-x86: installed op overrides: %s", sorted(_installed))
    return _installed
