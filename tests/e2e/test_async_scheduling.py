"""VLLM_X86_ASYNC_SCHEDULING=1 keeps vLLM's asynchronous scheduling, which vLLM CPU
switches off: the engine really runs with it, and a batch of greedy requests (float32,
eager, vLLM's LLM class in a fresh process) gives the same tokens as synchronous steps."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import PYTHON, clean_env

pytestmark = pytest.mark.slow

SCRIPT = """
import json, sys
from vllm import LLM, SamplingParams
llm = LLM(sys.argv[1], dtype="float32", enforce_eager=True, max_model_len=256, seed=0)
prompts = [{"prompt_token_ids": [1, 504 + i, 3458, 282, 4649 + 7 * i, 314]} for i in range(4)]
sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
outs = llm.generate(prompts, sp, use_tqdm=False)
print("RESULT " + json.dumps({
    "async": llm.llm_engine.vllm_config.scheduler_config.async_scheduling,
    "tokens": [list(o.outputs[0].token_ids) for o in outs],
}))
"""


def _run(model, value: str) -> dict:
    r = subprocess.run(
        [PYTHON, "-c", SCRIPT, str(model)],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(VLLM_X86_ASYNC_SCHEDULING=value),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
    return {**json.loads(line[len("RESULT ") :]), "log": r.stdout + r.stderr}


def test_async_scheduling_on_gives_the_tokens_of_synchronous_steps(default_model):
    from vllm_x86.tools.bench.synthetic import build

    tiny = build("tiny-llama")
    sync = _run(tiny, "0")
    asyn = _run(tiny, "1")
    assert sync["async"] is False
    assert asyn["async"] is True, asyn["log"][-3000:]
    assert "asynchronous scheduling on (VLLM_X86_ASYNC_SCHEDULING=1)" in asyn["log"]
    assert all(len(t) == 24 for t in asyn["tokens"])
    assert asyn["tokens"] == sync["tokens"]
