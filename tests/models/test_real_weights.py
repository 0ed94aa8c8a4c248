"""Real weights: the catalog's models through vLLM with the plugin against transformers.

For each model of `vllm-x86 pull`'s catalog (smollm2-135m-instruct-q4_1,
qwen2.5-coder-0.5b-instruct-q4_k_m, qwen2.5-coder-1.5b-instruct-q4_k_m, gemma-3-270m-q4_k_m:
GGUF files dequantized to bf16),
pulled and converted as a user gets it: the same prompt token ids (a real prompt, through
the model's own tokenizer and chat template) go to vLLM and to transformers, fp32 and
bf16, eager; the verdict is the conformance suite's
(`vllm_x86.tools.conformance.check.parity_on_weights` -> `conformance.judge`, tolerances
documented in docs/supported_models.md): fp32 all greedy tokens equal and log-probs within
2e-3; bf16 tokens equal (up to a float32 near tie) and prompt log-probs within 4x
transformers' own bf16 error + 0.1. And the text says what the model should: the coder
writes a Python function, the base model continues the sentence.

Downloading (about 1.8 GB) and converting the three larger models costs minutes on 2
cores, so these tests carry the `real_weights` marker, which the default run deselects:
`make test-real-weights` runs them. Measured results: docs/real_weights.md.
"""

from __future__ import annotations

import pytest

NEW_TOKENS = 24

# model -> (chat question or plain text, whether it is a chat prompt)
PROMPTS = {
    "smollm2-135m-instruct-q4_1": ("What is the capital of France?", True),
    "qwen2.5-coder-0.5b-instruct-q4_k_m": (
        "Write a Python function is_prime(n). Reply with the code only.",
        True,
    ),
    "qwen2.5-coder-1.5b-instruct-q4_k_m": (
        "Write a Python function is_prime(n). Reply with the code only.",
        True,
    ),
    "gemma-3-270m-q4_k_m": ("The three primary colours of light are", False),
}

pytestmark = [pytest.mark.slow, pytest.mark.real_weights]


def prompt_ids(model_dir, text: str, chat: bool) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    if chat:
        return list(
            tok.apply_chat_template(
                [{"role": "user", "content": text}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        )
    return tok(text)["input_ids"]  # with the tokenizer's own BOS rule


def decode(model_dir, ids: list[int]) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir)).decode(ids, skip_special_tokens=True)


@pytest.fixture(scope="module", params=list(PROMPTS))
def run(request):
    """(name, model dir, prompt ids, prepared references, vLLM results, verdicts by mode);
    module scope: one pull and one vLLM run per model for all the tests below."""
    from vllm_x86.tools.conformance.check import parity_on_weights
    from vllm_x86.tools.models.pull import pull

    name = request.param
    model_dir = pull(name)
    ids = prompt_ids(model_dir, *PROMPTS[name])
    prep, results, verdicts = parity_on_weights(model_dir, ids, new_tokens=NEW_TOKENS)
    for mode, v in verdicts.items():  # the numbers docs/real_weights.md records
        print(f"\n{name} {mode}: ok={v.ok} {v.metrics} {v.reason}")
    return name, model_dir, ids, prep, results, verdicts


def test_converted_prompt_is_what_the_model_expects(run):
    name, model_dir, ids, *_ = run
    if name == "gemma-3-270m-q4_k_m":
        assert ids[0] == 2  # <bos>: the GGUF's add_bos_token, applied by the converter
    if name.startswith("qwen2.5-coder-"):
        assert ids[:1] == [151644]  # <|im_start|>, from the GGUF's chat template


@pytest.mark.parametrize("mode", ["fp32-eager", "bf16-eager"])
def test_vllm_matches_transformers_on_real_weights(run, mode):
    name, _, ids, prep, _, verdicts = run
    v = verdicts[mode]
    assert v.ok, f"{name} {mode}: {v.reason} ({v.metrics})"
    assert v.metrics["tokens_equal"] >= 16
    if mode == "fp32-eager":
        assert v.metrics["tokens_equal"] == NEW_TOKENS


def test_vllm_text_is_sensible(run):
    name, model_dir, _, prep, results, _ = run
    res = results[f"{prep.arch}:fp32-eager"]
    text = decode(model_dir, res["tokens"])
    print(f"\n{name} fp32-eager text: {text!r}")
    if name == "smollm2-135m-instruct-q4_1":
        assert "Paris" in text, text
    elif name.startswith("qwen2.5-coder-"):
        assert "def is_prime(n" in text, text
    else:  # a base model continues the sentence with words, not a repeated token
        words = text.split()
        assert len(words) >= 8 and len(set(words)) >= 6, text
        assert any(c in text.lower() for c in ("red", "green", "blue")), text
