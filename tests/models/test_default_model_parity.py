"""The plugin's greedy output for the default model equals transformers' greedy
output, token for token, in eager and compiled mode, bf16 and fp32.

France question: its first answer token is itself a near tie in float32 ("The" 25.33
against "L" 25.24, closer than bf16's 0.125 there). On the Xeon (AMX) development
machine the plugin gives transformers' 32 tokens in every mode and dtype, while stock
vLLM CPU in eager bf16 answers "L'Étoile, ..." (the last test pins that where it
happens; root cause and fix: docs/correctness.md and vllm_x86/runtime/ops/rotary_embedding.py).
On an AMD EPYC (AVX-512 BF16, no AMX) stock's eager bf16 answers as transformers and
the plugin's compiled bf16 takes the other tied token; so bf16 runs of this question are
held to the near-tie rule below like the others, and fp32 runs to every token.

Every prompt, bf16: equal up to the first near tie. Where the float32 reference's two
best tokens are closer than bf16 can resolve, bf16 implementations legitimately part
(transformers bf16 and transformers fp32 part there too); the test then requires the
plugin's token to be one of the two tied ones, and compares no further. In fp32 every
prompt must match all 32 tokens.
"""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from tests.conftest import HELPERS, PYTHON, clean_env

NEW_TOKENS = 32
QUESTIONS = [
    "What is the capital of France?",
    "Explain why the sky is blue in two sentences.",
]


def prompt_ids(model_dir) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": q}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for q in QUESTIONS
    ]


def bf16_spacing(x: float) -> float:
    """Distance between neighbouring bf16 numbers at magnitude |x| (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 2.0**-133


def fp32_margins(model_dir, prompts, continuations) -> list[list[tuple]]:
    """(top-1 minus top-2 logit, top-1 id, top-2 id, top-1 logit) of the float32 model
    at every position of each prompt's continuation (teacher-forced)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    out = []
    with torch.no_grad():
        for ids, cont in zip(prompts, continuations):
            logits = model(torch.tensor([ids + cont])).logits[0, len(ids) - 1 :].float()
            top = logits.topk(2, dim=-1)
            out.append(
                [
                    (float(v[0] - v[1]), int(i[0]), int(i[1]), float(v[0]))
                    for v, i in zip(top.values[: len(cont)], top.indices[: len(cont)])
                ]
            )
    return out


def transformers_greedy(model_dir, dtype_name: str, prompts: list[list[int]]) -> list[list[int]]:
    """Plain greedy decoding with transformers (no stop at EOS, like ignore_eos)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype_name))
    model.eval()
    outs = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            out = model(x, use_cache=True)
            past, new = out.past_key_values, []
            for _ in range(NEW_TOKENS):
                nxt = int(out.logits[0, -1].float().argmax())
                new.append(nxt)
                out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
            outs.append(new)
    return outs


@pytest.fixture(scope="module")
def reference(default_model):
    prompts = prompt_ids(default_model)
    ref = {d: transformers_greedy(default_model, d, prompts) for d in ("bfloat16", "float32")}
    margins = fp32_margins(default_model, prompts, ref["bfloat16"])
    return prompts, ref, margins


def run_vllm(model_dir, dtype: str, eager: bool, prompts, **env) -> dict:
    cmd = [
        PYTHON,
        str(HELPERS / "run_llm.py"),
        "--model",
        str(model_dir),
        "--dtype",
        dtype,
        "--prompt-ids",
        json.dumps(prompts),
        "--max-tokens",
        str(NEW_TOKENS),
    ]
    if eager:
        cmd.append("--eager")
    p = subprocess.run(cmd, env=clean_env(**env), capture_output=True, text=True, timeout=900)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise AssertionError(f"vLLM run failed ({p.returncode}):\n{p.stderr[-4000:]}")


# The plugin's four engines (bf16/fp32, eager/compiled) one after another in one fresh
# process: one Python + vLLM import instead of four. Each engine still runs in its own
# engine-core process (and compiles there); stock vLLM needs a process of its own (the
# platform is chosen at import).
_PLUGIN_RUNS = """
import gc, json, sys
from vllm import LLM, SamplingParams
from vllm.platforms import current_platform
model, prompts, new = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
out = {}
for dtype in ("bfloat16", "float32"):
    for eager in (True, False):
        llm = LLM(model, dtype=dtype, enforce_eager=eager, max_model_len=1024, seed=0)
        sp = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
        # one request at a time, as the transformers reference runs them
        outs = [llm.generate([{"prompt_token_ids": x}], sp, use_tqdm=False)[0] for x in prompts]
        out[dtype + ("-eager" if eager else "-compiled")] = {
            "platform": type(current_platform).__name__,
            "token_ids": [list(o.outputs[0].token_ids) for o in outs],
            "texts": [o.outputs[0].text for o in outs],
        }
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def plugin_runs(default_model, reference) -> dict:
    prompts = reference[0]
    p = subprocess.run(
        [PYTHON, "-c", _PLUGIN_RUNS, str(default_model), json.dumps(prompts), str(NEW_TOKENS)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise AssertionError(f"vLLM run failed ({p.returncode}):\n{p.stderr[-4000:]}")


@pytest.mark.slow
@pytest.mark.parametrize("eager", [True, False], ids=["eager", "compiled"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_plugin_greedy_equals_transformers(plugin_runs, reference, dtype, eager):
    prompts, ref, margins = reference
    res = plugin_runs[dtype + ("-eager" if eager else "-compiled")]
    assert res["platform"] == "X86Platform"
    if dtype == "float32":
        assert res["texts"][0].startswith("The capital of France is Paris.")
    for i, question in enumerate(QUESTIONS):
        got, want = res["token_ids"][i], ref[dtype][i]
        if got == want:
            continue
        assert dtype == "bfloat16", f"{question!r}: fp32 must match exactly: {got} != {want}"
        d = next(k for k, (a, b) in enumerate(zip(got, want)) if a != b)
        gap, top1, top2, top_logit = margins[i][d]
        assert gap < bf16_spacing(top_logit) and got[d] in (top1, top2), (
            f"{question!r} parts from transformers at token {d} ({got[d]} vs {want[d]}), "
            f"where the fp32 reference is no near tie: its top two ({top1}, {top2}) are "
            f"{gap:.3f} apart at logit {top_logit:.2f}, bf16 resolves {bf16_spacing(top_logit)}"
        )


@pytest.mark.slow
def test_stock_vllm_eager_bf16_diverges(default_model, reference):
    """The behaviour the plugin fixes, pinned so the parity test above can fail."""
    prompts, ref, _ = reference
    # stock needs one setting to start on this machine (see docs/correctness.md)
    res = run_vllm(
        default_model, "bfloat16", True, prompts, VLLM_X86_DISABLE="1", VLLM_CPU_KVCACHE_SPACE="1"
    )
    assert res["platform"] == "CpuPlatform"
    if res["token_ids"][0][:1] == ref["bfloat16"][0][:1]:  # the tied answer token
        pytest.skip(
            "stock vLLM CPU's eager bf16 answers the France question as transformers on "
            f"this CPU ({res['texts'][0][:40]!r}): the divergence is the Xeon's (AMX)"
        )
    assert res["texts"][0].startswith("L'")
    assert res["token_ids"][0] != ref["bfloat16"][0]
