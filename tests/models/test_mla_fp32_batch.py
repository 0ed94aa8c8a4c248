"""Float32 MLA end to end: the tiny DeepSeek-V2 checkpoint, three prompts of different
lengths in one batch (prefill and decode of several sequences at once), through vLLM
with the plugin (which gives float32 MLA vLLM's CPU_MLA backend), against transformers
float32 for each prompt. Chunked prefill is asked for with a 16-token budget; vLLM's
CPU platform turns it off for CPU_MLA, and the long prompt still prefills whole."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from tests.helpers import results
from vllm_x86.tools.conformance import conformance as conf
from vllm_x86.tools.conformance import tiny
from vllm_x86.tools.conformance.archs import BY_NAME

pytestmark = pytest.mark.slow

NEW = 8

_RUN = """
import json, sys
from vllm import LLM, SamplingParams
job = json.loads(sys.argv[1])
llm = LLM(job["model"], dtype="float32", enforce_eager=True, max_model_len=64,
          skip_tokenizer_init=True, enable_prefix_caching=False, seed=0,
          enable_chunked_prefill=True, max_num_batched_tokens=16)
sp = SamplingParams(temperature=0, max_tokens=job["new"], ignore_eos=True, logprobs=1,
                    prompt_logprobs=1, detokenize=False)
outs = llm.generate([{"prompt_token_ids": p} for p in job["prompts"]], sp, use_tqdm=False)
res = []
for p, o in zip(job["prompts"], outs):
    toks = list(o.outputs[0].token_ids)
    res.append({
        "tokens": toks,
        "prompt_logprobs": [o.prompt_logprobs[i][p[i]].logprob for i in range(1, len(p))],
        "logprobs": [d[t].logprob for d, t in zip(o.outputs[0].logprobs, toks)],
    })
cfg = llm.llm_engine.vllm_config
print("RESULT " + json.dumps({
    "outs": res,
    "backend": str(cfg.attention_config.backend),
    "chunked": cfg.scheduler_config.enable_chunked_prefill,
}))
"""


def test_deepseek_v2_float32_batch_matches_transformers():
    arch = BY_NAME["DeepseekV2ForCausalLM"]
    cfg = tiny.tiny_config(arch.name, arch.extra)
    model_dir = tiny.build(arch.name, cfg, gain=arch.gain, hub_format=arch.hub_format)
    vocab = tiny.text_config(cfg).vocab_size
    prompts = [
        tiny.prompt_ids(vocab),
        tiny.prompt_ids(vocab, n=3, seed=1),
        tiny.prompt_ids(vocab, n=40, seed=2),  # more than the 16-token budget
    ]
    job = json.dumps({"model": str(model_dir), "prompts": prompts, "new": NEW})
    got = results.run([sys.executable, "-c", _RUN, job], env=conf.worker_env(), timeout=900)
    if torch.cpu._is_amx_tile_supported():
        # vLLM CPU would pick AMX_MLA (bf16 only); the plugin sets CPU_MLA
        assert got["backend"].endswith("CPU_MLA")
    else:
        # without AMX vLLM picks CPU_MLA itself (chunked prefill off, below, is its
        # sign) and the plugin leaves the choice alone
        assert got["backend"] == "None"
    assert got["chunked"] is False
    for prompt, out in zip(prompts, got["outs"]):
        ref = tiny.reference(model_dir, "float32", prompt, NEW)
        assert out["tokens"] == ref["tokens"]
        for key in ("prompt_logprobs", "logprobs"):
            err = max(abs(a - b) for a, b in zip(out[key], ref[key]))
            assert err <= conf.FP32_LOGPROB_TOL, (key, err)
