"""Linear-layer methods of `x86_int8` and `x86_int4`: quantize, pack, multiply.

Weights are quantized once (while a bf16 checkpoint loads, or offline by
`vllm-x86 quantize`), then packed into the blocked layout of the kernel that runs them.
vLLM CPU's AMX kernels (vendored there from SGLang) quantize the activations to 8 bits,
which cost +2.6 % perplexity for INT8 on the default model; the plugin's own kernels
keep 16-bit activations at the same speed from 8 rows up (docs/quantization.md):

- INT8: symmetric, one float32 scale per output channel; kernel
  `torch.ops.vllm_x86.int8_w8a16_gemm`, the plugin's own (csrc/amx_gemm.cpp, AMX-INT8):
  the activations are rounded to 16-bit integers per token (amax / 32639), so the
  output is as accurate as with bf16 activations (docs/quantization.md). With
  `VLLM_X86_QUANT_KERNEL=vllm`, vLLM CPU's `torch.ops._C.int8_scaled_mm_with_quant`
  instead, which quantizes the activations to 8 bits (faster for batches, less accurate).
- INT4: groups of `group_size` input channels (128 by default; 32 and 64 allowed), a
  bf16 scale per group and output channel, symmetric (zero point 8) or asymmetric (a
  zero point per group: an integer, or for groups of 32 an eighth of a step); kernel
  `torch.ops.vllm_x86.int4_w4a16_gemm`, the plugin's own (16-bit activations, as for
  INT8); with `VLLM_X86_QUANT_KERNEL=vllm`, vLLM CPU's `torch.ops._C.int4_scaled_mm_cpu`
  (8-bit activations, integer zero points). A Linear weight that already sits on a
  4-bit grid of groups of 32 (a dequantized GGUF Q4_0/Q4_1/Q4_K) keeps it (grid_group,
  VLLM_X86_QUANT_INT4_GRID).

Which kernel runs a weight is decided by the op table's quant rows
(ops/registry.py: weight_kernel, lm_head_kernel, int4_layout_kernel, from what
hardware.py says the CPU can run), re-exported here. Without AMX the plugin's kernels
run on AVX-512 VNNI (csrc/vnni_gemm.cpp: the same
packed weights, bit-identical results; vLLM CPU's kernels need AMX, so
VLLM_X86_QUANT_KERNEL=vllm gets PyTorch's kernels there). With neither, the methods use
PyTorch's weight-only kernels (`aten._weight_int8pack_mm`,
`aten._weight_int4pack_mm_for_cpu`), fast for one request and slow for batches, and
say so once at WARNING. Layers whose shapes the kernels do
not take stay in bf16, also with a warning. Activations must be bfloat16 (the kernels'
only activation type).
"""

from __future__ import annotations

import torch

from vllm_x86.runtime.log import get_logger
from vllm_x86.runtime.ops import registry

# Which kernel runs a weight is the op table's (its quant rows' rules), asked here.
from vllm_x86.runtime.ops.registry import (  # noqa: F401  (re-exported)
    activations,
    amx_available,
    check_plugin_kernels,
    int4_kernel,
    int4_layout_kernel,
    int8_kernel,
    lm_head_kernel,
    plugin_kernels_available,
    quant_isa,
    weight_kernel,
)
from vllm_x86.runtime.quant.groups import effective_group_size  # noqa: F401  (re-exported)

logger = get_logger("quant")

# Packed layouts, recorded in prepacked checkpoints (format.py): the plugin's own
# (pack_int8_w8a16, pack_int4_w4a16), and for INT4 on vLLM's kernel (on request) the
# one vLLM 0.32.0's converter produces (another vLLM may pack differently, hence the vLLM pin). The op
# table's kernels (ops/registry.py) name them.
INT8_LAYOUT = registry.W8A16.layout
INT4_LAYOUT = registry.W4A16.layout  # groups of 32, 64 and 128
INT4_LAYOUT_VLLM = registry.VLLM_W4A8.layout  # VLLM_X86_QUANT_KERNEL=vllm

_warned: set[str] = set()


def _warn_once(key: str, msg: str, *args) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(msg, *args)


def _info_once(key: str, msg: str, *args) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.info(msg, *args)


def check_prepacked_runs(kernel: str, what: str, name: str) -> None:
    """Raise with what to do when a prepacked checkpoint's layout (for `kernel`) cannot
    run on this CPU; `what` says what is packed ("this checkpoint is packed"), `name`
    is the method."""
    instead = f"serve the bf16 checkpoint with --quantization {name} instead"
    if kernel == "vllm":
        if not amx_available():
            raise RuntimeError(
                f"{what} for vLLM's AMX INT4 kernel and this CPU has "
                f"no AMX (or VLLM_X86_QUANT_KERNEL=torch is set); {instead}"
            )
        return
    if not plugin_kernels_available():
        raise RuntimeError(
            f"{what} for the plugin's INT8/INT4 kernels, which need AMX or AVX-512 "
            f"VNNI, and this CPU has neither (or VLLM_X86_QUANT_KERNEL=torch is set); {instead}"
        )
    check_plugin_kernels()


def _ops():
    from vllm import _custom_ops as ops
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    return ops


# ------------------------------------------------------------------ quantizers
# Pure functions of a [N, K] float weight; the tests' references use them too.


def quantize_int8(
    w: torch.Tensor, amax: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel INT8: (q [N, K] int8, scale [N] float32). `amax`:
    each channel's largest |w| when `w` holds only part of the row (a row-parallel
    rank's share; the whole row's maximum keeps the scale of tensor parallel size 1).

    Computed in blocks of rows (INT8_BLOCK_ELEMENTS weights each), in place: the same
    operations on the same values as over the whole matrix at once, so the same codes
    and scales, but the float32 temporaries stay small and in cache. Over the whole
    matrix they were four passes through fresh memory, whose first touches cost more
    than the arithmetic on a VM: Qwen2.5's 151936 x 896 LM head took 0.87 s, in blocks
    0.3 s (2 vCPUs)."""
    n, k = w.shape
    q = torch.empty(n, k, dtype=torch.int8, device=w.device)
    scale = torch.empty(n, dtype=torch.float32, device=w.device)
    rows = max(1, INT8_BLOCK_ELEMENTS // max(k, 1))
    for i in range(0, n, rows):
        wf = w[i : i + rows].float()
        a = wf.abs().amax(dim=1) if amax is None else amax[i : i + rows].float()
        s = (a / 127.0).clamp_min(1e-12)
        scale[i : i + rows] = s
        q[i : i + rows] = wf.div_(s[:, None]).round_().clamp_(-127, 127)
    return q, scale


# quantize_int8's block: 2^18 weights (1 MiB of float32 temporaries).
INT8_BLOCK_ELEMENTS = 1 << 18


def _bf16_up(s: torch.Tensor) -> torch.Tensor:
    """Positive float32 values rounded up to bf16 (returned as float32)."""
    s = s.clamp_min(1e-12)
    b = s.to(torch.bfloat16)
    below = b.float() < s
    b = torch.where(below, (b.view(torch.int16) + 1).view(torch.bfloat16), b)
    return b.float()


# How x86_int4 picks each group's scale and zero point (VLLM_X86_QUANT_INT4_ROUNDING):
# "search" (the default) or "minmax" (each group's own range, the earlier default).
INT4_ROUNDINGS = ("search", "minmax")
# The smaller side's range factors "search" tries, widest (min/max's own) first.
SEARCH_SHRINK = (1.0, 0.9, 0.8, 0.7)
# The error of each weight counts |w| ** power times its square: SEARCH_WEIGHT_POWER for
# the Linear layers, HEAD_SEARCH_WEIGHT_POWER for the LM head (lm_head.py; the powers
# that gave the least perplexity on SmolLM2, docs/quantization.md).
SEARCH_WEIGHT_POWER = 1.0
HEAD_SEARCH_WEIGHT_POWER = 2.0
# Elements of one chunk of groups (float32) the search holds at a time.
_CHUNK_ELEMENTS = 1 << 22


def int4_rounding(value: str | None = None) -> str:
    """The INT4 rounding asked for: `value`, or VLLM_X86_QUANT_INT4_ROUNDING when None."""
    if value is None:
        from vllm_x86.runtime import envs

        value = envs.get("VLLM_X86_QUANT_INT4_ROUNDING")
    v = str(value).strip().lower()
    if v not in INT4_ROUNDINGS:
        raise ValueError(
            f"VLLM_X86_QUANT_INT4_ROUNDING must be one of {', '.join(INT4_ROUNDINGS)}, not {value!r}"
        )
    return v


def _codes(wg, scale, zero, fine: bool) -> torch.Tensor:
    """Codes 0..15 (float) of the weights `wg` [..., G, g] for `scale`/`zero` [..., G]:
    round(w / scale) + zero for integer zero points, round(w / scale + zero) for zero
    points in eighths (the same for integers except at ties; the integer form is kept,
    so the codes of groups of 64 and 128 stay what they were)."""
    d = wg / scale[..., None]
    if fine:
        return d.add_(zero[..., None]).round_().clamp_(0, 15)
    return d.round_().add_(zero[..., None]).clamp_(0, 15)


def _zeros(lo: torch.Tensor, scale: torch.Tensor, fine: bool) -> torch.Tensor:
    """The zero point putting `lo` on code 0: an integer 0..15, or in eighths of a step."""
    z = -lo / scale
    return (torch.round(z * 8) / 8 if fine else torch.round(z)).clamp(0, 15)


def _group_err(wg, wt, scale, zero, fine: bool = False) -> torch.Tensor:
    """Per group, the norm of wt * (w - the weight its code stands for), with
    `scale`/`zero` [..., G]: the search's objective (a norm, not its square: the same
    order, one pass less)."""
    d = _codes(wg, scale, zero, fine)  # as the codes are made (quantize_int4)
    d.sub_(zero[..., None]).mul_(scale[..., None]).sub_(wg).mul_(wt)
    return torch.linalg.vector_norm(d, dim=-1)


def _params_minmax(wg: torch.Tensor, zero_point: bool, fine: bool = False):
    if zero_point:
        lo = wg.amin(dim=-1).clamp(max=0)
        hi = wg.amax(dim=-1).clamp(min=0)
        scale = _bf16_up((hi - lo) / 15.0)
        return scale, _zeros(lo, scale, fine)
    scale = _bf16_up(wg.abs().amax(dim=-1) / 7.0)
    return scale, torch.full_like(scale, 8.0)


def _params_search(
    wg: torch.Tensor, zero_point: bool, power: float = SEARCH_WEIGHT_POWER, fine: bool = False
):
    """Scale and zero point per group, chosen by the least |w|-weighted squared error
    among a few ranges, the group's min/max range first (so never worse than it in that
    error; ties keep it). With zero points the side of the larger magnitude keeps its
    extreme and the other side's range shrinks by SEARCH_SHRINK (clipping its extremes);
    symmetric: amax / 7 or the finer max(hi / 7, -lo / 8), which uses code 0 (-8)."""
    wt = wg.abs().pow_(power / 2)
    lo0 = wg.amin(dim=-1).clamp(max=0)
    hi0 = wg.amax(dim=-1).clamp(min=0)
    if zero_point:
        big_hi = hi0 >= -lo0
        cands = []
        for a in SEARCH_SHRINK:
            lo = torch.where(big_hi, lo0 * a, lo0)
            hi = torch.where(big_hi, hi0, hi0 * a)
            scale = _bf16_up((hi - lo) / 15.0)
            cands.append((scale, _zeros(lo, scale, fine)))
    else:
        eight = torch.full_like(hi0, 8.0)
        cands = [
            (_bf16_up(torch.maximum(hi0, -lo0) / 7.0), eight),
            (_bf16_up(torch.maximum(hi0 / 7.0, -lo0 / 8.0)), eight),
        ]
    best_scale, best_zero = cands[0]
    best = _group_err(wg, wt, best_scale, best_zero, fine)
    for scale, zero in cands[1:]:
        err = _group_err(wg, wt, scale, zero, fine)
        better = err < best
        best = torch.where(better, err, best)
        best_scale = torch.where(better, scale, best_scale)
        best_zero = torch.where(better, zero, best_zero)
    return best_scale, best_zero


def quantize_int4(
    w: torch.Tensor,
    group_size: int,
    zero_point: bool,
    rounding: str | None = None,
    power: float = SEARCH_WEIGHT_POWER,
    fine: bool | None = None,
):
    """Group-wise INT4: (q [N, K] int32 codes 0..15, scale [K/g, N] bf16,
    zero [K/g, N] int32 0..15, or float32 in eighths with `fine`). The weight a code
    stands for is (q - zero) * scale. `fine` (None: groups of 32, fine_zeros) puts the
    zero points on eighths of a step, as the plugin's kernel holds them for groups of 32:
    a group whose weights sit on a grid of 16 steps offset by a fraction of a step (a
    GGUF Q4_1 or Q4_K block) keeps that grid.
    Symmetric: zero = 8 (codes 0..15 stand for -8..7 scales). Asymmetric: a zero point
    per group. Scales are rounded up to bf16 (the kernel multiplies by bf16 scales;
    rounding down would push the extremes out of range), and codes are clamped to 0..15.

    `rounding` (None: VLLM_X86_QUANT_INT4_ROUNDING) picks the scale and zero point: "minmax",
    the group's range (scale = (max - min) / 15, zero = round(-min / scale); symmetric
    amax / 7); "search", the least squared error, each weight's counted |w| ** `power`
    times, among a few ranges (_params_search; docs/quantization.md has what each costs
    and gives). Groups are processed a chunk of rows at a time, all groups of a chunk
    at once."""
    search = int4_rounding(rounding) == "search"
    if fine is None:
        fine = fine_zeros(group_size)
    n, k = w.shape
    g = k // group_size
    q = torch.empty(n, k, dtype=torch.int32, device=w.device)  # meta: the reference's plan
    scale = torch.empty(n, g, device=w.device)
    zero = torch.empty(n, g, device=w.device)
    rows = max(1, _CHUNK_ELEMENTS // k)
    for r in range(0, n, rows):
        wg = w[r : r + rows].float().view(-1, g, group_size)
        if search:
            s, z = _params_search(wg, zero_point, power, fine)
        else:
            s, z = _params_minmax(wg, zero_point, fine)
        scale[r : r + rows], zero[r : r + rows] = s, z
        q[r : r + rows] = _codes(wg, s, z, fine).view(-1, k).to(torch.int32)
    zero = zero.t().contiguous()
    return (
        q,
        scale.t().contiguous().to(torch.bfloat16),
        zero if fine else zero.to(torch.int32),
    )


# A weight is on a 4-bit grid of groups of 32 when rounding it to one (min/max, zero
# points in eighths) moves it by less than GRID_RATIO of a step (root mean square over the
# rows checked). A dequantized GGUF Q4_1 weight in bf16 moves by about 0.046 (the zero
# point's eighths and the scale's bf16 rounding); other weights by 0.16-0.34 (a Q5_0
# one) or about 0.29 (uniform rounding error), docs/quantization.md.
GRID_RATIO = 0.1
# Rows checked per weight (spread evenly): enough to tell, cheap next to quantizing.
GRID_ROWS = 256


def grid_ratio(w: torch.Tensor, rows: int = GRID_ROWS) -> float:
    """How far rounding `w` [N, K] to 4 bits in groups of 32 (min/max, zero points in
    eighths) moves it, in steps (root mean square), over up to `rows` of its rows."""
    n, k = w.shape
    idx = torch.arange(rows) * (n - 1) // (rows - 1) if n > rows else slice(None)
    wg = w[idx].float().view(-1, k // 32, 32)
    s, z = _params_minmax(wg, True, fine=True)
    err = (_codes(wg, s, z, True) - z[..., None]) * s[..., None] - wg
    return float(err.pow(2).mean().sqrt() / s.mean().clamp_min(1e-30))


def grid_group(w: torch.Tensor, group_size: int, zero_point: bool, kernel: str) -> int:
    """The group size an INT4 weight `w` [N, K] is stored in: 32 where it already sits on
    a 4-bit grid of groups of 32 and keeping it is asked for (VLLM_X86_QUANT_INT4_GRID,
    zero points, a kernel holding zero points in eighths, K a multiple of 64), else
    `group_size` (the layer's effective group size). A kept grid is rounded by min/max
    (int4_rounding_for), which lands on it; the search would clip some groups."""
    n, k = w.shape
    if group_size == 32 or k % 64 or w.is_meta or not grid_allowed(zero_point, kernel):
        return group_size  # (a meta weight: a plan's shapes, no values to judge)
    return 32 if grid_ratio(w) < GRID_RATIO else group_size


def grid_allowed(zero_point: bool, kernel: str) -> bool:
    """Whether a 4-bit grid may be kept (grid_group): VLLM_X86_QUANT_INT4_GRID on, zero
    points, and a kernel holding zero points in eighths."""
    from vllm_x86.runtime import envs

    return envs.get_bool("VLLM_X86_QUANT_INT4_GRID") and zero_point and fine_zeros(32, kernel)


def int4_rounding_for(group: int, layer_group: int) -> str | None:
    """The rounding of a weight stored in groups of `group` where its layer's own groups
    are `layer_group`: "minmax" for a kept grid (grid_group), else None (the setting)."""
    return "minmax" if group != layer_group else None


def fine_zeros(group_size: int, kernel: str | None = None) -> bool:
    """Whether INT4 groups of `group_size` for `kernel` (None: the one that runs them
    here, int4_kernel) hold zero points in eighths of a step: groups of 32 on the
    plugin's kernel (and PyTorch's, whose zero points are floats); vLLM's kernel packs
    integer zero points."""
    if group_size != 32:
        return False
    return (kernel or int4_kernel(group_size)) != "vllm"


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.float()[:, None]


def dequantize_int4(q, scale, zero, group_size) -> torch.Tensor:
    """Float32 [N, K] weight the INT4 codes stand for."""
    n, k = q.shape
    qg = q.float().view(n, k // group_size, group_size)
    return ((qg - zero.t().float()[..., None]) * scale.t().float()[..., None]).view(n, k)


# ------------------------------------------------------------------ packing


def _awq_pack(v: torch.Tensor) -> torch.Tensor:
    """[R, N] codes 0..15 -> [R, N/8] int32: eight columns per word in the
    interleaved order (0, 2, 4, 6, 1, 3, 5, 7) of the AWQ layout."""
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        pack_quantized_values_into_int32,
    )
    from vllm.scalar_type import scalar_types

    r, n = v.shape
    v = v.view(r, n // 8, 8)[:, :, (0, 2, 4, 6, 1, 3, 5, 7)].reshape(r, n)
    return pack_quantized_values_into_int32(v, scalar_types.uint4, 1).contiguous()


def pack_int8(q: torch.Tensor) -> torch.Tensor:
    """[N, K] int8 -> vLLM CPU's blocked layout for int8_scaled_mm_with_quant."""
    _ops()
    return torch.ops._C.convert_weight_packed(q)


def _vnni_blocks(q: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [N/16, K/64, 16 quads, 64]: blocks of 16 output x 64 input channels,
    ordered [N/16][K/64], each row [16 channels][4 inputs], the AMX B-tile order of both
    plugin kernels (csrc/amx_gemm.cpp), which is also one zmm of vpdpbusd operands
    (csrc/vnni_gemm.cpp); ops/reference.py undoes it."""
    n, k = q.shape
    return (
        q.view(n // 16, 16, k // 64, 16, 4).permute(0, 2, 3, 1, 4).reshape(n // 16, k // 64, 16, 64)
    )


def pack_int8_w8a16(q: torch.Tensor) -> torch.Tensor:
    """[N, K] int8 -> [N/16, 16 K] int8 for int8_w8a16_gemm (_vnni_blocks, one byte per
    weight). Blocks of 16 whole channels, so packing a concatenation along N is
    concatenating the packs."""
    n, k = q.shape
    return _vnni_blocks(q).contiguous().view(n // 16, 16 * k)


def _per_block(t: torch.Tensor) -> torch.Tensor:
    """[K/g, N] per-group values -> [N/16, K/g * 16] ([N/16][K/g][16 channels])."""
    kg, n = t.shape
    return t.t().reshape(n // 16, 16, kg).permute(0, 2, 1).contiguous().view(n // 16, kg * 16)


def pack_int4_w4a16(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor):
    """quantize_int4's (codes [N, K], scale [K/g, N], zero [K/g, N]) -> (weight uint8
    [N/16, 8 K], scale float32 [N/16, K/g * 16], zero uint8 [N/16, K/g * 16]) for
    int4_w4a16_gemm (layout in csrc/amx_gemm.cpp). Blocks of 16 whole channels, so
    packing a concatenation along N is concatenating the packs."""
    n, k = q.shape
    t = _vnni_blocks(q.to(torch.uint8))  # B-tile rows r and r + 8 share a byte
    w = (t[:, :, :8] | (t[:, :, 8:] << 4)).contiguous().view(n // 16, 8 * k)
    if k // scale.shape[0] == 32:
        # groups of 32: zero points in eighths of a step (0..120), the scale a step / 8
        z8 = torch.round(zero.float() * 8).clamp(0, 120)
        return w, _per_block(scale.float() / 8), _per_block(z8.to(torch.uint8))
    return w, _per_block(scale.float()), _per_block(zero.to(torch.uint8))


def int8_matmul(kernel: str, x, weight, scale, bias):
    """x [M, K] bf16 @ the packed weight -> [M, N] bf16; bias float32 or None."""
    if kernel == "w8a16":
        if x.stride(-1) != 1:
            x = x.contiguous()
        return torch.ops.vllm_x86.int8_w8a16_gemm(x, weight, scale, bias)
    if kernel == "vllm":
        return torch.ops._C.int8_scaled_mm_with_quant(x, weight, scale, bias, x.dtype, True)
    out = torch.ops.aten._weight_int8pack_mm(x, weight, scale.to(x.dtype))
    return out if bias is None else out + bias.to(out.dtype)


def pack_int8_for(kernel: str, q: torch.Tensor) -> torch.Tensor:
    if kernel == "w8a16":
        return pack_int8_w8a16(q)
    return pack_int8(q) if kernel == "vllm" else q


def pack_int4(q, scale, zero):
    """-> (weight, zero points, scales), blocked for int4_scaled_mm_cpu."""
    ops = _ops()
    return ops.convert_weight_packed_scale_zp(
        _awq_pack(q.t().contiguous()), _awq_pack(zero), scale, ops.CPUQuantAlgo.AWQ
    )


def int8_shape_problem(n: int, k: int, kernel: str = "w8a16") -> str | None:
    if kernel == "vllm":
        # vLLM's packer works on blocks of 32 output channels (16 alone is refused)
        if k % 32 or n % 32:
            return f"vLLM's AMX INT8 kernel needs N and K multiples of 32 (N={n}, K={k})"
    elif k % 64 or n % 16:
        return f"the plugin's INT8 kernel needs N a multiple of 16 and K of 64 (N={n}, K={k})"
    return None


def int4_shape_problem(n: int, k: int, group_size: int, kernel: str = "vllm") -> str | None:
    if effective_group_size(k, group_size) is None:
        return f"K={k} is not a multiple of 32"
    if kernel == "w4a16":
        if n % 16 or k % 64:
            return f"the plugin's INT4 kernel needs N a multiple of 16 and K of 64 (N={n}, K={k})"
    elif n % 32 or k % 32:
        return f"vLLM's AMX INT4 kernel needs N and K multiples of 32 (N={n}, K={k})"
    return None


def quantize_pack(
    bits: int,
    kernel: str,
    w: torch.Tensor,
    group: int | None = None,
    zero_point: bool = False,
    power: float = SEARCH_WEIGHT_POWER,
    rounding: str | None = None,
) -> dict[str, torch.Tensor]:
    """Quantize a [N, K] weight and pack it for `kernel`: the tensors a quantized layer
    holds, by name (weight, weight_scale and for INT4 weight_zp; for PyTorch's INT4
    kernel weight and weight_scale_zero). Linear layers and MoE experts share it; the
    LM head passes its own `power` (quantize_int4)."""
    if bits == 8:
        q, scale = quantize_int8(w)
        return {"weight": pack_int8_for(kernel, q), "weight_scale": scale}
    fine = fine_zeros(group, kernel)
    q = quantize_int4(w, group, zero_point, rounding, power=power, fine=fine)
    return pack_int4_for(kernel, *q)


def pack_int4_for(kernel: str, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor):
    """quantize_int4's codes (or GPTQ's: the same format) packed for `kernel`, as
    quantize_pack returns them."""
    if kernel == "w4a16":
        bw, bs, bz = pack_int4_w4a16(q, scale, zero)
        return {"weight": bw, "weight_scale": bs, "weight_zp": bz}
    if kernel == "vllm":
        bw, bz, bs = pack_int4(q, scale, zero)
        return {"weight": bw, "weight_zp": bz, "weight_scale": bs}
    # PyTorch's int4 kernel: codes packed by aten, scale and zero interleaved
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    sz = torch.stack([scale.float(), (8 - zero.float()) * scale.float()], dim=-1).to(torch.bfloat16)
    return {"weight": packed, "weight_scale_zero": sz}


def int4_matmul(kernel, x, weight, scale, zp, group, bias, scale_zero=None):
    """x [M, K] bf16 @ quantize_pack's INT4 tensors -> [M, N] bf16; bias float32 or None."""
    if kernel == "w4a16":
        if x.stride(-1) != 1:
            x = x.contiguous()
        return torch.ops.vllm_x86.int4_w4a16_gemm(x, weight, scale, zp, group, bias)
    if kernel == "vllm":
        return torch.ops._C.int4_scaled_mm_cpu(x, weight, zp, scale, bias)
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, weight, group, scale_zero)
    return out if bias is None else out + bias.to(out.dtype)


def bf16_reason(bits: int, n: int, k: int, group_size: int, kernel: str) -> str | None:
    """Why an [N, K] weight that scope.py quantizes stays in bf16 (a shape `kernel`
    cannot take), or None: the layers (below) and the conformance reference (fake.py)
    both ask here."""
    if bits == 8:
        return int8_shape_problem(n, k, kernel)
    return int4_shape_problem(n, k, group_size, kernel)


def lm_head_bf16_reason(n: int, k: int, bits: int = 8, group_size: int = 128) -> str | None:
    """Why an LM head asked for in INT8 or INT4 stays in bf16 (lm_head.py), or None."""
    kernel = lm_head_kernel(bits, group_size)
    if kernel is None:
        if bits == 8:
            return "INT8 LM head needs the plugin's INT8 kernel (AMX or AVX-512 VNNI)"
        return (
            "INT4 LM head needs the plugin's INT4 kernel (AMX or AVX-512 VNNI, not "
            "VLLM_X86_QUANT_KERNEL=vllm)"
        )
    if bits == 8:
        return int8_shape_problem(n, k, kernel)
    return int4_shape_problem(n, k, group_size, kernel)


# ------------------------------------------------------------------ methods


def packed_shapes(
    bits: int, kernel: str, n: int, k: int, group: int | None = None
) -> dict[str, tuple[tuple[int, ...], torch.dtype, int]]:
    """The tensors quantize_pack makes of an [N, K] weight for one of the kernels
    a prepacked checkpoint is written for: name -> (shape, dtype, output channels per
    entry of the first dimension)."""
    if bits == 8:
        if kernel != "w8a16":
            raise ValueError(f"prepacked INT8 is laid out for the w8a16 kernel, not {kernel!r}")
        return {
            "weight": ((n // 16, 16 * k), torch.int8, 16),
            "weight_scale": ((n,), torch.float32, 1),
        }
    g = group
    if kernel == "w4a16":  # pack_int4_w4a16's shapes
        return {
            "weight": ((n // 16, 8 * k), torch.uint8, 16),
            "weight_zp": ((n // 16, k // g * 16), torch.uint8, 16),
            "weight_scale": ((n // 16, k // g * 16), torch.float32, 16),
        }
    if kernel == "vllm":
        # shapes of convert_weight_packed_scale_zp's outputs for an [N, K] weight:
        # blocks of 32 output channels x one group, 16 bytes of codes per input
        # channel plus 128 bytes of per-block sums
        return {
            "weight": ((n // 32, k // g, g * 16 + 128), torch.uint8, 32),
            "weight_zp": ((n // 32, k // g, 32), torch.int8, 32),
            "weight_scale": ((n // 32, k // g, 32), torch.float32, 32),
        }
    raise ValueError(f"no prepacked INT4 layout for the {kernel!r} kernel")
