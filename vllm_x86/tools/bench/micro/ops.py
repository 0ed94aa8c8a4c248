"""Microbenchmarks of the plugin's kernels against the alternatives, side by side.

For each op and shape, in one process, the contenders run interleaved (A B C A B C ...)
so the noise of a shared machine hits them alike; each figure is the median over
rounds of the mean time per call of a timed loop.

Contenders (where they exist for the op):
  plugin   torch.ops.vllm_x86.*                    (this project's C++ kernel)
  stock    torch.ops._C.*                          (stock vLLM CPU's C++ op)
  native   vLLM's forward_native in eager PyTorch   (what stock vLLM CPU runs in eager
                                                    mode for RMSNorm and SiLU on x86)
  compiled torch.compile of the native version      (Inductor, dynamic shapes)

    .venv/bin/python vllm_x86/tools/bench/micro/ops.py                 # all ops, 1 thread and all threads
    .venv/bin/python vllm_x86/tools/bench/micro/ops.py --ops rms_norm --threads 1 --markdown out.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

DECODE = [1, 8, 64]
PREFILL = [512, 4096]


def _timeit(fn, min_time: float = 0.02) -> float:
    """Seconds per call: calls repeated until min_time has passed."""
    fn()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        el = time.perf_counter() - t0
        if el >= min_time and n >= 3:
            return el / n


def _race(contenders: dict, rounds: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            samples[name].append(_timeit(fn))
    return {k: statistics.median(v) for k, v in samples.items()}


def _compiled(fn):
    return torch.compile(fn, dynamic=True)


def cos_sin_cache(rot: int, max_pos: int = 8192) -> torch.Tensor:
    inv = 1.0 / (1e4 ** (torch.arange(0, rot, 2, dtype=torch.float) / rot))
    f = torch.outer(torch.arange(max_pos, dtype=torch.float), inv)
    return torch.cat((f.cos(), f.sin()), dim=-1)


def bench_rms_norm(tokens: int, dtype, rounds: int) -> dict:
    from vllm import ir

    hidden = 1024
    x = torch.randn(tokens, hidden).to(dtype)
    w = torch.randn(hidden).to(dtype)
    out = torch.empty_like(x)
    native = ir.ops.rms_norm.impls["native"].impl_fn
    comp = _compiled(native)
    return _race(
        {
            "plugin": lambda: torch.ops.vllm_x86.rms_norm(out, x, w, 1e-6),
            "stock": lambda: torch.ops._C.rms_norm(out, x, w, 1e-6),
            "native": lambda: native(x, w, 1e-6),
            "compiled": lambda: comp(x, w, 1e-6),
        },
        rounds,
    )


def bench_fused_add_rms_norm(tokens: int, dtype, rounds: int) -> dict:
    from vllm import ir

    hidden = 1024
    x = torch.randn(tokens, hidden).to(dtype)
    r = torch.randn(tokens, hidden).to(dtype)
    w = torch.randn(hidden).to(dtype)
    native = ir.ops.fused_add_rms_norm.impls["native"].impl_fn
    comp = _compiled(native)
    return _race(
        {
            "plugin": lambda: torch.ops.vllm_x86.fused_add_rms_norm(x, r, w, 1e-6),
            "stock": lambda: torch.ops._C.fused_add_rms_norm(x, r, w, 1e-6),
            "native": lambda: native(x, r, w, 1e-6),
            "compiled": lambda: comp(x, r, w, 1e-6),
        },
        rounds,
    )


def bench_silu_and_mul(tokens: int, dtype, rounds: int) -> dict:
    import torch.nn.functional as F

    d = 3072
    x = torch.randn(tokens, 2 * d).to(dtype)
    out = torch.empty(tokens, d, dtype=dtype)

    def native(t):
        return F.silu(t[..., :d]) * t[..., d:]

    comp = _compiled(native)
    return _race(
        {
            "plugin": lambda: torch.ops.vllm_x86.silu_and_mul(out, x),
            "stock": lambda: torch.ops._C.silu_and_mul(out, x),
            "native": lambda: native(x),
            "compiled": lambda: comp(x),
        },
        rounds,
    )


def bench_rotary_embedding(tokens: int, dtype, rounds: int) -> dict:
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    heads, kv, head = 16, 8, 128
    cache = cos_sin_cache(head).to(dtype)
    pos = torch.randint(0, 8192, (tokens,))
    q = torch.randn(tokens, heads * head).to(dtype)
    k = torch.randn(tokens, kv * head).to(dtype)

    def native(p, qq, kk):
        return RotaryEmbedding.forward_static(p, qq, kk, head, head, cache, True)

    comp = _compiled(native)
    return _race(
        {
            "plugin": lambda: torch.ops.vllm_x86.rotary_embedding(pos, q, k, head, cache, True),
            "stock": lambda: torch.ops._C.rotary_embedding(pos, q, k, head, cache, True),
            "native": lambda: native(pos, q, k),
            "compiled": lambda: comp(pos, q, k),
        },
        rounds,
    )


def bench_split_norm_rope_neox(tokens: int, dtype, rounds: int) -> dict:
    """Qwen3-0.6B attention prologue: fused kernel vs the sequence it replaces."""
    from vllm import ir
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    heads, kv, head = 16, 8, 128
    cache = cos_sin_cache(head).to(dtype)
    pos = torch.randint(0, 8192, (tokens,))
    qkv = torch.randn(tokens, (heads + 2 * kv) * head).to(dtype)
    qw = torch.randn(head).to(dtype)
    kw = torch.randn(head).to(dtype)
    outs = [torch.empty(tokens, n * head, dtype=dtype) for n in (heads, kv, kv)]
    native_rms = ir.ops.rms_norm.impls["native"].impl_fn

    def split_views():
        q, k, v = qkv.split([heads * head, kv * head, kv * head], dim=-1)
        return q.view(tokens, heads, head), k.view(tokens, kv, head), v

    def stock_eager():  # stock vLLM CPU eager: native norms, _C rotary
        q, k, v = split_views()
        qn = native_rms(q, qw, 1e-6).view(tokens, -1)
        kn = native_rms(k, kw, 1e-6).view(tokens, -1)
        torch.ops._C.rotary_embedding(pos, qn, kn, head, cache, True)

    def plugin_unfused():  # the plugin's separate kernels
        q, k, v = split_views()
        qn = torch.empty(q.shape, dtype=dtype)
        kn = torch.empty(k.shape, dtype=dtype)
        torch.ops.vllm_x86.rms_norm(qn, q, qw, 1e-6)
        torch.ops.vllm_x86.rms_norm(kn, k, kw, 1e-6)
        torch.ops.vllm_x86.rotary_embedding(
            pos, qn.view(tokens, -1), kn.view(tokens, -1), head, cache, True
        )

    def native_seq(x):
        q, k, v = x.split([heads * head, kv * head, kv * head], dim=-1)
        qn = native_rms(q.view(tokens, heads, head), qw, 1e-6).view(tokens, -1)
        kn = native_rms(k.view(tokens, kv, head), kw, 1e-6).view(tokens, -1)
        return RotaryEmbedding.forward_static(pos, qn, kn, head, head, cache, True)

    comp = _compiled(native_seq)
    return _race(
        {
            "plugin": lambda: torch.ops.vllm_x86.split_norm_rope_neox(
                *outs, qkv, pos, qw, kw, cache, heads, kv, head, 1e-6
            ),
            "plugin-unfused": plugin_unfused,
            "stock": stock_eager,
            "native": lambda: native_seq(qkv),
            "compiled": lambda: comp(qkv),
        },
        rounds,
    )


BENCHES = {
    "rms_norm": (bench_rms_norm, "hidden 1024"),
    "fused_add_rms_norm": (bench_fused_add_rms_norm, "hidden 1024"),
    "silu_and_mul": (bench_silu_and_mul, "d 3072"),
    "rotary_embedding": (bench_rotary_embedding, "16 q + 8 kv heads x 128"),
    "split_norm_rope_neox": (bench_split_norm_rope_neox, "Qwen3-0.6B: 16 q + 8 kv heads x 128"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default=",".join(BENCHES))
    ap.add_argument("--threads", default=f"1,{len(os.sched_getaffinity(0))}")
    ap.add_argument("--tokens", default=",".join(map(str, DECODE + PREFILL)))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--markdown", help="also write the table to this file")
    a = ap.parse_args()

    from vllm.platforms import current_platform

    current_platform.import_kernels()  # stock vLLM's torch.ops._C
    from vllm_x86.runtime.ops import kernels

    if not kernels.available():
        sys.exit(f"vllm-x86 kernels unavailable: {kernels.load_error()}")
    torch._dynamo.config.cache_size_limit = 64
    lines = [
        f"ISA {kernels.isa()}; bf16; {a.rounds} interleaved rounds; times in µs per call "
        "(median); ratios = contender time / plugin time (above 1: the plugin is faster)",
        "",
    ]
    for op in a.ops.split(","):
        fn, what = BENCHES[op]
        for threads in map(int, a.threads.split(",")):
            torch.set_num_threads(threads)
            header = None
            for tokens in map(int, a.tokens.split(",")):
                res = fn(tokens, torch.bfloat16, a.rounds)
                if header is None:
                    others = [k for k in res if k != "plugin"]
                    header = others
                    lines.append(f"### {op} ({what}), {threads} thread(s)")
                    lines.append("")
                    lines.append(
                        "| tokens | plugin µs | "
                        + " | ".join(f"{k} µs" for k in others)
                        + " | "
                        + " | ".join(f"{k}/plugin" for k in others)
                        + " |"
                    )
                    lines.append("|---" * (2 + 2 * len(others)) + "|")
                p = res["plugin"]
                cells = [f"{res[k] * 1e6:.1f}" for k in header]
                ratios = [f"{res[k] / p:.1f}x" for k in header]
                lines.append(f"| {tokens} | {p * 1e6:.1f} | " + " | ".join(cells + ratios) + " |")
                print(lines[-1], file=sys.stderr, flush=True)
            lines.append("")
    text = "\n".join(lines)
    print(text)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
