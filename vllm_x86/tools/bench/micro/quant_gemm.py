"""Quantized GEMMs side by side: bf16 against INT8 and INT4 kernels, per layer of a model.

    .venv/bin/python vllm_x86/tools/bench/micro/quant_gemm.py [--layers 28] [--rows 1,8,16,32,64,256]

For each row count M, times one decoder layer's four GEMMs of Qwen3-0.6B (qkv 4096x1024,
o 1024x2048, gate_up 6144x1024, down 1024x3072) with every kernel, cycling through
--layers copies of the weights so that they stream from memory as in a real decode step
(28 layers: 440 MB of bf16), and prints ms per layer and ratios. Kernels: vLLM CPU's
bf16 GEMM (what an unquantized layer runs), the plugin's int8_w8a16_gemm and
int4_w4a16_gemm (group 128, zero points; AMX or AVX-512 VNNI, whichever runs here:
`--quant-isa` picks), then on AMX vLLM CPU's W8A8 and W4A8 AMX kernels
(VLLM_X86_QUANT_KERNEL=vllm), and without AMX PyTorch's weight-only kernels (what the
methods ran there before the VNNI kernels) and the VNNI kernels with 8-bit activations
(a scale per 64 inputs; `VLLM_X86_QUANT_A8_ROWS`), timed with every row count here.
The 16-bit kernels run with 8-bit activations off. Absolute times are for orientation only;
the kernels run one after another in one process, so read the ratios.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

SHAPES = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)]  # (N, K)


def _time(calls, seconds: float) -> float:
    for f in calls[:3]:
        f()
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < seconds:
        for f in calls:
            f()
        n += 1
    return (time.perf_counter() - t0) / n * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--rows", default="1,8,16,32,64,256")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: as set)")
    ap.add_argument("--seconds", type=float, default=1.0, help="per kernel and row count")
    ap.add_argument("--quant-isa", default="auto", help="auto, amx or avx512_vnni")
    a = ap.parse_args(argv)
    from vllm_x86.runtime.ops import kernels

    kernels.ops()  # loads the library and tells it what this CPU can run (hardware.py)
    import vllm_x86.runtime._C as C

    C.set_quant_isa(a.quant_isa)
    a8_rows = C.quant_a8_rows()
    if not C.quant_isa():
        print(
            "this CPU has neither AMX nor AVX-512 VNNI: the plugin's quantized kernels do "
            "not run here",
            file=sys.stderr,
        )
        return 1
    amx = C.quant_isa() == "amx"
    if a.threads:
        torch.set_num_threads(a.threads)
    from vllm.model_executor.layers.utils import (
        cpu_unquantized_gemm,
        dispatch_cpu_unquantized_gemm,
    )

    from vllm_x86.runtime.quant import methods as m

    m._ops()
    layers = []
    for n, k in SHAPES:
        w = (torch.randn(n, k) * 0.05).to(torch.bfloat16)
        q8, s8 = m.quantize_int8(w)
        q4 = m.quantize_int4(w, 128, True)
        for _ in range(a.layers):
            bf = torch.nn.Module()
            bf.weight = torch.nn.Parameter(w.clone(), requires_grad=False)
            dispatch_cpu_unquantized_gemm(bf, remove_weight=False)
            layers.append(
                {
                    "k": k,
                    "bf16": bf,
                    "i8": m.pack_int8_w8a16(q8),
                    "s8": s8.clone(),
                    "i4": m.pack_int4_w4a16(*q4),
                    **(
                        {"i8v": m.pack_int8(q8), "i4v": m.pack_int4(*q4)}
                        if amx
                        else {"i8t": q8.clone(), "i4t": m.quantize_pack(4, "torch", w, 128, True)}
                    ),
                }
            )
    kernels = {
        "bf16 (vLLM)": lambda L, x: cpu_unquantized_gemm(L["bf16"], x, L["bf16"].weight, None),
        "int8 w8a16 (plugin)": lambda L, x: torch.ops.vllm_x86.int8_w8a16_gemm(
            x, L["i8"], L["s8"], None
        ),
        "int4 w4a16 (plugin)": lambda L, x: torch.ops.vllm_x86.int4_w4a16_gemm(
            x, *L["i4"], 128, None
        ),
    }
    if amx:
        kernels["int8 w8a8 (vLLM)"] = lambda L, x: torch.ops._C.int8_scaled_mm_with_quant(
            x, L["i8v"], L["s8"], None, x.dtype, True
        )
        kernels["int4 w4a8 (vLLM)"] = lambda L, x: torch.ops._C.int4_scaled_mm_cpu(
            x, *L["i4v"], None
        )
    else:
        kernels["int8 wo (torch)"] = lambda L, x: m.int8_matmul("torch", x, L["i8t"], L["s8"], None)
        kernels["int4 wo (torch)"] = lambda L, x: m.int4_matmul(
            "torch", x, L["i4t"]["weight"], None, None, 128, None, L["i4t"]["weight_scale_zero"]
        )
    # the plugin's VNNI kernels with 8-bit activations from 1 row; all others without
    a8 = set()
    if not amx:
        kernels["int8 w8a8 (plugin)"] = kernels["int8 w8a16 (plugin)"]
        kernels["int4 w4a8 (plugin)"] = kernels["int4 w4a16 (plugin)"]
        a8 = {"int8 w8a8 (plugin)", "int4 w4a8 (plugin)"}
    names = list(kernels)
    weights = sum(n * k for n, k in SHAPES)
    print(
        f"Qwen3-0.6B layer GEMMs, {a.layers} copies, {torch.get_num_threads()} threads, "
        f"plugin kernels: {C.quant_isa()}: "
        "ms per layer (4 GEMMs); ratio = bf16 time / kernel time; GB/s = weight bytes read"
    )
    ratios = [n for n in names[1:] if "plugin" in n]
    print(
        "| M | "
        + " | ".join(names)
        + " | "
        + " | ".join(f"{n.split(' (')[0]} vs bf16" for n in ratios)
        + " |"
    )
    print("|---" * (len(names) + 1 + len(ratios)) + "|")
    for rows in (int(r) for r in a.rows.split(",")):
        xs = {k: torch.randn(rows, k).to(torch.bfloat16) for _, k in SHAPES}
        t = {}
        for name, f in kernels.items():
            C.set_quant_a8_rows(1 if name in a8 else 0)
            calls = [lambda L=L, f=f, xs=xs: f(L, xs[L["k"]]) for L in layers]
            t[name] = _time(calls, a.seconds) / a.layers
        C.set_quant_a8_rows(a8_rows)
        cells = []
        for name in names:
            bytes_per_w = 2 if name.startswith("bf16") else (1 if "int8" in name else 0.5)
            cells.append(f"{t[name]:.3f} ({weights * bytes_per_w / t[name] / 1e6:.0f} GB/s)")
        print(
            f"| {rows} | "
            + " | ".join(cells)
            + " | "
            + " | ".join(f"{t[names[0]] / t[n]:.2f}x" for n in ratios)
            + " |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
