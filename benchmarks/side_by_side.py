"""Two or more contenders on one model, side by side in one invocation.

Each measurement is a fresh process (benchmarks/llm_child.py: vLLM's LLM class, the
same engine and worker processes a server uses). Contenders alternate A B A B ... for
--rounds rounds so that the noise of a shared machine hits both; the report gives the
median and range of each figure and the median of the per-round ratios against the
first contender. Absolute numbers are for orientation only.

    .venv/bin/python benchmarks/side_by_side.py --contenders stock,plugin --rounds 3
    .venv/bin/python benchmarks/side_by_side.py --contenders plugin-1thread,plugin
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> (environment, what it is)
CONTENDERS: dict[str, tuple[dict[str, str], str]] = {
    "plugin": ({}, "vllm-x86, default settings"),
    "stock": (
        {"VLLM_X86_DISABLE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
        "stock vLLM CPU (VLLM_X86_DISABLE=1) plus the one change it needs to start "
        "here: VLLM_CPU_KVCACHE_SPACE=1",
    ),
    "plugin-1thread": (
        {"VLLM_CPU_OMP_THREADS_BIND": "0"},
        "vllm-x86 with vLLM's thread layout for 2 cores: 1 model thread, 1 core left "
        "to the engine loop",
    ),
}


def run(model: str, env_extra: dict, eager: bool, batch: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_X86_", "VLLM_CPU_"))}
    env.update(env_extra)
    cmd = [sys.executable, str(HERE / "llm_child.py"), "--model", model, "--batch", str(batch)]
    if eager:
        cmd.append("--eager")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"run failed ({p.returncode}):\n{p.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory (default: the default model)")
    ap.add_argument(
        "--contenders",
        default="stock,plugin",
        help=f"comma-separated, from {', '.join(CONTENDERS)}",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--compiled", action="store_true", help="compiled mode (default: eager)")
    a = ap.parse_args()
    if a.model is None:
        from vllm_x86.models.pull import pull

        a.model = str(pull())
    names = a.contenders.split(",")
    results: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(a.rounds):
        for n in names:
            res = run(a.model, CONTENDERS[n][0], not a.compiled, a.batch)
            results[n].append(res)
            print(f"round {r + 1} {n}: {json.dumps(res)}", file=sys.stderr, flush=True)

    keys = ["decode_1_tok_s", f"decode_{a.batch}_tok_s", "startup_s"]
    base = names[0]
    fmt = lambda v: f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"  # noqa: E731
    print(
        f"\nmodel: {a.model}; {'compiled' if a.compiled else 'eager'}; bf16; "
        f"{a.rounds} rounds; {len(os.sched_getaffinity(0))} CPUs; 128 new tokens\n"
    )
    for n in names:
        print(f"- {n}: {CONTENDERS[n][1]}")
    head = " | ".join(names) + " | " + " | ".join(f"{n}/{base}" for n in names[1:])
    print(f"\n| figure (median, min-max) | {head} |")
    print("|---" * (1 + 2 * len(names) - 1) + "|")
    for k in keys:
        cells = [fmt([x[k] for x in results[n]]) for n in names]
        ratios = []
        for n in names[1:]:
            rs = [b[k] / a_[k] for a_, b in zip(results[base], results[n], strict=False)]
            ratios.append(f"{statistics.median(rs):.2f}x")
        print(f"| {k} | " + " | ".join(cells + ratios) + " |")
    print("\ngreedy text of the 1-request run (first 60 characters):")
    for n in names:
        texts = sorted({x["text_1"][:60] for x in results[n]})
        same = "same in every round" if len(texts) == 1 else "DIFFERS between rounds"
        print(f"- {n} ({same}): " + " | ".join(repr(t) for t in texts))

if __name__ == "__main__":
    main()
