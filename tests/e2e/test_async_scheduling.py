"""VLLM_X86_ASYNC_SCHEDULING=1 keeps vLLM's asynchronous scheduling, which vLLM CPU
switches off: the engine really runs with it, and a batch of greedy requests (float32,
eager, vLLM's LLM class) gives the same tokens as synchronous steps.

One fresh process runs both engines, one after the other (the setting is read when an
engine's config is made, and each engine has its own engine-core process): the
synchronous one first, then the asynchronous one. A marker line between them says
which engine's log is which."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import PYTHON, clean_env

pytestmark = pytest.mark.slow

MARK = "=== engine with VLLM_X86_ASYNC_SCHEDULING="

SCRIPT = """
import gc, json, os, sys
from vllm import LLM, SamplingParams

def run(value):
    os.environ["VLLM_X86_ASYNC_SCHEDULING"] = value
    print(sys.argv[2] + value, flush=True)
    llm = LLM(sys.argv[1], dtype="float32", enforce_eager=True, max_model_len=256, seed=0)
    prompts = [{"prompt_token_ids": [1, 504 + i, 3458, 282, 4649 + 7 * i, 314]} for i in range(4)]
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outs = llm.generate(prompts, sp, use_tqdm=False)
    res = {
        "async": llm.llm_engine.vllm_config.scheduler_config.async_scheduling,
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
    }
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return res

out = {"sync": run("0"), "async": run("1")}
print("RESULT " + json.dumps(out), flush=True)
"""


def test_async_scheduling_on_gives_the_tokens_of_synchronous_steps(default_model):
    from vllm_x86.bench.synthetic import build

    tiny = build("tiny-llama")
    r = subprocess.run(
        [PYTHON, "-c", SCRIPT, str(tiny), MARK],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
        env=clean_env(),
    )
    assert r.returncode == 0, r.stdout[-6000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
    got = json.loads(line[len("RESULT ") :])
    sync, asyn = got["sync"], got["async"]
    _, sync_log, async_log = r.stdout.split(MARK)
    assert sync_log.startswith("0\n") and async_log.startswith("1\n")
    assert sync["async"] is False
    assert asyn["async"] is True, async_log[-3000:]
    on = "asynchronous scheduling on (VLLM_X86_ASYNC_SCHEDULING=1)"
    assert on in async_log and on not in sync_log
    assert all(len(t) == 24 for t in asyn["tokens"])
    assert asyn["tokens"] == sync["tokens"]
