"""Model loading time: bf16, bf16 quantized while loading, and prepacked checkpoints.

    .venv/bin/python vllm_x86/tools/bench/micro/quant_load.py --model random:qwen3-0.6b --rounds 3

For each variant, in a fresh process each time and alternating (A B C A B C ...), it
starts vLLM's LLM class in eager mode and reads vLLM's own log line "Model loading took
... seconds" (weights read, quantized and packed where that applies, everything before
the KV cache and warm-up), plus the whole LLM() construction time. Variants:

- bf16: the bf16 checkpoint as it is
- otf-int8 / otf-int4: the bf16 checkpoint with --quantization x86_int8 / x86_int4
- pre-int8 / pre-int4: the checkpoint written by `vllm-x86 quantize` (made first, cached
  under --work)

Prints a markdown table of medians (min-max) and the ratios prepacked / on-the-fly and
prepacked / bf16. The page cache is warmed before each run (files read once), so the
figures compare the work done, not the disk.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
t0 = time.monotonic()
from vllm import LLM
kw = json.loads(sys.argv[2])
llm = LLM(sys.argv[1], dtype="bfloat16", enforce_eager=True, max_model_len=512, seed=0, **kw)
print("CONSTRUCT", time.monotonic() - t0, flush=True)
"""

LOAD_RE = re.compile(r"model weights loaded in ([\d.]+) s")  # vllm_x86/runtime/worker.py


def _warm(path: Path) -> None:
    for f in path.iterdir():
        if f.is_file():
            with open(f, "rb") as fh:
                while fh.read(1 << 24):
                    pass


def run_one(model: Path, kwargs: dict) -> dict:
    _warm(model)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_X86_", "VLLM_CPU_"))}
    if "VLLM_X86_CACHE_DIR" in os.environ:
        env["VLLM_X86_CACHE_DIR"] = os.environ["VLLM_X86_CACHE_DIR"]
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(model), json.dumps(kwargs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    wall = time.monotonic() - t0
    out = p.stdout + p.stderr
    if p.returncode != 0:
        raise RuntimeError(f"{model} {kwargs} failed:\n{out[-3000:]}")
    load = [float(x) for x in LOAD_RE.findall(out)]
    construct = [float(x.split()[1]) for x in out.splitlines() if x.startswith("CONSTRUCT ")]
    return {"model_load_s": load[-1], "construct_s": construct[-1], "process_s": wall}


def _current(out: Path, name: str) -> bool:
    """A prepacked checkpoint from an earlier run that this plugin still reads."""
    from vllm_x86.runtime.quant import format as qformat

    if not (out / "x86_quant.json").is_file():
        return False
    try:
        qformat.check_config(
            json.loads((out / "config.json").read_text())["quantization_config"], name
        )
    except (qformat.FormatError, KeyError):
        return False
    return True


def _fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:qwen3-0.6b", help="model dir or random:SHAPE")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="bf16,otf-int8,pre-int8,otf-int4,pre-int4")
    ap.add_argument("--work", default="out/quant_load")
    ap.add_argument("--json", help="write every sample here")
    a = ap.parse_args(argv)

    if a.model.startswith("random:"):
        from vllm_x86.tools.bench.synthetic import build

        model = build(a.model.split(":", 1)[1])
    else:
        model = Path(a.model).expanduser()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    variants: dict[str, tuple[Path, dict]] = {}
    for v in a.variants.split(","):
        if v == "bf16":
            variants[v] = (model, {})
        elif v.startswith("otf-int"):
            variants[v] = (model, {"quantization": f"x86_int{v[-1]}"})
        elif v.startswith("pre-int"):
            bits = int(v[-1])
            out = work / f"{model.name}-int{bits}"
            if not _current(out, f"x86_int{bits}"):
                from vllm_x86.tools.quantize.convert import quantize_checkpoint

                print(f"[quant_load] writing {out}", file=sys.stderr, flush=True)
                quantize_checkpoint(model, out, bits, force=True, progress=None)
            variants[v] = (out, {})
        else:
            ap.error(f"unknown variant {v}")

    samples: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(1, a.rounds + 1):
        for v, (path, kw) in variants.items():
            print(f"[quant_load] round {r}/{a.rounds}: {v}", file=sys.stderr, flush=True)
            samples[v].append(run_one(path, kw))
            print(f"[quant_load]   {samples[v][-1]}", file=sys.stderr, flush=True)

    print(f"\n{model} ({a.rounds} rounds, eager, bf16 activations)\n")
    print("| variant | vLLM model loading, s | LLM() construction, s |")
    print("|---|---|---|")
    for v, s in samples.items():
        print(
            f"| {v} | {_fmt([x['model_load_s'] for x in s])} | "
            f"{_fmt([x['construct_s'] for x in s])} |"
        )
    print()
    for bits in (8, 4):
        pre, otf = samples.get(f"pre-int{bits}"), samples.get(f"otf-int{bits}")
        base = samples.get("bf16")
        if pre and otf:
            ratios = [p["model_load_s"] / o["model_load_s"] for p, o in zip(pre, otf)]
            print(f"- pre-int{bits} / otf-int{bits} model loading: {_fmt(ratios)}")
        if pre and base:
            ratios = [p["model_load_s"] / b["model_load_s"] for p, b in zip(pre, base)]
            print(f"- pre-int{bits} / bf16 model loading: {_fmt(ratios)}")
    if a.json:
        Path(a.json).write_text(json.dumps(samples, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
