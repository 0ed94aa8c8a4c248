"""A speculative step's verification through the fused decode call, against the layers' own code.

    .venv/bin/python vllm_x86/tools/bench/micro/verification_step.py \
        --model qwen2.5-coder-1.5b-instruct-q4_k_m --quantization x86_int4 \
        --draft qwen2.5-coder-0.5b-instruct-q4_k_m [--workload chat] [--rounds 2]

One vLLM engine (``LLM``, eager, the engine in this process) with speculative decoding: a
draft model (``--draft``, quantized as the model) or n-gram prompt lookup (the default,
``vllm-x86 serve --speculative ngram``'s settings). The same engine answers each prompt
of the speculative benchmark's workload twice in a row, once with steps of several
tokens per sequence taking the fused decode call (VLLM_X86_FUSED_VERIFICATION's
setting, ops/decoder_layer.py) and once with them running the layers' own code (the
module's limit set to one token between the two requests), the order alternating from
one prompt to the next. Both halves run on the same weights, caches and threads, so the
machine's drift between processes (up to 2x on the development VM) does not enter the
comparison. It prints the median time of the model's forward in a verification step
(vLLM's ``_model_forward``, timed by wrapping it in this process), the median tokens/s
of the requests, and whether the two answers of each prompt are the same text.

Why its own script: the side-by-side harness compares servers in separate processes,
and the speculative benchmark compares speculation on and off; this A/B toggles a
module setting between two requests of one engine, which only an in-process run can do.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="catalog name or model directory")
    p.add_argument("--draft", default=None, help="a draft model (default: n-gram lookup)")
    p.add_argument("--quantization", default="x86_int4", help="default: %(default)s")
    p.add_argument("--workload", choices=("edit", "chat"), default="edit")
    p.add_argument("--rounds", type=int, default=2, help="passes over the prompts")
    p.add_argument("--max-tokens", type=int, default=160)
    ns = p.parse_args(argv)

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process
    from vllm.v1.worker import gpu_model_runner

    from vllm_x86.tools.bench.harness import resolve_model
    from vllm_x86.tools.bench.speculative import CHAT_PROMPTS, EDIT_PROMPTS
    from vllm_x86.tools.cli.speculative import NGRAM_DEFAULTS, draft_config

    step_s: dict[int, list[float]] = collections.defaultdict(list)
    forward = gpu_model_runner.GPUModelRunner._model_forward

    def timed(self, *args, **kwargs):
        pos = kwargs.get("positions")
        t0 = time.perf_counter()
        out = forward(self, *args, **kwargs)
        if pos is not None:
            step_s[pos.shape[-1]].append(time.perf_counter() - t0)
        return out

    gpu_model_runner.GPUModelRunner._model_forward = timed

    from vllm import LLM, SamplingParams

    from vllm_x86.runtime.ops import decoder_layer

    model = str(resolve_model(ns.model)[0])
    if ns.draft:
        spec = draft_config(str(resolve_model(ns.draft)[0]), ns.quantization)
    else:
        spec = {"method": "ngram", **NGRAM_DEFAULTS}
    quant = {"quantization": ns.quantization} if ns.quantization else {}
    llm = LLM(model, dtype="bfloat16", enforce_eager=True, max_model_len=2048,
              speculative_config=spec, **quant)  # fmt: skip
    allowed = decoder_layer._rows_per_sequence
    if allowed == 1:
        print("the fused decode call takes no speculative steps here "
              "(VLLM_X86_FUSED_VERIFICATION=0, or layers it does not take)", file=sys.stderr)  # fmt: skip
        return 1
    tok = llm.get_tokenizer()
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                add_generation_prompt=True)
        for q in (EDIT_PROMPTS if ns.workload == "edit" else CHAT_PROMPTS)
    ]  # fmt: skip
    sp = SamplingParams(temperature=0, max_tokens=ns.max_tokens)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    tok_s: dict[str, list[float]] = collections.defaultdict(list)
    steps: dict[str, list[float]] = collections.defaultdict(list)
    texts: dict[str, list[str]] = collections.defaultdict(list)
    halves = (("fused", allowed), ("own code", 1))
    i = 0
    for _ in range(ns.rounds):
        for prompt in prompts:
            for name, rows in halves if i % 2 == 0 else halves[::-1]:
                decoder_layer.allow_rows_per_sequence(rows)
                step_s.clear()
                t0 = time.perf_counter()
                out = llm.generate([prompt], sp, use_tqdm=False)[0].outputs[0]
                tok_s[name].append(len(out.token_ids) / (time.perf_counter() - t0))
                texts[name].append(out.text)
                steps[name] += [s for n, v in step_s.items() if 1 < n <= allowed for s in v]
            i += 1
    decoder_layer.allow_rows_per_sequence(allowed)
    same = sum(a == b for a, b in zip(texts["fused"], texts["own code"]))
    med = statistics.median
    what = f"draft {ns.draft}" if ns.draft else "n-gram"
    print(f"{ns.model}, {ns.quantization or 'bf16'}, {what}, {ns.workload}, "
          f"{len(texts['fused'])} requests each, eager")  # fmt: skip
    print("| verification steps | steps | forward per step (ms, median) | request tok/s (median) |")
    print("|---|---|---|---|")
    for name, _ in halves:
        v = steps[name]
        ms = f"{1000 * med(v):.1f}" if v else "-"
        print(f"| {name} | {len(v)} | {ms} | {med(tok_s[name]):.1f} |")
    print(f"same text: {same} of {len(texts['fused'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
