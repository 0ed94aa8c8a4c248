"""Quality of quantized models: perplexity on a fixed text, greedy agreement with bf16.

    .venv/bin/python -m vllm_x86.tools.quantize.quality [--model DIR|NAME] [--variants bf16,x86_int8,x86_int4]

Each variant runs in a fresh process with vLLM's LLM class (eager mode):
- perplexity over the project's evaluation text (quant/data/eval_text.txt: the Python
  Language Reference, PSF License, about 27k tokens of SmolLM2's tokenizer), split into
  windows of --window tokens, each scored on its own (prompt log-probabilities);
- greedy agreement: --prompts prompts (48-token slices of the same text at spread-out
  offsets), 32 new tokens each; compared with the bf16 variant: the share of prompts
  whose 32 tokens are all identical, and the mean share of tokens before the first
  difference.
Variants: bf16; x86_int8; x86_int4 (group 128, zero points: the defaults); -head: the LM
head in INT8 too; -a16: 16-bit activations at every row count (VLLM_X86_QUANT_A8_ROWS=0);
x86_int8-w8a8 / x86_int4-w4a8: vLLM's kernels (8-bit activations);
x86_int4-sym (symmetric groups), -g64, -g32; x86_int4-minmax / x86_int4-head4-minmax: each
group's min/max range (VLLM_X86_QUANT_INT4_ROUNDING=minmax) instead of the default search; -wo: PyTorch's weight-only kernels on the
same weights; x86_int4-gptq / x86_int4-rtn-prepacked: a directory `vllm-x86 quantize`
writes first (GPTQ / round-to-nearest codes), served as it is; x86_int4-gptq-head4: the
same with `--lm-head int4` (the LM head's GPTQ codes too). Prints a markdown table.

Each run makes a folder under --out (`out/quality/` by default, outside git) with
results.json (every variant's numbers and greedy token ids) and summary.json (``summary``:
perplexity, its change against bf16 and the greedy agreement per variant, no token ids),
both written after every variant, so a run that stops keeps what it measured; --json
FILE also writes the summary to FILE (e.g. docs/bench/DATE-quality-NAME.json, the
reports the docs cite).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

NEW_TOKENS = 32
BASELINE = "bf16"
RAW_KIND = "vllm-x86 quality"
SUMMARY_KIND = "vllm-x86 quality summary"

VARIANTS: dict[str, tuple[str | None, dict[str, str]]] = {
    "bf16": (None, {}),
    "x86_int8": ("x86_int8", {}),
    "x86_int8-head": ("x86_int8", {"VLLM_X86_QUANT_LM_HEAD": "1"}),
    # 16-bit activations at every row count (without AMX, 8-bit ones from
    # VLLM_X86_QUANT_A8_ROWS rows are the default)
    "x86_int8-a16": ("x86_int8", {"VLLM_X86_QUANT_A8_ROWS": "0"}),
    "x86_int4-a16": ("x86_int4", {"VLLM_X86_QUANT_A8_ROWS": "0"}),
    # vLLM CPU's AMX-INT8 kernel: activations quantized to 8 bits per token
    "x86_int8-w8a8": ("x86_int8", {"VLLM_X86_QUANT_KERNEL": "vllm"}),
    "x86_int4-w4a8": ("x86_int4", {"VLLM_X86_QUANT_KERNEL": "vllm"}),
    # x86_int4's default: group 128 with zero points
    "x86_int4": ("x86_int4", {}),
    "x86_int4-head": ("x86_int4", {"VLLM_X86_QUANT_LM_HEAD": "1"}),
    "x86_int4-head4": ("x86_int4", {"VLLM_X86_QUANT_LM_HEAD": "int4"}),
    # the earlier default rounding (each group's min and max), for comparisons
    "x86_int4-minmax": ("x86_int4", {"VLLM_X86_QUANT_INT4_ROUNDING": "minmax"}),
    "x86_int4-head4-minmax": (
        "x86_int4",
        {"VLLM_X86_QUANT_LM_HEAD": "int4", "VLLM_X86_QUANT_INT4_ROUNDING": "minmax"},
    ),
    "x86_int4-sym": ("x86_int4", {"VLLM_X86_QUANT_ZERO_POINT": "0"}),
    "x86_int4-g64": ("x86_int4", {"VLLM_X86_QUANT_GROUP_SIZE": "64"}),
    "x86_int4-g32": ("x86_int4", {"VLLM_X86_QUANT_GROUP_SIZE": "32"}),
    # the same weights through PyTorch's weight-only kernels (bf16 activations)
    "x86_int8-wo": ("x86_int8", {"VLLM_X86_QUANT_KERNEL": "torch"}),
    "x86_int4-wo": ("x86_int4", {"VLLM_X86_QUANT_KERNEL": "torch"}),
}
# variants served from a directory `vllm-x86 quantize` writes first (in a temporary
# directory): converter arguments
CONVERTED: dict[str, dict] = {
    "x86_int4-gptq": {"bits": 4, "method": "gptq"},
    # the LM head in INT4 too, its codes calibrated with the layers'
    "x86_int4-gptq-head4": {"bits": 4, "method": "gptq", "lm_head": "int4"},
    "x86_int4-rtn-prepacked": {"bits": 4, "method": "rtn"},
}


def eval_text() -> str:
    from vllm_x86.tools.quantize import shipped_text

    return shipped_text("eval_text.txt")


def _child(a: argparse.Namespace) -> None:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    tok = AutoTokenizer.from_pretrained(a.model)
    ids = tok(eval_text(), add_special_tokens=False)["input_ids"]
    windows = [ids[i : i + a.window] for i in range(0, len(ids) - a.window + 1, a.window)]
    step = max(1, (len(ids) - 48) // a.prompts)
    prompts = [ids[i * step : i * step + 48] for i in range(a.prompts)]
    llm = LLM(
        a.model,
        dtype="bfloat16",
        quantization=a.quantization,
        enforce_eager=True,
        max_model_len=a.window + 8,
        seed=0,
    )
    outs = llm.generate(
        [{"prompt_token_ids": w} for w in windows],
        SamplingParams(max_tokens=1, prompt_logprobs=0),
        use_tqdm=False,
    )
    nll, count = 0.0, 0
    for w, out in zip(windows, outs):
        for pos, lp in enumerate(out.prompt_logprobs):
            if lp is None:
                continue
            nll -= lp[w[pos]].logprob
            count += 1
    gen = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True),
        use_tqdm=False,
    )
    print(
        "RESULT "
        + json.dumps(
            {
                "ppl": math.exp(nll / count),
                "scored_tokens": count,
                "windows": len(windows),
                "greedy": [list(g.outputs[0].token_ids) for g in gen],
            }
        ),
        flush=True,
    )


def run_variant(model: str, name: str, window: int, prompts: int) -> dict:
    if name in CONVERTED:
        import tempfile

        from vllm_x86.tools.quantize.convert import quantize_checkpoint

        with tempfile.TemporaryDirectory(prefix="vllm-x86-quality-") as tmp:
            out = Path(tmp) / name
            quantize_checkpoint(model, out, progress=_say, **CONVERTED[name])
            return _run(str(out), None, {}, window, prompts, name)
    quant, env_extra = VARIANTS[name]
    return _run(model, quant, env_extra, window, prompts, name)


def _say(msg: str) -> None:
    print(f"[quality] {msg}", file=sys.stderr, flush=True)


def _run(model, quant, env_extra, window, prompts, name) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_X86_QUANT")}
    env.update(env_extra)
    cmd = [
        sys.executable,
        "-m",
        "vllm_x86.tools.quantize.quality",
        "--child",
        "--model",
        model,
        "--window",
        str(window),
        "--prompts",
        str(prompts),
    ]
    if quant:
        cmd += ["--quantization", quant]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{name} failed ({p.returncode}):\n{p.stderr[-3000:]}")


def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[float, float]:
    same, prefix = 0, 0.0
    for x, y in zip(a, b):
        n = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), len(x))
        same += n == len(x)
        prefix += n / len(x)
    return same / len(a), prefix / len(a)


def summary(results: dict, raw: str | dict | None = None, **meta) -> dict:
    """A quality run without its greedy token ids: per variant the perplexity, its change
    against bf16 (%), the share of prompts whose greedy tokens all equal bf16's and the
    mean share of tokens before the first difference. ``results`` is a run's results.json
    or the bare {variant: numbers} mapping runs wrote before 2026-12-06 (``meta`` gives
    what those do not record, e.g. model=...). ``raw`` says where the full results are."""
    if results.get("kind") == SUMMARY_KIND:
        return results
    variants = results["variants"] if results.get("kind") == RAW_KIND else results
    keys = ("model", "model_path", "date", "command", "machine", "window", "prompts")
    info = {k: results[k] for k in keys if k in results} | meta
    first = next(iter(variants.values()), None)
    if first is not None:  # what older runs did not record, from their numbers
        info.setdefault("window", first["scored_tokens"] // first["windows"] + 1)
        info.setdefault("prompts", len(first["greedy"]))
    base = variants.get(BASELINE)
    rows = {}
    for n, r in variants.items():
        row = {"ppl": r["ppl"], "scored_tokens": r["scored_tokens"], "windows": r["windows"]}
        if base is not None:
            same, prefix = agreement(r["greedy"], base["greedy"])
            row |= {
                "ppl_vs_baseline_pct": 100 * (r["ppl"] / base["ppl"] - 1),
                "greedy_identical_share": same,
                "greedy_prefix_share": prefix,
            }
        rows[n] = row
    return {
        "kind": SUMMARY_KIND,
        "schema": 1,
        "raw": raw,
        **info,
        "new_tokens": results.get("new_tokens", NEW_TOKENS),
        "baseline": BASELINE,
        "variants": rows,
    }


def render(s: dict) -> str:
    """The markdown table of a summary."""
    base = s["variants"].get(s["baseline"], {})
    lines = [
        f"model {s.get('model')}; {base.get('scored_tokens')} tokens scored in "
        f"{base.get('windows')} windows of {s.get('window')}; greedy agreement over "
        f"{s.get('prompts')} prompts x {s['new_tokens']} tokens",
        "",
        "| variant | perplexity | vs bf16 | prompts with identical greedy output | "
        "mean share of tokens before the first difference |",
        "|---|---|---|---|---|",
    ]
    for n, r in s["variants"].items():
        if "ppl_vs_baseline_pct" not in r:
            lines.append(f"| {n} | {r['ppl']:.3f} | - | - | - |")
            continue
        lines.append(
            f"| {n} | {r['ppl']:.3f} | {r['ppl_vs_baseline_pct']:+.2f} % | "
            f"{100 * r['greedy_identical_share']:.0f} % | {100 * r['greedy_prefix_share']:.0f} % |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model",
        default=None,
        help="bf16 model directory or a name from `vllm-x86 pull --list` (default: the default model)",
    )
    ap.add_argument("--variants", default="bf16,x86_int8,x86_int4")
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument(
        "--json",
        metavar="FILE.json",
        help="also write the summary here (no token ids), e.g. docs/bench/DATE-quality-NAME.json",
    )
    ap.add_argument(
        "--out",
        default="out/quality",
        help="where the run's folder (results.json with the greedy token ids, summary.json) "
        "is made (default: %(default)s)",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--quantization", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        _child(a)
        return 0
    from vllm_x86.tools.models.pull import PullError, resolve_model

    names = a.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS and n not in CONVERTED]
    if unknown:  # before the model is pulled
        ap.error(f"unknown variants {unknown}; choose from {', '.join([*VARIANTS, *CONVERTED])}")
    model_arg = a.model
    try:
        a.model = resolve_model(a.model)  # a catalog name is pulled first
    except PullError as e:
        ap.exit(1, f"{ap.prog}: {e}\n")
    if BASELINE not in names:
        names.insert(0, BASELINE)
    from vllm_x86.tools.bench.harness import machine_info

    started = dt.datetime.now().astimezone()
    label = Path(model_arg or a.model).name.replace(":", "-")
    run_dir = Path(a.out) / f"{started:%Y%m%d-%H%M%S}-{label}"
    run_dir.mkdir(parents=True, exist_ok=True)
    raw_path = run_dir / "results.json"
    results = {
        "kind": RAW_KIND,
        "model": model_arg or Path(a.model).name,
        "model_path": str(a.model),
        "date": started.isoformat(timespec="seconds"),
        "command": "python -m vllm_x86.tools.quantize.quality " + shlex.join(argv),
        "machine": machine_info(),
        "window": a.window,
        "prompts": a.prompts,
        "new_tokens": NEW_TOKENS,
        "variants": {},
    }
    for n in names:
        _say(f"{n} ...")
        results["variants"][n] = run_variant(a.model, n, a.window, a.prompts)
        # after every variant: a long run that stops keeps what it measured
        raw_path.write_text(json.dumps(results, indent=1) + "\n")
        s = summary(results, raw=str(raw_path))
        for path in (run_dir / "summary.json", *([Path(a.json)] if a.json else [])):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(s, indent=1) + "\n")
    print("\n" + render(summary(results)))
    _say(f"written to {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
