"""Weight quantization of the plugin: `x86_int8`, `x86_int4` (config.py, methods.py),
the prepacked checkpoint format (format.py) and the offline converter (convert.py)."""

from __future__ import annotations

_registered = False


def register() -> None:
    """Register the quantization configs with vLLM (idempotent)."""
    global _registered
    if _registered:
        return
    from vllm_x86.quant import config  # noqa: F401  (the decorators register)

    _registered = True
