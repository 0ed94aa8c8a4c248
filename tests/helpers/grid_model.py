"""A copy of a bf16 model whose Linear weights sit on a 4-bit grid of groups of 32, as a
model dequantized from a GGUF Q4_1 file does: each group of 32 inputs is d * c + m with
codes c 0..15, d = (max - min) / 15 and m = min in float32 (m not a multiple of d), then
rounded to bf16. What `x86_int4`'s grid rule (VLLM_X86_QUANT_INT4_GRID) recognizes."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch


def q4_1(w: torch.Tensor) -> torch.Tensor:
    """`w` [N, K] (K a multiple of 32) put on its Q4_1 grid, in w's dtype."""
    n, k = w.shape
    g = w.float().view(n, k // 32, 32)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    d = ((hi - lo) / 15).clamp_min(1e-8)
    c = torch.round((g - lo) / d).clamp(0, 15)
    return (d * c + lo).view(n, k).to(w.dtype)


def grid_copy(src: Path, dst: Path) -> Path:
    """`src`'s files in `dst`, every 2-D `*proj.weight` put on its Q4_1 grid."""
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    for f in Path(src).iterdir():
        if f.suffix == ".safetensors":
            t = load_file(str(f))
            t = {
                k: q4_1(v) if k.endswith("proj.weight") and v.dim() == 2 else v
                for k, v in t.items()
            }
            save_file(t, str(dst / f.name), metadata={"format": "pt"})
        elif f.is_file() and not f.name.startswith(".vllm-x86"):
            shutil.copy2(f, dst / f.name)
    return dst
