"""The plugin's structured-output request checks (runtime/patches/structured_output.py):
a choice the model's tokens cannot spell is refused with vLLM's validation error (a 400
in the server; tests/e2e/test_robustness.py sends one over HTTP)."""

from __future__ import annotations

import pytest

from vllm_x86.runtime.patches import structured_output as so


def test_first_unspelled_finds_the_character_no_split_passes():
    tokens = frozenset({b"a", b"b", b"ab", b"\xc3\xa9", b"@"})
    assert so.first_unspelled("abba", tokens, 2) is None
    assert so.first_unspelled("aé", tokens, 2) is None  # two bytes, one token
    assert so.first_unspelled("@\x14a", tokens, 2) == 1
    assert so.first_unspelled("ab\x14", tokens, 2) == 2
    assert so.first_unspelled("\x14", tokens, 2) == 0
    # a split that needs the longer token to get past a byte
    assert so.first_unspelled("ab", frozenset({b"ab"}), 2) is None
    assert so.first_unspelled("abc", frozenset({b"ab", b"bc"}), 2) == 2


@pytest.fixture(scope="module")
def tokenizer(default_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model)


def params(**structured):
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams

    return SamplingParams(structured_outputs=StructuredOutputsParams(**structured))


def test_choice_the_vocabulary_cannot_spell_is_refused(tokenizer):
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match=r"choice\[1\] holds the character U\+0014"):
        so.choice_spelled_by_vocabulary(params(choice=["yes", "@\x14x"]), tokenizer)
    # every ordinary choice passes, accents, CJK and emoji included
    so.choice_spelled_by_vocabulary(params(choice=["yes", "no", "héllo 日本 🙂"]), tokenizer)
    # not a choice request: nothing to check
    so.choice_spelled_by_vocabulary(params(regex="[a-z]+"), tokenizer)


def test_the_check_runs_inside_vllms_validation(tokenizer):
    """apply() wraps SamplingParams._validate_structured_outputs; vLLM's own checks
    still run after the plugin's."""
    from types import SimpleNamespace

    from vllm.config import StructuredOutputsConfig
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    so.apply()
    model, config = SimpleNamespace(is_diffusion=False), StructuredOutputsConfig()
    assert getattr(SamplingParams._validate_structured_outputs, "_vllm_x86_patched", False)
    p = params(choice=["\x14"])
    with pytest.raises(VLLMValidationError, match="U\\+0014"):
        p._validate_structured_outputs(model, config, tokenizer)
    with pytest.raises(VLLMValidationError, match="cannot be an empty list"):
        params(choice=[])._validate_structured_outputs(model, config, tokenizer)


def test_mandatory_literals_of_a_regex():
    assert so.mandatory_literals("@\x14x") == ["@", "\x14", "x"]
    assert so.mandatory_literals("(ab)+c{2}") == ["a", "b", "c"]
    assert so.mandatory_literals("\\d+\\x14") == ["\x14"]  # the escape, as xgrammar reads it
    # not required by every match, or not read: nothing
    for pattern in ("a|\x14", "[\x14a]", "(\x14)?", "\x14*", "(?i)\x14", "(("):
        assert so.mandatory_literals(pattern) == [], pattern


def test_regex_the_vocabulary_cannot_write_is_refused(tokenizer):
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match=r"regex requires the character U\+0014"):
        so.regex_spelled_by_vocabulary(params(regex="[0-9]+\x14"), tokenizer)
    # ordinary patterns, and an unwritable character that a match can avoid, pass
    for pattern in ("[0-9]{3}-[a-z]+", "héllo 日本", "a|\x14", "[\x14a]"):
        so.regex_spelled_by_vocabulary(params(regex=pattern), tokenizer)
