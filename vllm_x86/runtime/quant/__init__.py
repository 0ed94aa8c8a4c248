"""Weight quantization at run time: `x86_int8`, `x86_int4` (config.py, methods.py, moe.py,
lm_head.py), which layers they take (scope.py) and the prepacked checkpoint format
(format.py). The offline converter that writes that format is a tool
(vllm_x86/tools/quantize/)."""

from __future__ import annotations

_registered = False


def register() -> None:
    """Register the quantization configs with vLLM (idempotent)."""
    global _registered
    if _registered:
        return
    from vllm_x86.runtime.quant import config  # noqa: F401  (the decorators register)

    _registered = True
