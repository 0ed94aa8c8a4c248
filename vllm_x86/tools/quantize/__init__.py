"""The offline side of quantization, built on the runtime's formats: the converter that
writes the prepacked format (convert.py), GPTQ calibration (gptq.py) and the perplexity
runs that measure what a mode costs (quality.py)."""

from __future__ import annotations

from pathlib import Path


def shipped_text(name: str) -> str:
    """A text file of data/ without its "# " header lines (source and licence)."""
    lines = (Path(__file__).parent / "data" / name).read_text().splitlines(keepends=True)
    return "".join(ln for ln in lines if not ln.startswith("# "))
