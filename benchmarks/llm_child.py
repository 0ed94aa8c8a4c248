"""One measurement in a fresh process: load a model with vLLM's LLM class, then time
decode at 1 and N concurrent requests. Prints one JSON line (prefixed RESULT).

Run by the side-by-side scripts in this folder; the environment decides the contender
(VLLM_X86_DISABLE=1 for stock vLLM CPU, VLLM_CPU_OMP_THREADS_BIND=..., ...).
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--eager", action="store_true")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=2048)
    a = p.parse_args()

    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams

    llm = LLM(a.model, dtype=a.dtype, enforce_eager=a.eager, max_model_len=a.max_model_len, seed=0)
    startup = time.perf_counter() - t0
    sp = SamplingParams(temperature=0, max_tokens=a.new_tokens, ignore_eos=True)
    prompts = [f"Tell me a long story about the number {i}." for i in range(a.batch)]
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)

    t = time.perf_counter()
    out = llm.generate(prompts[:1], sp, use_tqdm=False)
    single = time.perf_counter() - t
    n1 = len(out[0].outputs[0].token_ids)

    t = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    batch = time.perf_counter() - t
    nb = sum(len(o.outputs[0].token_ids) for o in outs)
    print(
        "RESULT "
        + json.dumps(
            {
                "startup_s": startup,
                "decode_1_tok_s": n1 / single,
                f"decode_{a.batch}_tok_s": nb / batch,
                "text_1": out[0].outputs[0].text[:80],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
