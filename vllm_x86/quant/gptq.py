"""GPTQ for x86_int4: INT4 codes chosen with the layer's inputs in view.

Rounding each weight to its nearest INT4 code (``methods.quantize_int4``, "RTN") costs
SmolLM2 about +30 % perplexity at group 128. GPTQ (Frantar et al., 2022) quantizes a
layer's input channels one at a time and spreads each one's rounding error over the
channels not yet quantized, weighted by the inverse Hessian of the layer's output error,
``H = X^T X`` over calibration inputs X; channels go in order of decreasing diag(H)
(act order) with each group's scale fixed beforehand (static groups). Per group, the scale and zero point are those
of a clipping search that minimises the rounding error weighted by ``diag(H)`` (how
much each input channel carries), instead of the group's min and max.

The result has exactly RTN's format (codes 0..15, bf16 scales rounded up, int32 zero
points, groups as ``methods.effective_group_size`` picks them), so the packing, the
kernels and the prepacked format are unchanged: only which codes are written differs.

Calibration runs the checkpoint through transformers in its own dtype on
``data/calib_text.txt`` (standard library docstrings; not the evaluation text) and
accumulates H in float32 for every Linear layer the converter quantizes. That needs the
model in memory once more and a few minutes: this is for the offline converter
(``vllm-x86 quantize``, INT4's default), not for quantizing while vLLM loads.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from vllm_x86.quant import shipped_text
from vllm_x86.quant.methods import _bf16_up

DAMP = 0.01  # share of mean(diag H) added to the diagonal (the GPTQ paper's value)
CLIP = torch.linspace(1.0, 0.5, 21)  # range shrink factors the group search tries
BLOCK = 128  # columns whose errors are spread within the block before the rest


def calib_text() -> str:
    return shipped_text("calib_text.txt")


def group_params(wg: torch.Tensor, imp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale (bf16-representable float32, rounded up) and zero point (0..15) per row of
    `wg` [N, g]: of the ranges [a*min, a*max] for a in CLIP, the one whose rounding
    error, weighted per column by `imp` [g], is least. a = 1 is RTN's range."""
    lo0 = wg.amin(-1).clamp(max=0)
    hi0 = wg.amax(-1).clamp(min=0)
    a = CLIP[:, None]  # [A, 1]: every range at once
    scale = _bf16_up((hi0 - lo0)[None] * a / 15.0)  # [A, N]
    zero = torch.round(-lo0[None] * a / scale).clamp(0, 15)
    q = (torch.round(wg[None] / scale[..., None]) + zero[..., None]).clamp(0, 15)
    err = (((q - zero[..., None]) * scale[..., None] - wg[None]) ** 2 * imp).sum(-1)
    best = err.argmin(0)[None]  # the first (widest) range on ties
    return scale.gather(0, best)[0], zero.gather(0, best)[0]


def quantize_int4_gptq(w: torch.Tensor, h: torch.Tensor, group_size: int):
    """GPTQ of one [N, K] weight given H [K, K] (float32, X^T X of its inputs).
    Returns what ``methods.quantize_int4`` returns for zero points: (q [N, K] int32
    codes 0..15, scale [K/g, N] bf16, zero [K/g, N] int32).

    Columns go in the order of decreasing diag(H) ("act order": the channels that carry
    most are rounded first, while the most columns are left to absorb their error).
    Each group's scale and zero point are fixed before that, from the unmodified
    weights ("static groups"), so groups stay runs of consecutive input channels, the
    layout the kernels read."""
    n, k = w.shape
    if k % group_size:
        raise ValueError(f"K={k} is not a multiple of the group size {group_size}")
    w = w.float().clone()
    h = h.float().clone()
    dead = torch.diag(h) == 0  # input channels never active in calibration
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    imp = torch.diag(h).clone()
    groups = k // group_size
    scale = torch.empty(groups, n)
    zero = torch.empty(groups, n)
    for gi in range(groups):
        a, b = gi * group_size, (gi + 1) * group_size
        scale[gi], zero[gi] = group_params(w[:, a:b], imp[a:b])
    perm = torch.argsort(imp, descending=True, stable=True)
    w, h = w[:, perm], h[perm][:, perm]
    h += DAMP * torch.mean(torch.diag(h)) * torch.eye(k)
    # upper Cholesky factor of H^-1: row i holds the update weights for column i
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    group_of = perm // group_size  # each permuted column's group
    s_col = scale[group_of].t().contiguous().numpy()  # [N, K]: per column
    z_col = zero[group_of].t().contiguous().numpy()
    q = torch.empty(n, k, dtype=torch.int32)
    for a in range(0, k, BLOCK):
        b = min(a + BLOCK, k)
        codes, err = _block(w[:, a:b].numpy(), hinv[a:b, a:b].numpy(), s_col[:, a:b], z_col[:, a:b])
        q[:, a:b] = torch.from_numpy(codes)
        if b < k:  # the block's errors onto every later column at once
            w[:, b:].addmm_(torch.from_numpy(err), hinv[a:b, b:], alpha=-1.0)
    q = q[:, torch.argsort(perm)]
    return q, scale.to(torch.bfloat16), zero.to(torch.int32)


def _block(wb: np.ndarray, hb: np.ndarray, s: np.ndarray, z: np.ndarray):
    """A block of columns, one at a time: round to a code (with that column's scale and
    zero point, `s`/`z` [N, B]), then move the rounding error onto the block's later
    columns (row i of the inverse Hessian's Cholesky factor). Returns the codes (int32)
    and the scaled errors for the later blocks. NumPy: per column these are a handful
    of small vector operations, where torch's per-call overhead would be most of the
    time."""
    wb = wb.copy()
    n, cols = wb.shape
    codes = np.empty((n, cols), dtype=np.int32)
    err = np.empty((n, cols), dtype=np.float32)
    for i in range(cols):
        col = wb[:, i]
        code = np.clip(np.rint(col / s[:, i]) + z[:, i], 0, 15)
        codes[:, i] = code
        e = (col - (code - z[:, i]) * s[:, i]) / hb[i, i]
        err[:, i] = e
        if i + 1 < cols:
            wb[:, i + 1 :] -= np.outer(e, hb[i, i + 1 :])
    return codes, err


def hessians(
    model,
    input_ids: torch.Tensor,
    wanted: Callable[[str], bool],
    progress: Callable[[str], None] | None = None,
) -> dict[str, torch.Tensor]:
    """X^T X of the inputs of every nn.Linear of `model` (a transformers model) whose
    name `wanted` accepts, over the rows of `input_ids` [windows, tokens]."""
    hs: dict[str, torch.Tensor] = {}
    hooks = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and wanted(name):

            def hook(_m, inp, _out, name=name):
                x = inp[0].detach().float().reshape(-1, inp[0].shape[-1])
                acc = hs.get(name)
                hs[name] = x.t() @ x if acc is None else acc.addmm_(x.t(), x)

            hooks.append(mod.register_forward_hook(hook))
    t0 = time.monotonic()
    try:
        with torch.no_grad():
            for i, row in enumerate(input_ids):
                model(row[None], use_cache=False)
                if progress and (i + 1) % 8 == 0:
                    progress(
                        f"calibration: {i + 1}/{len(input_ids)} windows "
                        f"({time.monotonic() - t0:.0f} s)"
                    )
    finally:
        for h in hooks:
            h.remove()
    return hs


def hessian_bytes(model, wanted: Callable[[str], bool]) -> int:
    """Memory `hessians` will hold for `model`: a float32 K x K matrix per Linear."""
    return sum(
        4 * mod.in_features**2
        for name, mod in model.named_modules()
        if isinstance(mod, torch.nn.Linear) and wanted(name)
    )


def calibration_ids(tokenizer, windows: int, window: int) -> torch.Tensor:
    """`windows` rows of `window` token ids from the calibration text (fewer if the
    text is shorter)."""
    ids = tokenizer(calib_text(), add_special_tokens=False)["input_ids"]
    n = min(windows, len(ids) // window)
    if n == 0:
        raise ValueError(f"the calibration text has fewer than {window} tokens")
    return torch.tensor(ids[: n * window]).view(n, window)
