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
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument(
        "--skip-tokenizer-init", action="store_true", help="for checkpoints without a tokenizer"
    )
    p.add_argument("--logprobs", action="store_true", help="also the greedy tokens' logprobs")
    p.add_argument(
        "--describe-experts",
        action="store_true",
        help="also the parameters (dtype, shape, bytes) of every routed-experts layer",
    )
    a = p.parse_args()

    import os
    import time

    if a.describe_experts:  # the engine in this process: apply_model reads its model
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

    t0 = time.monotonic()
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    kwargs = {}
    if a.quantization:
        kwargs["quantization"] = a.quantization
    if a.skip_tokenizer_init:
        kwargs["skip_tokenizer_init"] = True
    if a.custom_ops:
        kwargs["compilation_config"] = {"custom_ops": a.custom_ops.split(",")}
    llm = LLM(
        a.model,
        dtype=a.dtype,
        enforce_eager=a.eager,
        max_model_len=a.max_model_len,
        seed=0,
        **kwargs,
    )
    load_s = time.monotonic() - t0
    sp = SamplingParams(
        temperature=0,
        max_tokens=a.max_tokens,
        ignore_eos=True,
        logprobs=0 if a.logprobs else None,
    )
    # One request at a time, as the transformers reference runs them: batching changes
    # the shapes the GEMM kernels see, and with them the order of bf16 accumulation.
    outs = [
        llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False)[0]
        for ids in json.loads(a.prompt_ids)
    ]
    result = {
        "platform": type(current_platform).__name__,
        "load_s": load_s,
        "token_ids": [list(o.outputs[0].token_ids) for o in outs],
        "texts": [o.outputs[0].text for o in outs],
    }
    if a.logprobs:
        result["logprobs"] = [
            [lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)]
            for o in outs
        ]
    if a.describe_experts:
        result["experts"] = llm.apply_model(_describe_experts)[0]
    print("RESULT " + json.dumps(result), flush=True)


def _describe_experts(model) -> list[dict]:
    """Each routed-experts layer: its quant method's class and its parameters."""
    from vllm.model_executor.layers.fused_moe import RoutedExperts

    return [
        {
            "name": name,
            "method": type(mod.quant_method).__name__,
            "params": {
                p: [str(t.dtype).removeprefix("torch."), list(t.shape), t.nbytes]
                for p, t in mod.named_parameters(recurse=False)
            },
        }
        for name, mod in model.named_modules()
        if isinstance(mod, RoutedExperts)
    ]


if __name__ == "__main__":
    main()
