"""Qwen3 attention with the fused split_norm_rope_neox kernel, in a real vLLM engine.

A tiny random-weight Qwen3 checkpoint (tests/helpers/tiny_family.py)
runs through vLLM with the plugin. In eager mode the attention modules switch to the
fused kernel; with vLLM's rotary CustomOp switched off they keep vLLM's own sequence
(split, two RMSNorms, rotary). The fused kernel is bit-identical to that sequence, so
the greedy tokens must be identical, in bf16 as in fp32; and in fp32 both must equal
transformers' greedy tokens.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import PYTHON, clean_env
from tests.helpers import results
from tests.helpers.tiny_family import tiny_family

pytestmark = pytest.mark.slow

NEW_TOKENS = 16


@pytest.fixture(scope="module")
def tiny_qwen3(default_model, tmp_path_factory):
    return tiny_family("Qwen3ForCausalLM", tmp_path_factory.mktemp("tiny-qwen3"), default_model)


IDS = [[1, 504, 3575, 282, 4649, 314], [1, 9690, 198, 2683, 359]]
UNFUSED = "all,-rotary_embedding"  # vLLM's rotary CustomOp off: vLLM's own sequence
MARK = "=== engine "

# The six engines (bf16 and fp32, fused and vLLM's sequence, fp32 compiled with the
# CustomOps on, and bf16 fused with attention through vLLM's layer) one after another in
# one fresh process: one Python + vLLM import instead of six. Each engine still builds its model in its own engine-core process;
# a marker line says whose log follows.
_RUN = """
import gc, json, os, sys
from vllm import LLM, SamplingParams
model, ids, new, unfused, mark = sys.argv[1:]
ids = json.loads(ids)
out = {}
engines = [(d, n, o, True) for d in ("bfloat16", "float32")
           for n, o in (("fused", None), ("unfused", unfused))]
# compiled mode with vLLM's CustomOps on: the plugin's ops inside the compiled graph
engines.append(("float32", "compiled", "all", False))
# fused, with attention through vLLM's layer instead of the plugin's direct call
engines.append(("bfloat16", "fused-layer", None, True))
for dtype, name, ops, eager in engines:
    key = dtype + "-" + name
    os.environ["VLLM_X86_DIRECT_ATTENTION"] = "0" if name == "fused-layer" else "1"
    # the plugin's decode kernel (the default) wherever the direct call runs: in bf16 it
    # rounds the probabilities as vLLM's AMX kernel does, so the direct call gives vLLM's
    # layer's tokens
    os.environ["VLLM_X86_DECODE_ATTENTION"] = "1"
    print(mark + key, flush=True)
    kw = {"compilation_config": {"custom_ops": ops.split(",")}} if ops else {}
    llm = LLM(model, dtype=dtype, enforce_eager=eager, max_model_len=1024, seed=0, **kw)
    sp = SamplingParams(temperature=0, max_tokens=int(new), ignore_eos=True)
    # one request at a time, as the transformers reference runs them
    outs = [llm.generate([{"prompt_token_ids": x}], sp, use_tqdm=False)[0] for x in ids]
    out[key] = [list(o.outputs[0].token_ids) for o in outs]
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def runs(tiny_qwen3):
    """{"bfloat16-fused": {"token_ids", "log"}, "bfloat16-unfused": ..., "float32-...": ...}"""
    tokens = results.run(
        [PYTHON, "-c", _RUN, str(tiny_qwen3), json.dumps(IDS), str(NEW_TOKENS), UNFUSED, MARK],
        env=clean_env(),
        timeout=1200,
        with_log=True,
        merge_output=True,
    )
    log = tokens.pop("log")
    logs = dict(part.split("\n", 1) for part in log.split(MARK)[1:])
    return {k: {"token_ids": v, "log": logs[k]} for k, v in tokens.items()}


def transformers_greedy(model_dir, ids):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    outs = []
    with torch.no_grad():
        for prompt in ids:
            x = torch.tensor([prompt])
            for _ in range(NEW_TOKENS):
                nxt = model(x).logits[0, -1].argmax()
                x = torch.cat([x, nxt.view(1, 1)], dim=1)
            outs.append(x[0, len(prompt) :].tolist())
    return outs


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_fused_attention_equals_vllm_sequence(tiny_qwen3, runs, dtype):
    fused, unfused = runs[f"{dtype}-fused"], runs[f"{dtype}-unfused"]
    assert "2 Qwen3Attention modules use the fused kernel" in fused["log"]
    assert "Qwen3Attention keeps vLLM's code" in unfused["log"]
    assert "use the fused kernel" not in unfused["log"]
    assert fused["token_ids"] == unfused["token_ids"]
    if dtype == "float32":
        assert fused["token_ids"] == transformers_greedy(tiny_qwen3, IDS)


def test_fused_attention_runs_inside_a_compiled_graph(tiny_qwen3, runs):
    """vLLM's compiled mode with every CustomOp on (`--compilation-config
    '{"custom_ops": ["all"]}'`): torch.compile traces the plugin's ops (their
    kernels-available checks are constants to it) and the tokens stay transformers'."""
    compiled = runs["float32-compiled"]
    assert "2 Qwen3Attention modules use the fused kernel" in compiled["log"], compiled["log"][
        -3000:
    ]
    # attention inside the graph is the plugin's one op (ops/attention.py), not vLLM's two
    assert "2 Attention use the plugin's code" in compiled["log"]
    assert compiled["token_ids"] == runs["float32-fused"]["token_ids"]
    assert compiled["token_ids"] == transformers_greedy(tiny_qwen3, IDS)


def test_decode_attention_kernel_gives_the_reference_tokens(tiny_qwen3, runs):
    """With VLLM_X86_DECODE_ATTENTION=1 (the default) decode steps run the plugin's
    decode_attention kernel (ops/attention.py): in fp32, eager and compiled, the greedy
    tokens are transformers'; in bf16 (test_direct_attention_equals_vllm_layer) vLLM's
    layer's."""
    for key in ("float32-fused", "float32-compiled", "bfloat16-fused"):
        assert "decode attention runs the plugin's kernel" in runs[key]["log"], key
    for key in ("float32-fused", "float32-compiled"):
        assert runs[key]["token_ids"] == transformers_greedy(tiny_qwen3, IDS)


def test_direct_attention_equals_vllm_layer(runs):
    """The op table's Attention row calls vLLM CPU's attention kernels from one place
    (ops/attention.py: direct_attention); with VLLM_X86_DIRECT_ATTENTION=0 attention goes
    through vLLM's Attention layer and its two custom ops: the same tokens."""
    direct, layer = runs["bfloat16-fused"], runs["bfloat16-fused-layer"]
    assert "2 Attention use the plugin's code" in direct["log"]
    assert "Attention keeps vLLM's code" not in direct["log"]
    assert "Attention keeps vLLM's code: VLLM_X86_DIRECT_ATTENTION=0" in layer["log"]
    assert "2 Attention use the plugin's code" not in layer["log"]
    assert "2 Qwen3Attention modules use the fused kernel" in layer["log"]
    assert direct["token_ids"] == layer["token_ids"]
