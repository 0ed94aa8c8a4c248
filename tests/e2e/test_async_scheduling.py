"""VLLM_X86_ASYNC_SCHEDULING=1 keeps vLLM's asynchronous scheduling, which vLLM CPU
switches off: the engine really runs with it, and a batch of greedy requests (float32,
eager, vLLM's LLM class in a fresh process) gives the same tokens as synchronous steps."""

from __future__ import annotations

import pytest

from tests.conftest import PYTHON, clean_env
from tests.helpers import results

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
    return results.run(
        [PYTHON, "-c", SCRIPT, str(model)],
        timeout=600,
        env=clean_env(VLLM_X86_ASYNC_SCHEDULING=value),
        with_log=True,
    )


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
