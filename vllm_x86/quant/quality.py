"""Quality of quantized models: perplexity on a fixed text, greedy agreement with bf16.

    .venv/bin/python -m vllm_x86.quant.quality [--model DIR|NAME] [--variants bf16,x86_int8,x86_int4]

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
x86_int4-sym (symmetric groups), -g64, -g32; -wo: PyTorch's weight-only kernels on the
same weights; x86_int4-gptq / x86_int4-rtn-prepacked: a directory `vllm-x86 quantize`
writes first (GPTQ / round-to-nearest codes), served as it is; x86_int4-gptq-head4: the
same with `--lm-head int4` (the LM head's GPTQ codes too). Prints a markdown table;
--json writes the raw numbers (after every variant, so a run that stops keeps them).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

NEW_TOKENS = 32

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
    from vllm_x86.quant import shipped_text

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

        from vllm_x86.quant.convert import quantize_checkpoint

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
        "vllm_x86.quant.quality",
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model",
        default=None,
        help="bf16 model directory or a name from `vllm-x86 pull --list` (default: the default model)",
    )
    ap.add_argument("--variants", default="bf16,x86_int8,x86_int4")
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--json", help="write the raw results here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--quantization", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if not a.child:
        from vllm_x86.models.pull import resolve_model

        a.model = resolve_model(a.model)  # a catalog name is pulled first
    if a.child:
        _child(a)
        return 0
    names = a.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS and n not in CONVERTED]
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {', '.join([*VARIANTS, *CONVERTED])}")
    if "bf16" not in names:
        names.insert(0, "bf16")
    results = {}
    for n in names:
        print(f"[quality] {n} ...", file=sys.stderr, flush=True)
        results[n] = run_variant(a.model, n, a.window, a.prompts)
        if a.json:  # after every variant: a long run that stops keeps what it measured
            Path(a.json).write_text(json.dumps(results, indent=1))
    base = results["bf16"]
    print(
        f"\nmodel {a.model}; {base['scored_tokens']} tokens scored in {base['windows']} "
        f"windows of {a.window}; greedy agreement over {a.prompts} prompts x "
        f"{NEW_TOKENS} tokens\n"
    )
    print(
        "| variant | perplexity | vs bf16 | prompts with identical greedy output | "
        "mean share of tokens before the first difference |"
    )
    print("|---|---|---|---|---|")
    for n in names:
        r = results[n]
        same, prefix = agreement(r["greedy"], base["greedy"])
        print(
            f"| {n} | {r['ppl']:.3f} | {100 * (r['ppl'] / base['ppl'] - 1):+.2f} % | "
            f"{100 * same:.0f} % | {100 * prefix:.0f} % |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
