"""The plugin's greedy output for the default model follows the float32 model, token
for token, bf16 (the default) in eager and compiled mode, fp32 and INT8 eager
(docs/correctness.md).

The reference is transformers in float32 on the model's weights (bf16 values, exact in
float32), greedy, 32 new tokens past the chat prompt (ignore_eos), for the prompts of
tests/helpers/logit_error.py (the demo's France question first).

- fp32 engines: every token equals the reference's.
- bf16 engines (the default, VLLM_X86_FP32_RESIDUAL=1: residual stream and best logits
  in float32): equal to the float32 reference's tokens up to its first step whose two
  best logits are less than BF16_MARGIN (0.1) apart; there a bf16 model may legitimately
  part. The rest of its arithmetic is bf16 (every GEMM's input and output, rotary, the
  KV cache, the final norm's output), which moves the distance between the top logits by
  0.05 on average and 0.19-0.21 at the 99th percentile (AMD EPYC VM, 2026-12-07:
  tests/helpers/logit_error.py, docs/correctness.md); a rule at 0.05 holds only by luck
  (the EPYC's compiled engine parted at a step with margin 0.065, its eager one would
  need 0.034, the AMX Xeon's 0.019-0.041). France: "The" leads "L" by 0.098 in float32,
  so bf16 must answer "The capital of France is Paris." on every CPU (it answered
  "L'Étoile, ..." compiled on an AMD EPYC before the float32 residual).
- INT8 engines (`--quantization x86_int8`): INT8 weights are another model. Their
  rounding alone moves the logits at the top tokens by far more than BF16_MARGIN from the
  float32 bf16-weight model's (measured on these prompts, 2026-12-05: mean 0.21, 99th
  percentile 0.73, max 1.21; bf16 with the float32 residual: 0.08 / 0.32 / 0.47), and
  INT8 parted from the float32 tokens at steps whose float32 margin was 0.074 (eager)
  and 0.37 (compiled). So INT8 is held to the same rule with INT8_MARGIN (0.75, about
  that 99th percentile) instead of BF16_MARGIN: it catches a broken INT8 path, not the
  quantization's own error.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import HELPERS, PYTHON, clean_env
from tests.helpers import results
from tests.helpers.logit_error import QUESTIONS, Reference, agrees_until_tie, prompt_ids

# the first test builds the references and runs the five engines (~10 min here, more
# on a busy machine)
pytestmark = pytest.mark.timeout(3600)

NEW_TOKENS = 32
MARGIN = 0.05  # the gap at which the float32 residual is told apart from vLLM's rounding
BF16_MARGIN = 0.1  # the float32 top-two gap from which bf16 engines must follow float32
INT8_MARGIN = 0.75  # INT8: see the module docstring


@pytest.fixture(scope="module")
def reference(default_model):
    """Prompts, and the float32 model's greedy tokens and top-two margins."""
    from vllm_x86.tools.conformance.tiny import one_thread

    prompts = prompt_ids(str(default_model))
    # one thread: the suite's other worker holds the other core, and two threads then
    # wait on each other (3 prompts: 33-59 s on two threads, 5.8 s on one, 2-core VM)
    with one_thread():
        ref = Reference(str(default_model))
        greedy = [ref.greedy(ids, NEW_TOKENS) for ids in prompts]
    return prompts, [g[0] for g in greedy], [g[1] for g in greedy]


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
    return results.run(cmd, env=clean_env(**env), timeout=900)


# The plugin's engines one after another in one fresh process: one Python + vLLM import
# instead of five. Each engine still runs in its own engine-core process (and compiles
# there; it reads the plugin's settings from the environment as this process leaves it
# when the engine starts); stock vLLM needs a process of its own (the platform is chosen
# at import). bf16, the default, runs eager and compiled; fp32 and INT8 run eager only:
# their compiled engines cost a compile each (about 2 minutes of the suite); see
# docs/correctness.md for where compiled fp32 and quantized graphs are held. Last, bf16
# eager with vLLM's rounding (VLLM_X86_FP32_RESIDUAL=0) as "bfloat16-eager-bf16-residual".
_PLUGIN_RUNS = """
import gc, json, os, sys
RUNS = (("bfloat16", None, (True, False), ""), ("float32", None, (True,), ""),
        ("bfloat16", "x86_int8", (True,), ""), ("bfloat16", None, (True,), "0"))
from vllm import LLM, SamplingParams
from vllm.platforms import current_platform
model, prompts, new = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
out = {}
for dtype, quant, modes, fp32_residual in RUNS:
    if fp32_residual:
        os.environ["VLLM_X86_FP32_RESIDUAL"] = fp32_residual
    for eager in modes:
        kw = {"quantization": quant} if quant else {}
        llm = LLM(model, dtype=dtype, enforce_eager=eager, max_model_len=1024, seed=0, **kw)
        sp = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
        # one request at a time, as the transformers reference runs them
        outs = [llm.generate([{"prompt_token_ids": x}], sp, use_tqdm=False)[0] for x in prompts]
        name = ("int8" if quant else dtype) + ("-eager" if eager else "-compiled")
        name += "-bf16-residual" if fp32_residual == "0" else ""
        out[name] = {
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
    return results.run(
        [PYTHON, "-c", _PLUGIN_RUNS, str(default_model), json.dumps(prompts), str(NEW_TOKENS)],
        env=clean_env(),
        timeout=2400,
    )


def _follows(res: dict, reference, margin: float) -> list[str]:
    """Where the engine parts from the float32 greedy tokens before the first step whose
    float32 top-two margin is below `margin`."""
    _, want_all, margins_all = reference
    bad = []
    for i, question in enumerate(QUESTIONS):
        got, want, margins = res["token_ids"][i], want_all[i], margins_all[i]
        ok, diff, tie = agrees_until_tie(got, want, margins, margin)
        if not ok:
            bad.append(
                f"{question!r}: token {diff} is {got[diff]}, the float32 model's is "
                f"{want[diff]} (its two best {margins[diff]:.3f} apart; first gap below "
                f"{margin}: step {tie})"
            )
    return bad


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind,eager",
    [("bfloat16", True), ("bfloat16", False), ("float32", True), ("int8", True)],
    ids=["bfloat16-eager", "bfloat16-compiled", "float32-eager", "int8-eager"],
)
def test_plugin_greedy_follows_float32(plugin_runs, reference, kind, eager):
    res = plugin_runs[kind + ("-eager" if eager else "-compiled")]
    assert res["platform"] == "X86Platform"
    if kind == "float32":
        for i, question in enumerate(QUESTIONS):
            assert res["token_ids"][i] == reference[1][i], f"{question!r}: fp32 must match"
    if kind != "int8":  # the France answer's first token leads by 0.098 in float32
        assert res["texts"][0].startswith("The capital of France is Paris."), res["texts"][0]
    bad = _follows(res, reference, INT8_MARGIN if kind == "int8" else BF16_MARGIN)
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_bf16_without_fp32_residual_can_be_told_apart(plugin_runs, reference):
    """VLLM_X86_FP32_RESIDUAL=0 (vLLM's rounding: residual stream and logits in bf16)
    parts from the float32 model on these prompts before a float32 gap below MARGIN
    (0.05), where the default's eager engine does not (it would need 0.034 on the AMD
    EPYC VM and 0.041 on the AMX Xeon VM; vLLM's rounding needed 0.098 on the Xeon): the
    rule can fail."""
    res = plugin_runs["bfloat16-eager-bf16-residual"]
    assert res["platform"] == "X86Platform"
    assert _follows(res, reference, MARGIN)
    assert not _follows(plugin_runs["bfloat16-eager"], reference, MARGIN)


@pytest.mark.slow
def test_stock_vllm_eager_bf16_diverges(default_model, reference):
    """Stock vLLM CPU's rotary kernel answers the France question with the other tied
    token on the Xeon (AMX): docs/correctness.md. Pinned where it happens."""
    prompts, ref, _ = reference
    # stock needs one setting to start on this machine (see docs/correctness.md)
    res = run_vllm(
        default_model,
        "bfloat16",
        True,
        prompts[:1],
        VLLM_X86_DISABLE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
    )
    assert res["platform"] == "CpuPlatform"
    if res["token_ids"][0][:1] == ref[0][:1]:  # the answer's first token
        pytest.skip(
            "stock vLLM CPU's eager bf16 answers the France question as the float32 model "
            f"on this CPU ({res['texts'][0][:40]!r}): the divergence is the Xeon's (AMX)"
        )
    assert res["texts"][0].startswith("L'")
    assert res["token_ids"][0] != ref[0]
