"""JSON answers kept within max_tokens: the shortest instance of a schema, the shortest
completion of a partial answer (runtime/structured/json_budget.py), the front-end check
(patches/structured_output.json_budget_suffices) and the mask narrowing
(patches/json_budget.Tracker) driven with xgrammar's own matcher and an adversarial
"model" that runs on inside strings and whitespace for as long as it is allowed."""

from __future__ import annotations

import json
import random

import pytest

from vllm_x86.runtime.structured.json_budget import Schema, Spelling, Unsupported

STORY = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "story": {"type": "string"}},
    "required": ["title", "story"],
}


def complete(schema, text: bytes) -> bytes | None:
    s = Schema(schema)
    state = s.feed(s.start(), text)
    assert state, f"the parser refused {text!r}"
    return s.completion(state)


@pytest.mark.parametrize(
    "schema, shortest",
    [
        (STORY, b'{"title":"","story":""}'),
        ({"type": "object", "properties": {"a": {"type": "integer"}}}, b"{}"),
        ({"type": "integer", "minimum": 5, "maximum": 9}, b"5"),
        ({"type": "integer", "minimum": -50, "maximum": -1}, b"-1"),
        ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, b"0.5"),
        ({"type": "array", "items": {"type": "boolean"}, "minItems": 2}, b"[true,true]"),
        ({"enum": ["red", "green", 7]}, b"7"),
        ({"type": "string", "format": "date"}, b'"2000-01-01"'),
        ({"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}, b'"AAA-00"'),
        ({"type": "string", "minLength": 3}, b'"aaa"'),
        ({"anyOf": [{"type": "object", "required": ["x"]}, {"type": "null"}]}, b"null"),
        (
            {
                "$defs": {"p": {"type": "object", "properties": {"n": {"type": "string"}},
                                "required": ["n"]}},
                "type": "array", "items": {"$ref": "#/$defs/p"}, "minItems": 1,
            },
            b'[{"n":""}]',
        ),
    ],
)  # fmt: skip
def test_shortest_instance(schema, shortest):
    s = Schema(schema)
    assert s.shortest(s.root) == shortest


@pytest.mark.parametrize(
    "text, rest",
    [
        (b"", b'{"title":"","story":""}'),
        (b'{\n  "title": "Once upon', b'","story":""}'),
        (b'{"title":"A","st', b'ory":""}'),
        (b'{"title":"A","story":"x\\', b'n"}'),  # an escape begun
        (b'{"title":"A","story":"x\\u00', b'00"}'),
        (b'{"title":"A","story":"\xe6\x97', b'\x80"}'),  # a UTF-8 character begun
        (b'{"title":"A","story":"done"', b"}"),
        (b'{"title":"A","story":"done"}', b""),
    ],
)
def test_completion_of_a_free_text_answer(text, rest):
    assert complete(STORY, text) == rest


def test_completion_fills_what_the_schema_still_requires():
    recipe = {
        "type": "object",
        "properties": {
            "steps": {"type": "array", "items": {"type": "string"}, "minItems": 2},
            "rating": {"type": "integer", "minimum": 1, "maximum": 5},
            "tag": {"enum": ["easy", "hard"]},
        },
        "required": ["steps", "rating", "tag"],
    }
    assert complete(recipe, b'{"steps":["boil the') == b'",""],"rating":1,"tag":"easy"}'
    assert complete(recipe, b'{"steps":["a","b","c"') == b'],"rating":1,"tag":"easy"}'
    assert complete(recipe, b'{"steps":["a","b"],"rating":') == b'1,"tag":"easy"}'
    assert complete(recipe, b'{"steps":["a","b"],"rating":4,"tag":"h') == b'ard"}'
    date = {"type": "object", "properties": {"d": {"type": "string", "format": "date"}},
            "required": ["d"]}  # fmt: skip
    assert complete(date, b'{"d":"1969-0') == b'1-01"}'
    neg = {"type": "integer", "minimum": -50, "maximum": -1}
    assert complete(neg, b"-") == b"1"


def test_the_parser_refuses_what_the_schema_does_not_allow():
    s = Schema(STORY)
    assert not s.feed(s.start(), b'{"story":')  # xgrammar keeps the schema's order
    assert not s.feed(s.start(), b'{"title":"a","story":"b","x"')  # no extra property
    assert not s.feed(s.start(), b'{"title":"a"}')  # story is required
    assert s.feed(s.start(), b'{ "title" : "a" , "story" : "b" }')
    with pytest.raises(Unsupported):
        Schema({"type": "string", "format": "no-such-format"}).shortest(
            {"type": "string", "format": "no-such-format"}
        )


def test_free_and_recursive_schemas_end():
    """Schemas that allow anything, or contain themselves, have a shortest instance and
    a bound (an engine step once looped on ``{"type": "object"}``)."""
    tree = {
        "$defs": {"n": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
            "next": {"$ref": "#/$defs/n"}}, "required": ["next"]}]}},
        "$ref": "#/$defs/n",
    }  # fmt: skip
    for schema, shortest in (
        ({"type": "object"}, b"{}"),
        ({"type": "object", "additionalProperties": True}, b"{}"),
        (tree, b"null"),
    ):
        s = Schema(schema)
        assert s.shortest(s.root) == shortest
        assert 0 < s.growth() < 64
    s = Schema(tree)
    assert s.completion(s.feed(s.start(), b'{"next":{"next":')) == b"null}}"
    s = Schema({"type": "object"})
    assert s.completion(s.feed(s.start(), b'{"a":[1,{"b":')) == b"0}]}"


def test_spelling_counts_the_fewest_tokens():
    sp = Spelling({b"{": 1, b'"': 2, b'{"': 3, b"a": 4, b'":"': 5, b"}": 6})
    assert sp.count(b'{"a":"') == 3  # '{"' 'a' '":"'
    assert sp.first_token(b'{"a') == 3
    assert sp.count(b"") == 0
    assert sp.count(b"z") is None


# ------------------------------------------------------------ with the model's vocabulary
@pytest.fixture(scope="module")
def tokenizer(default_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model)


@pytest.fixture(scope="module")
def xgrammar_parts(tokenizer):
    xgr = pytest.importorskip("xgrammar")
    info = xgr.TokenizerInfo.from_huggingface(tokenizer)
    return xgr, info, xgr.GrammarCompiler(info)


def test_front_end_refuses_a_budget_below_the_shortest_instance(tokenizer, monkeypatch):
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams

    from vllm_x86.runtime.patches import structured_output as so

    smallest, shortest = so.smallest_json_budget(STORY, tokenizer)
    assert shortest == b'{"title":"","story":""}'
    # the fewest tokens that spell it (at most what the tokenizer's own split takes),
    # plus the end-of-sequence token
    assert 3 <= smallest - 1 <= len(tokenizer.encode(shortest.decode(), add_special_tokens=False))

    def params(max_tokens, **structured):
        return SamplingParams(
            max_tokens=max_tokens, structured_outputs=StructuredOutputsParams(**structured)
        )

    with pytest.raises(VLLMValidationError, match=f"set max_tokens to at least {smallest}"):
        so.json_budget_suffices(params(smallest - 1, json=STORY), tokenizer)
    so.json_budget_suffices(params(smallest, json=STORY), tokenizer)
    # a schema given as a string is read the same
    with pytest.raises(VLLMValidationError, match="at least"):
        so.json_budget_suffices(params(smallest - 1, json=json.dumps(STORY)), tokenizer)
    with pytest.raises(VLLMValidationError, match="at least 2"):  # "{}" and the end
        so.json_budget_suffices(params(1, json_object=True), tokenizer)
    monkeypatch.setenv("VLLM_X86_JSON_BUDGET", "0")
    so.json_budget_suffices(params(1, json=STORY), tokenizer)  # the switch turns it off
    assert so.json_budget_suffices in so.CHECKS


SIM_SCHEMAS = [
    STORY,
    {"type": "object", "properties": {"animals": {"type": "array", "items": {"type": "string"},
                                                   "minItems": 2}}, "required": ["animals"]},
    {"type": "object", "properties": {
        "review": {"type": "string"},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "when": {"type": "string", "format": "date"},
        "tags": {"type": "array", "items": {"enum": ["a", "bb"]}, "minItems": 1}},
     "required": ["review", "rating", "when", "tags"]},
    {"type": "object", "additionalProperties": {"type": "integer"}},
]  # fmt: skip


# slow: every budget from the smallest up, through xgrammar's matcher (about a minute)
@pytest.mark.slow
@pytest.mark.parametrize("n", range(len(SIM_SCHEMAS)))
def test_narrowed_masks_always_end_in_valid_json(n, tokenizer, xgrammar_parts):
    """Each budget from the smallest that works up: an adversary that picks ordinary
    string content or whitespace whenever the mask allows it (never the end token by
    choice) still ends with JSON that parses and validates, within the budget."""
    import jsonschema
    import numpy as np

    from vllm_x86.runtime.patches.json_budget import Tracker, Vocab
    from vllm_x86.runtime.patches.structured_output import smallest_json_budget

    xgr, info, compiler = xgrammar_parts
    schema = SIM_SCHEMAS[n]
    vocab = Vocab(info.decoded_vocab, info.stop_token_ids, info.vocab_size)
    ctx = compiler.compile_json_schema(json.dumps(schema), any_whitespace=True)
    smallest, _ = smallest_json_budget(schema, tokenizer)
    rng = random.Random(n)
    for budget in (smallest, smallest + 1, smallest + 7, 48):
        matcher, tracker = xgr.GrammarMatcher(ctx), Tracker(json.dumps(schema), vocab)
        mask = xgr.allocate_token_bitmask(1, info.vocab_size)
        out: list[int] = []
        while len(out) < budget and not matcher.is_terminated():
            matcher.fill_next_token_bitmask(mask)
            row = mask[0].numpy()
            tracker.follow(out)
            assert tracker.restrict(row, budget - len(out), matcher) is None
            bits = np.unpackbits(row.view(np.uint8), bitorder="little")[: info.vocab_size]
            allowed = np.flatnonzero(bits)
            other = allowed[~np.isin(allowed, list(vocab.stop))]
            if len(other):
                runaway = other[vocab.plain[other] | vocab.space[other]]
                t = int(rng.choice(runaway if len(runaway) and rng.random() < 0.9 else other))
            else:
                t = int(allowed[0])
            assert matcher.accept_token(t)
            out.append(t)
        text = b"".join(info.decoded_vocab[t] for t in out if t not in vocab.stop)
        jsonschema.validate(json.loads(text), schema)
        assert len(out) <= budget


def test_ordinary_content_is_decided_together_only_where_it_is_free():
    """Inside a free string (also after a whole multi-byte character) and inside a key
    that only additionalProperties can take, content tokens are decided together;
    inside a pattern string, a half-written character or a key that may still become a
    defined property, each token is tried on its own."""
    from vllm_x86.runtime.patches.json_budget import _free_text

    def free(schema, text: bytes) -> bool:
        s = Schema(schema)
        return _free_text(s, s.feed(s.start(), text))

    string = {"type": "string"}
    assert free(string, '"é'.encode())
    assert not free(string, '"é'.encode()[:-1])
    assert not free(string, b'"a\\')
    assert not free({"type": "string", "pattern": "^[0-9]+$"}, b'"1')
    named = {"type": "object", "properties": {"name": {"type": "string"}},
             "additionalProperties": True}  # fmt: skip
    assert free({"type": "object"}, b'{"ab')
    assert free(named, b'{"x')
    assert not free(named, b'{"na')
