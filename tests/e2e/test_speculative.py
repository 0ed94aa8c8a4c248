"""`vllm-x86 serve --speculative ngram` (docs/speculative.md): the server starts, says
what it chose, answers, its greedy text is the text of the same server without
speculation (the session's `openai_server`: the default model, eager, the same context
length), and vLLM's spec-decode counters show that drafts were made and accepted."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.e2e.conftest import MAX_LEN, ServeProcess

pytestmark = pytest.mark.slow

# Prompts that repeat themselves, so n-gram drafts come from the prompt and are accepted,
# and whose greedy answers have no near tie: the top two log-probabilities of every token
# of the answer differ by 0.37 or more, with and without speculation. (Where they differ
# by one bf16 rounding step, about 0.1, the verification of several tokens at once can
# pick the other one: docs/speculative.md.)
PROMPTS = [
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22",
    "a b c d e f g h i j k l m n o p a b c d e f g h i j k l m n o p a b c d",
]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def spec_server(default_model, tmp_path_factory):
    srv = ServeProcess(
        default_model.name,
        ["--enforce-eager", "--max-model-len", str(MAX_LEN), "--speculative", "ngram"],
        tmp_path_factory.mktemp("spec_server") / "server.log",
    )
    srv.model = default_model.name
    try:
        yield srv
    finally:
        srv.stop()


def _complete(srv, prompt: str) -> str:
    r = httpx.post(
        f"{srv.base}/v1/completions",
        json={"model": srv.model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def _spec_counter(srv, name: str) -> float:
    text = httpx.get(f"{srv.base}/metrics", timeout=10).text
    values = re.findall(rf"^vllm:spec_decode_{name}_total\{{[^}}]*\}} (\S+)$", text, re.M)
    assert values, f"no vllm:spec_decode_{name}_total in /metrics"
    return sum(float(v) for v in values)


def test_ngram_greedy_text_equals_without_speculation(spec_server, openai_server):
    log = spec_server.log()
    assert "vllm-x86: speculative decoding on (--speculative ngram)" in log
    assert "method='ngram'" in log  # vLLM's engine config took it
    accepted_before = _spec_counter(spec_server, "num_accepted_tokens")
    for prompt in PROMPTS:
        with_spec = _complete(spec_server, prompt)
        without = _complete(openai_server, prompt)
        assert with_spec.strip(), "an empty answer"
        assert with_spec == without
    assert _spec_counter(spec_server, "num_drafts") > 0
    assert _spec_counter(spec_server, "num_accepted_tokens") > accepted_before


def test_chat_answers_with_speculation(spec_server):
    r = httpx.post(
        f"{spec_server.base}/v1/chat/completions",
        json={
            "model": spec_server.model,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 16,
            "temperature": 0,
        },
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert "Paris" in r.json()["choices"][0]["message"]["content"]
