"""JSON answers kept within max_tokens, through the real server and the default model
(runtime/patches/json_budget.py, docs/structured_output.md): a long free-text field at a
small max_tokens still ends as JSON that parses and validates; a max_tokens below the
smallest that works is a 400 naming it, and that smallest works; with
VLLM_X86_JSON_BUDGET=0 the server behaves as vLLM does (the answer is cut)."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.conftest import clean_env
from tests.e2e.conftest import MAX_LEN, ServeProcess

pytestmark = pytest.mark.slow

STORY = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "story": {"type": "string"}},
    "required": ["title", "story"],
}
LIST = {
    "type": "object",
    "properties": {
        "animals": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        "count": {"type": "integer", "minimum": 1},
    },
    "required": ["animals", "count"],
}
PROMPT = "Write a very long story about a dragon who learns to sing, as JSON."


@pytest.fixture(scope="module")
def budget_off_server(default_model, tmp_path_factory):
    srv = ServeProcess(
        default_model.name,
        ["--enforce-eager", "--max-model-len", str(MAX_LEN)],
        tmp_path_factory.mktemp("json_budget_off") / "server.log",
        env=clean_env(VLLM_X86_JSON_BUDGET="0"),
    )
    srv.model = default_model.name
    try:
        yield srv
    finally:
        srv.stop()


def chat(srv, schema, max_tokens, api="response_format", prompt=PROMPT):
    body = {
        "model": srv.model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    if api == "response_format":
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": schema},
        }
    else:
        body["structured_outputs"] = {"json": schema}
    return httpx.post(f"{srv.base}/v1/chat/completions", json=body, timeout=300)


@pytest.mark.parametrize(
    "schema, api, max_tokens",
    [
        (STORY, "response_format", 16),
        (LIST, "structured_outputs", 24),
        (STORY, "response_format", 150),
    ],
)
def test_json_within_a_small_budget_parses_and_validates(openai_server, schema, api, max_tokens):
    import jsonschema

    r = chat(openai_server, schema, max_tokens, api, prompt=PROMPT if schema is STORY else
             "List as many animals as you can, as JSON.")  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    content = body["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(content), schema)
    assert body["usage"]["completion_tokens"] <= max_tokens
    assert body["choices"][0]["finish_reason"] == "stop", content


def test_budget_below_the_smallest_is_a_400_naming_it(openai_server):
    import jsonschema

    r = chat(openai_server, STORY, 3)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    found = re.search(r"max_tokens=3 is too small .* set max_tokens to at least (\d+)", message)
    assert found, message
    smallest = int(found.group(1))
    assert 4 <= smallest <= 12
    ok = chat(openai_server, STORY, smallest)
    assert ok.status_code == 200, ok.text
    content = ok.json()["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(content), STORY)
    assert ok.json()["usage"]["completion_tokens"] <= smallest
    assert chat(openai_server, STORY, smallest - 1, "structured_outputs").status_code == 400


def test_switch_off_gives_vllms_cut_json(budget_off_server):
    # 16 tokens: the model is still inside "story" (the plugin closes it: the first test)
    r = chat(budget_off_server, STORY, 16)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(choice["message"]["content"])
    assert chat(budget_off_server, STORY, 3).status_code == 200  # no front-end refusal
