"""Greedy generation with vLLM's LLM class in a fresh process; prints a JSON line.

Used by the parity tests: the environment picks plugin or stock (VLLM_X86_DISABLE=1).
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--dtype", required=True)
    p.add_argument("--eager", action="store_true")
    p.add_argument("--prompt-ids", required=True, help="JSON list of lists of token ids")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--custom-ops", default=None, help="comma-separated custom_ops setting")
    p.add_argument("--quantization", default=None)
    a = p.parse_args()

    import time

    t0 = time.monotonic()
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    kwargs = {}
    if a.quantization:
        kwargs["quantization"] = a.quantization
    if a.custom_ops:
        kwargs["compilation_config"] = {"custom_ops": a.custom_ops.split(",")}
    llm = LLM(a.model, dtype=a.dtype, enforce_eager=a.eager, max_model_len=1024, seed=0, **kwargs)
    load_s = time.monotonic() - t0
    sp = SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True)
    # One request at a time, as the transformers reference runs them: batching changes
    # the shapes the GEMM kernels see, and with them the order of bf16 accumulation.
    outs = [
        llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False)[0]
        for ids in json.loads(a.prompt_ids)
    ]
    print(
        "RESULT "
        + json.dumps(
            {
                "platform": type(current_platform).__name__,
                "load_s": load_s,
                "token_ids": [list(o.outputs[0].token_ids) for o in outs],
                "texts": [o.outputs[0].text for o in outs],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
