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

Calibration is sequential, one decoder layer at a time (``sequential_gptq``), as in
the GPTQ paper: the checkpoint runs through transformers in its own dtype on
``data/calib_text.txt`` (standard library docstrings; not the evaluation text) up to
its first decoder layer; then for each decoder layer in turn, H (float32) of each
Linear layer the converter quantizes is accumulated from that layer's inputs, the
layer's weights are quantized, and the layer runs again with its quantized-dequantized
weights to make the next layer's inputs. So later layers are calibrated on the inputs
the quantized model really produces, and only one decoder layer's Hessians are alive
at a time. That needs the model in memory once more and a few minutes: this is for the
offline converter (``vllm-x86 quantize``, INT4's default), not for quantizing while
vLLM loads.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from vllm_x86.runtime.quant.format import Codes
from vllm_x86.runtime.quant.methods import SEARCH_SHRINK, _bf16_up, dequantize_int4
from vllm_x86.tools.quantize import shipped_text

DAMP = 0.01  # share of mean(diag H) added to the diagonal (the GPTQ paper's value)
CLIP = torch.linspace(1.0, 0.5, 21)  # range shrink factors the group search tries
BLOCK = 128  # columns whose errors are spread within the block before the rest


def calib_text() -> str:
    return shipped_text("calib_text.txt")


def group_params(wg: torch.Tensor, imp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale (bf16-representable float32, rounded up) and zero point (0..15) per row of
    `wg` [N, g]: of the ranges [a*min, a*max] for a in CLIP and those the while-loading
    search tries (methods._params_search: the larger side kept, the smaller shrunk), the
    one whose rounding error, weighted per column by `imp` [g], is least. a = 1 is
    min/max's range (kept on ties)."""
    lo0 = wg.amin(-1).clamp(max=0)
    hi0 = wg.amax(-1).clamp(min=0)
    a = CLIP[:, None]  # [A, 1]: every range at once
    lo, hi = lo0[None] * a, hi0[None] * a
    # and the ranges of the while-loading search (methods.SEARCH_SHRINK): the side of
    # the larger magnitude kept, the other shrunk
    big_hi = hi0 >= -lo0
    b = torch.tensor(SEARCH_SHRINK[1:])[:, None]
    lo = torch.cat([lo, torch.where(big_hi, lo0 * b, lo0)])
    hi = torch.cat([hi, torch.where(big_hi, hi0, hi0 * b)])
    scale = _bf16_up((hi - lo) / 15.0)  # [A, N]
    zero = torch.round(-lo / scale).clamp(0, 15)
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
    name `wanted` accepts, over the rows of `input_ids` [windows, tokens], all in one
    pass of the unquantized model (all of them in memory at once; the converter
    calibrates with ``sequential_gptq``, which is tested against this)."""
    hs: dict[str, torch.Tensor] = {}
    hooks = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and wanted(name):
            hooks.append(
                mod.register_forward_hook(lambda _m, inp, _o, name=name: _accumulate(hs, name, inp))
            )
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


def _accumulate(hs: dict[str, torch.Tensor], name: str, inp) -> None:
    x = inp[0].detach().float().reshape(-1, inp[0].shape[-1])
    acc = hs.get(name)
    hs[name] = x.t() @ x if acc is None else acc.addmm_(x.t(), x)


class _Stop(Exception):
    """Raised by the last decoder layer's stand-in: the rest of the model need not run."""


def decoder_layers(model) -> tuple[str, torch.nn.ModuleList]:
    """Name and modules of the decoder layers of a transformers model: the longest
    nn.ModuleList whose name ends in "layers" (``model.layers`` for the Llama family)."""
    found = [
        (name, mod)
        for name, mod in model.named_modules()
        if isinstance(mod, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] == "layers" and len(mod)
    ]
    if not found:
        raise ValueError(f"{type(model).__name__} has no list of decoder layers ('...layers')")
    return max(found, key=lambda f: len(f[1]))


def layer_inputs(model, input_ids: torch.Tensor) -> tuple[list[torch.Tensor], list[list]]:
    """What each decoder layer of `model` is called with, per row of `input_ids`: the
    first layer's hidden states ([1, tokens, hidden], model dtype) and, for every layer,
    the other arguments ((positional, keyword): attention mask, position embeddings,
    position ids, ... as transformers computes them before its loop over the layers, a
    layer's own mask where layers differ, e.g. sliding windows). The layers do not run:
    stand-ins record their arguments and pass the hidden states on, and the last one
    stops the forward pass."""
    _, layers = decoder_layers(model)
    saved = [layer.__dict__.get("forward") for layer in layers]
    rec: dict = {}

    def stand_in(i: int):
        def forward(*args, **kwargs):
            if args:
                h, rest = args[0], args[1:]
            else:
                h, rest = kwargs.pop("hidden_states"), ()
            if i == 0:
                rec["hidden"] = h
            rec["calls"].append((rest, kwargs))
            if i == len(layers) - 1:
                raise _Stop
            return h

        return forward

    hidden, calls = [], []
    for i, layer in enumerate(layers):
        layer.forward = stand_in(i)
    try:
        with torch.no_grad():
            for row in input_ids:
                rec.update(hidden=None, calls=[])
                try:
                    model(row[None], use_cache=False)
                except _Stop:
                    pass
                if len(rec["calls"]) != len(layers) or rec["hidden"] is None:
                    raise ValueError(
                        f"{type(model).__name__}'s forward pass called {len(rec['calls'])} of "
                        f"its {len(layers)} decoder layers"
                    )
                hidden.append(rec["hidden"].detach())
                calls.append(rec["calls"])
    finally:
        for layer, fwd in zip(layers, saved):
            del layer.forward
            if fwd is not None:
                layer.forward = fwd
    return hidden, calls


def sequential_gptq(
    model,
    input_ids: torch.Tensor,
    group_size_of: Callable[[str, torch.nn.Linear], int | None],
    progress: Callable[[str], None] | None = None,
    quantize: bool = True,
    on_layer: Callable[[int, dict[str, torch.Tensor]], None] | None = None,
    head_group: int | None = None,
) -> dict[str, Codes]:
    """GPTQ of the Linear layers of `model` (a transformers model) inside its decoder
    layers, one decoder layer at a time, calibrated on the rows of `input_ids`
    [windows, tokens]. `group_size_of(name, linear)` gives the group size to quantize a
    Linear layer with, or None to leave it as it is.

    For each decoder layer in order: H = X^T X (float32) of each chosen Linear's inputs,
    from the layer's current inputs; GPTQ of each weight with its H; the weight replaced
    (in `model`, which is left so) by its quantized-dequantized value; the layer run again
    on the same inputs to make the next layer's. `on_layer(i, hessians)` sees layer i's
    Hessians before they are used; `quantize=False` leaves the weights as they are (then
    every layer's H is that of the unquantized model). Returns each quantized Linear's
    codes by module name; a chosen Linear the layer never called has none.

    With `head_group`, the LM head too, last (under HEAD): its H is that of the final
    norm's outputs of the quantized model, what the head multiplies when it runs
    (on SmolLM2, in a float32 simulation over 8k tokens of the evaluation text with
    the decoder in bf16: perplexity +1.1 % against +14.6 % for round to nearest, groups
    of 64)."""
    prefix, layers = decoder_layers(model)
    hidden, calls = layer_inputs(model, input_ids)
    codes: dict[str, Codes] = {}
    t0 = time.monotonic()

    def run(layer, i: int) -> list[torch.Tensor]:
        outs = []
        with torch.no_grad():
            for h, per_layer in zip(hidden, calls):
                args, kwargs = per_layer[i]
                out = layer(h, *args, **kwargs)
                outs.append((out[0] if isinstance(out, tuple) else out).detach())
        return outs

    for i, layer in enumerate(layers):
        chosen: dict[str, tuple[torch.nn.Linear, int]] = {}
        for sub, mod in layer.named_modules():
            name = f"{prefix}.{i}.{sub}"
            if isinstance(mod, torch.nn.Linear):
                g = group_size_of(name, mod)
                if g is not None:
                    chosen[name] = (mod, g)
        hs: dict[str, torch.Tensor] = {}
        hooks = [
            mod.register_forward_hook(
                lambda _m, inp, _o, name=name, hs=hs: _accumulate(hs, name, inp)
            )
            for name, (mod, _g) in chosen.items()
        ]
        try:
            run(layer, i)
        finally:
            for hook in hooks:
                hook.remove()
        if on_layer:
            on_layer(i, hs)
        for name, (mod, g) in chosen.items():
            h = hs.pop(name, None)
            if h is None or not quantize:
                continue
            q, s, z = quantize_int4_gptq(mod.weight.data, h, g)
            del h
            mod.weight.data = dequantize_int4(q, s, z, g).to(mod.weight.dtype)
            codes[name] = Codes.of(q, s, z)
        del hs
        hidden = run(layer, i)
        if progress:
            progress(f"layer {i + 1}/{len(layers)} ({time.monotonic() - t0:.0f} s)")
    if head_group is not None and quantize:
        codes[HEAD] = head_codes(model, hidden, head_group)
        if progress:
            progress(f"LM head ({time.monotonic() - t0:.0f} s)")
    return codes


HEAD = "lm_head"  # sequential_gptq's key for the LM head's codes


def final_norm(model) -> torch.nn.Module:
    """The norm between the last decoder layer and the LM head of a transformers model:
    the `norm` (Llama, Qwen, Mistral, ...), `final_layernorm` or `final_layer_norm`
    beside its decoder layers."""
    prefix, _ = decoder_layers(model)
    base = model.get_submodule(prefix.rsplit(".", 1)[0]) if "." in prefix else model
    for name in ("norm", "final_layernorm", "final_layer_norm"):
        mod = getattr(base, name, None)
        if isinstance(mod, torch.nn.Module):
            return mod
    raise ValueError(f"{type(model).__name__} has no final norm where GPTQ looks for one")


def head_codes(model, hidden: list[torch.Tensor], group_size: int) -> Codes:
    """GPTQ of the LM head, calibrated on the last decoder layer's outputs `hidden`
    (one [1, tokens, hidden] tensor per calibration row) through the final norm."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise ValueError(f"{type(model).__name__}'s LM head is not a Linear layer")
    norm = final_norm(model)
    h = None
    with torch.no_grad():
        for x in hidden:
            y = norm(x).float().reshape(-1, x.shape[-1])
            h = y.t() @ y if h is None else h.addmm_(y.t(), y)
    q, s, z = quantize_int4_gptq(head.weight.data, h, group_size)
    return Codes.of(q, s, z)


def calibration_bytes(model, wanted: Callable[[str], bool], windows: int, tokens: int) -> int:
    """Memory `sequential_gptq` holds besides the model, for the Linear layers whose
    names `wanted` accepts: the largest decoder layer's Hessians (a float32 K x K per
    Linear) plus GPTQ's working copies of the largest (3 more), the hidden states of
    `windows` x `tokens` twice (a layer's inputs and outputs, in the model's dtype) and
    the codes (half a byte per quantized weight)."""
    prefix, layers = decoder_layers(model)
    per_layer, largest, weights = [0], 0, 0
    for i, layer in enumerate(layers):
        total = 0
        for sub, mod in layer.named_modules():
            if isinstance(mod, torch.nn.Linear) and wanted(f"{prefix}.{i}.{sub}"):
                total += 4 * mod.in_features**2
                largest = max(largest, 4 * mod.in_features**2)
                weights += mod.in_features * mod.out_features
        per_layer.append(total)
    emb = model.get_input_embeddings()
    hidden = 2 * windows * tokens * emb.embedding_dim * emb.weight.element_size()
    return max(per_layer) + 3 * largest + hidden + weights // 2


def calibration_ids(tokenizer, windows: int, window: int) -> torch.Tensor:
    """`windows` rows of `window` token ids from the calibration text (fewer if the
    text is shorter)."""
    ids = tokenizer(calib_text(), add_special_tokens=False)["input_ids"]
    n = min(windows, len(ids) // window)
    if n == 0:
        raise ValueError(f"the calibration text has fewer than {window} tokens")
    return torch.tensor(ids[: n * window]).view(n, window)
