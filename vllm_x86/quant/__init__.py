"""Weight quantization of the plugin: `x86_int8`, `x86_int4` (config.py, methods.py),
the prepacked checkpoint format (format.py) and the offline converter (convert.py)."""

from __future__ import annotations

from pathlib import Path

_registered = False


def shipped_text(name: str) -> str:
    """A text file of quant/data/ without its "# " header lines (source and licence)."""
    lines = (Path(__file__).parent / "data" / name).read_text().splitlines(keepends=True)
    return "".join(ln for ln in lines if not ln.startswith("# "))


def register() -> None:
    """Register the quantization configs with vLLM (idempotent)."""
    global _registered
    if _registered:
        return
    from vllm_x86.quant import config  # noqa: F401  (the decorators register)

    _registered = True
