"""Patch ``structured_output_request_checks`` (a monkey-patch; ledger.py).

The one place where the plugin checks a structured-output request (``structured_outputs``,
``response_format``) before vLLM accepts it: ``SamplingParams._validate_structured_outputs``
runs the plugin's checks (``CHECKS``), then vLLM's own. A check raises vLLM's
``VLLMValidationError``, which the OpenAI server answers with a 400 and its sentence, so
the request is refused before it costs a step.

``choice_spelled_by_vocabulary``, found by fuzzing (tests/e2e/test_fuzz.py; CI run of
2026-12-05): a ``choice`` holding a character that no sequence of the model's tokens
spells (SmolLM2's vocabulary has no token for U+0014, for one) compiles to a grammar
that, once the answer reaches that character, allows no token at all; the sampler then
picks a token the grammar rejects, the scheduler ends the request with an error, and the
client got a 500 Internal Server Error for its own input. The check splits each choice's
UTF-8 bytes into tokens of the vocabulary xgrammar uses for its masks (the same
``TokenizerInfo``), and refuses a choice that cannot be spelled, naming the first
character that cannot. Where xgrammar cannot describe the tokenizer (a tokenizer that is
not a Hugging Face one), the check does not apply and vLLM decides as before.
``regex_spelled_by_vocabulary`` does the same for a ``regex``, for the characters every
match must hold (literals outside alternatives and classes): one with a byte that no
token contains is refused. A dead end it does not see (a class or an alternative all of
whose characters are unwritable) still ends as before.

Upstream change that removes it: vLLM refusing an unspellable constraint at validation,
or answering a grammar dead end with a client error.
"""

from __future__ import annotations

import logging
import re
import weakref

from vllm_x86.runtime.patches.ledger import MARK

log = logging.getLogger(__name__)

# tokenizer -> (set of token byte strings, longest token in bytes); None where xgrammar
# cannot describe the tokenizer
_VOCAB: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_VOCAB_BY_ID: dict[int, tuple[frozenset[bytes], int] | None] = {}


def vocabulary(tokenizer) -> tuple[frozenset[bytes], int] | None:
    """The byte strings of the tokens xgrammar masks over, and the longest one's length."""
    try:
        cached = _VOCAB.get(tokenizer, False)
    except TypeError:  # not weak-referenceable
        cached = _VOCAB_BY_ID.get(id(tokenizer), False)
    if cached is not False:
        return cached
    try:
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(tokenizer)
        special = set(info.special_token_ids)
        tokens = frozenset(t for i, t in enumerate(info.decoded_vocab) if t and i not in special)
        found = (tokens, max((len(t) for t in tokens), default=0))
    except Exception as exc:  # a tokenizer xgrammar cannot describe
        log.debug("structured output checks: no vocabulary for %r: %s", tokenizer, exc)
        found = None
    try:
        _VOCAB[tokenizer] = found
    except TypeError:
        _VOCAB_BY_ID[id(tokenizer)] = found
    return found


def first_unspelled(text: str, tokens: frozenset[bytes], longest: int) -> int | None:
    """Index in ``text`` of the first character from which no split of its UTF-8 bytes
    into ``tokens`` goes on, or None when the whole text can be spelled."""
    data = text.encode("utf-8", "surrogatepass")
    reach = [False] * (len(data) + 1)
    reach[0] = True
    furthest = 0
    for start in range(len(data)):
        if not reach[start]:
            continue
        for end in range(start + 1, min(len(data), start + longest) + 1):
            if data[start:end] in tokens:
                reach[end] = True
                furthest = max(furthest, end)
    if reach[len(data)]:
        return None
    # the character holding byte `furthest` is the first one no split gets past
    return len(data[:furthest].decode("utf-8", "surrogatepass"))


def choice_spelled_by_vocabulary(params, tokenizer) -> None:
    """Refuse a ``choice`` that the model's tokens cannot spell (see the docstring)."""
    so = params.structured_outputs
    choices = getattr(so, "choice", None)
    if not choices or tokenizer is None or not isinstance(choices, list):
        return
    vocab = vocabulary(tokenizer)
    if vocab is None:
        return
    from vllm.exceptions import VLLMValidationError

    tokens, longest = vocab
    for n, choice in enumerate(choices):
        if not isinstance(choice, str) or not choice:
            continue
        at = first_unspelled(choice, tokens, longest)
        if at is not None:
            ch = choice[at]
            raise VLLMValidationError(
                f"structured_outputs.choice[{n}] holds the character U+{ord(ch):04X} "
                f"(position {at}), which no token of this model's vocabulary can write, "
                "so the model could never produce that choice: remove or replace it.",
                parameter="structured_outputs.choice",
            )


def mandatory_literals(pattern: str) -> list[str]:
    """The characters every match of `pattern` contains, as far as a plain walk of its
    parse finds them: literals in sequence, in groups and in repeats of at least one (not
    in alternatives, classes or case-insensitive patterns). Parsed by Python's regular
    expression parser; a pattern it cannot read gives none (vLLM's xgrammar judges it)."""
    try:
        import re._parser as sre_parse  # Python 3.11+
        from re._constants import LITERAL, MAX_REPEAT, MIN_REPEAT, SUBPATTERN
    except ImportError:
        return []
    try:
        parsed = sre_parse.parse(pattern)
    except Exception:
        return []
    if parsed.state.flags & re.IGNORECASE:
        return []
    found: list[str] = []

    def walk(items) -> None:
        for op, av in items:
            if op is LITERAL:
                found.append(chr(av))
            elif op is SUBPATTERN:
                walk(av[-1])
            elif op in (MAX_REPEAT, MIN_REPEAT) and av[0] >= 1:
                walk(av[2])

    walk(parsed)
    return found


def regex_spelled_by_vocabulary(params, tokenizer) -> None:
    """Refuse a ``regex`` that every match of which holds a character with a byte no
    token of the vocabulary contains: the grammar would reach a state that allows no
    token, as for an unspellable choice (see the docstring)."""
    pattern = getattr(params.structured_outputs, "regex", None)
    if not isinstance(pattern, str) or not pattern or tokenizer is None:
        return
    vocab = vocabulary(tokenizer)
    if vocab is None:
        return
    known = _BYTES.get(id(vocab[0]))
    if known is None:
        known = frozenset(b for t in vocab[0] for b in t)
        _BYTES.clear()
        _BYTES[id(vocab[0])] = known
    for ch in mandatory_literals(pattern):
        if any(b not in known for b in ch.encode("utf-8", "surrogatepass")):
            from vllm.exceptions import VLLMValidationError

            raise VLLMValidationError(
                f"structured_outputs.regex requires the character U+{ord(ch):04X}, which "
                "no token of this model's vocabulary can write, so no answer could match "
                "it: remove or replace it.",
                parameter="structured_outputs.regex",
            )


# id of a vocabulary's token set -> the bytes its tokens contain
_BYTES: dict[int, frozenset[int]] = {}

_SPELLING: dict[int, object] = {}


def spelling(tokenizer):
    """A ``Spelling`` (fewest tokens for some bytes) of the tokenizer's vocabulary, or
    None where xgrammar cannot describe it."""
    vocab = vocabulary(tokenizer)
    if vocab is None:
        return None
    found = _SPELLING.get(id(vocab[0]))
    if found is None:
        from vllm_x86.runtime.structured.json_budget import Spelling

        found = _SPELLING[id(vocab[0])] = Spelling(dict.fromkeys(vocab[0], 0))
    return found


def smallest_json_budget(schema, tokenizer) -> tuple[int, bytes] | None:
    """(the smallest max_tokens a JSON answer to ``schema`` fits in: the tokens of its
    shortest valid instance, compact, plus one for the end-of-sequence token; that
    instance), or None where the schema or the tokenizer is not one this can bound."""
    from vllm_x86.runtime.structured.json_budget import Schema, Unsupported

    spell = spelling(tokenizer)
    if spell is None:
        return None
    try:
        parsed = Schema(schema)
        shortest = parsed.shortest(parsed.root)
    except (Unsupported, ValueError, TypeError, KeyError, IndexError, RecursionError):
        return None
    count = spell.count(shortest)
    return None if count is None else (count + 1, shortest)


def json_budget_suffices(params, tokenizer) -> None:
    """Refuse a JSON-schema request whose max_tokens cannot hold even the shortest valid
    instance of its schema (runtime/patches/json_budget.py keeps the answer within a
    budget that can); the 400 names the smallest max_tokens that works."""
    from vllm_x86.runtime.patches import json_budget

    so = params.structured_outputs
    max_tokens = getattr(params, "max_tokens", None)
    if max_tokens is None or tokenizer is None or not json_budget.enabled():
        return
    schema = getattr(so, "json", None)
    if schema is None and getattr(so, "json_object", None):
        schema = {"type": "object"}
    if schema is None:
        return
    found = smallest_json_budget(schema, tokenizer)
    if found is None or max_tokens >= found[0]:
        return
    from vllm.exceptions import VLLMValidationError

    smallest, shortest = found
    raise VLLMValidationError(
        f"max_tokens={max_tokens} is too small for a JSON answer to this schema: its "
        f"shortest valid instance, {shortest.decode('utf-8', 'replace')}, takes "
        f"{smallest - 1} tokens and the end-of-sequence token one more; set max_tokens "
        f"to at least {smallest}.",
        parameter="max_tokens",
        value=max_tokens,
    )


# run in order before vLLM's own validation; each takes (sampling params, tokenizer)
CHECKS = [choice_spelled_by_vocabulary, regex_spelled_by_vocabulary, json_budget_suffices]


def apply() -> None:
    """Install the checks (idempotent; see the module docstring)."""
    from vllm.sampling_params import SamplingParams

    original = SamplingParams._validate_structured_outputs
    if getattr(original, MARK, False):
        return

    def _validate_structured_outputs(self, model_config, structured_outputs_config, tokenizer):
        if structured_outputs_config is not None and self.structured_outputs is not None:
            for check in CHECKS:
                check(self, tokenizer)
        return original(self, model_config, structured_outputs_config, tokenizer)

    setattr(_validate_structured_outputs, MARK, True)
    _validate_structured_outputs.__wrapped__ = original
    SamplingParams._validate_structured_outputs = _validate_structured_outputs
