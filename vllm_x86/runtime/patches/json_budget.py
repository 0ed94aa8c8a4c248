"""Patch ``json_budget`` (a monkey-patch; ledger.py): JSON answers that fit max_tokens.

vLLM constrains a ``json_schema`` request (``response_format`` or
``structured_outputs.json``) token by token with xgrammar, but knows nothing of the
token budget: a model that runs on inside a string (or an array, or whitespace) is cut
at ``max_tokens`` and the client gets JSON that does not parse. This hook wraps
``StructuredOutputManager.grammar_bitmask`` (the engine's per-step fill of the grammar
masks). For each JSON request it follows the answer so far with the schema-aware
partial parser of runtime/structured/json_budget.py and knows the fewest tokens
(``need``) that close it into a valid instance: close the current string, the shortest
value of each required property still missing, minItems, the closing brackets. While
the budget left (max_tokens minus tokens generated, and what max_model_len leaves) is
larger than ``need`` + 1 (the end-of-sequence token) by more than what one token can
add, nothing changes. Near the end, the hook keeps in the grammar's mask only the
tokens after which the answer can still be closed in time, leaving room for the
end-of-sequence token: the model keeps writing its own text (inside a string every
ordinary token stays allowed) until the budget says close, then writes the shortest
completion, token by token, and stops. Each completion is first checked with a fork of
the request's xgrammar matcher; where it is not accepted, or where the parser cannot
follow the answer (runtime/structured/json_budget.py lists what it does not cover), the
hook leaves vLLM's mask as it is for that request and logs a warning: the answer may
then be cut as before, never made invalid by the hook.

The front-end half is ``structured_output.json_budget_suffices``: a request whose
max_tokens cannot hold even the shortest valid instance is refused with a 400 that
names the smallest max_tokens that works.

Timing: vLLM defers sampling for a structured-output request until its previous token
is accepted (engine core, ``pending_structured_output_tokens``), so when the mask is
filled the grammar and ``request.num_output_tokens`` count every token so far; the
hook does not apply with speculative decoding or a reasoning parser (the grammar does
not start at the first output token there), and only with the xgrammar backend.

Switch: VLLM_X86_JSON_BUDGET=0 gives vLLM's own behaviour (the front-end check stays).
Upstream change that removes it: vLLM (or xgrammar) making grammar masks aware of the
token budget.
"""

from __future__ import annotations

import json
import logging

import numpy as np

from vllm_x86.runtime import envs
from vllm_x86.runtime.patches.ledger import MARK
from vllm_x86.runtime.structured.json_budget import (
    WS,
    Schema,
    Spelling,
    Unsupported,
    finish_raw,
)

log = logging.getLogger(__name__)

_ATTR = "_vllm_x86_json_budget"
# at most this many tokens of a mask are tried one by one in a step (the others: ordinary
# string content and whitespace, are decided together)
MAX_PROBES = 4096


def enabled() -> bool:
    return envs.get_bool("VLLM_X86_JSON_BUDGET")


class Vocab:
    """What the hook needs of the grammar's vocabulary, built once per tokenizer."""

    def __init__(self, decoded: list[bytes], stop_ids, vocab_size: int):
        self.decoded = decoded
        self.stop = frozenset(int(i) for i in stop_ids)
        tokens: dict[bytes, int] = {}
        plain = np.zeros(vocab_size, dtype=bool)
        space = np.zeros(vocab_size, dtype=bool)
        for i, t in enumerate(decoded[:vocab_size]):
            if not t or i in self.stop:
                continue
            tokens.setdefault(t, i)
            if all(c in WS for c in t):
                space[i] = True
            if b'"' not in t and b"\\" not in t and min(t) >= 0x20:
                try:
                    t.decode("utf-8")
                    plain[i] = True
                except UnicodeDecodeError:
                    pass
        self.spelling = Spelling(tokens)
        self.plain = plain  # ordinary string content: never changes what closing needs
        self.space = space  # whitespace: changes nothing between JSON tokens


def _free_text(schema: Schema, state: tuple) -> bool:
    """One alternative, inside a string value with no pattern/format, or inside an
    object key where only a key of additionalProperties can follow, with no escape or
    UTF-8 character open: ordinary content tokens do not make its completion longer."""
    if len(state) != 1 or not state[0]:
        return False
    f = state[0][-1]
    if f[0] == "S":
        s, raw = f[1], f[2]
        return "pattern" not in s and "format" not in s and finish_raw(raw) == b""
    if f[0] == "O" and f[3] == "key":
        s, keys, kb = f[1], f[2], f[4]
        nexts, extra = schema.allowed_keys(s, keys)
        if not extra or finish_raw(kb) != b"":
            return False
        return not any(json.dumps(k, ensure_ascii=False)[1:].encode().startswith(kb) for k in nexts)
    return False


def _between_tokens(state: tuple) -> bool:
    if not state or not all(state):
        return False
    return all(
        st[-1][0] in ("V", "O", "A") and st[-1][3 if st[-1][0] != "V" else 0] != "key"
        for st in state
    )


class Tracker:
    """One JSON request: the parser state of its answer so far."""

    def __init__(self, schema_text: str, vocab: Vocab):
        self.vocab = vocab
        self.schema = Schema(schema_text)
        self.state = self.schema.start()
        self.fed = 0
        self.tail = b""  # the answer's last bytes, for the warning
        self.late = False  # warned that the answer cannot close in time
        self.off: str | None = None
        self.window = 4 + 2 * self.schema.growth()

    def follow(self, token_ids) -> None:
        if self.off:
            return
        for t in token_ids[self.fed :]:
            self.fed += 1
            if t in self.vocab.stop:
                continue
            self.tail = (self.tail + self.vocab.decoded[t])[-80:]
            self.state = self.schema.feed(self.state, self.vocab.decoded[t])
            if not self.state:
                self.off = "the answer left what the parser follows"
                return

    def need(self, state) -> int | None:
        text = self.schema.completion(state, self.vocab.spelling)
        return None if text is None else self.vocab.spelling.count(text)

    def restrict(self, row: np.ndarray, remaining: int, matcher) -> str | None:
        """Narrow one bitmask row (int32 words, token i allowed when bit i is set) to
        the tokens after which the answer still closes within ``remaining`` tokens (this
        one included). Returns why it gave up, or None."""
        if self.off:
            return self.off
        spelling = self.vocab.spelling
        text = self.schema.completion(self.state, spelling)
        if text is None:
            self.off = "no completion of the answer so far"
            return self.off
        need = spelling.count(text)
        if need is None:
            self.off = "the completion cannot be spelled"
            return self.off
        if remaining > need + 1 + self.window:
            return None
        probe = matcher.fork()
        if text and not (probe.accept_string(text) and probe.is_completed()):
            self.off = f"the grammar refuses the completion {text[:80]!r}"
            return self.off
        bits = np.unpackbits(row.view(np.uint8), bitorder="little")
        allowed = np.flatnonzero(bits[: len(self.vocab.decoded)])
        after = remaining - 1  # tokens left once this one is written
        keep: list[int] = []
        tight: list[int] = []  # close the JSON in time, but leave no room for EOS
        neutral = None
        if _free_text(self.schema, self.state):
            neutral = self.vocab.plain
        elif _between_tokens(self.state):
            neutral = self.vocab.space
        if neutral is not None:
            mask = neutral[allowed]
            if need + 1 <= after:
                keep.extend(allowed[mask].tolist())
            elif need <= after:
                tight.extend(allowed[mask].tolist())
            allowed = allowed[~mask]
        if len(allowed) > MAX_PROBES:
            # too many to try one by one (not seen with the schemas tested): close now
            allowed = allowed[:0]
        for t in allowed.tolist():
            if t in self.vocab.stop:
                if need == 0:
                    keep.append(t)
                continue
            state = self.schema.feed(self.state, self.vocab.decoded[t])
            if not state:
                continue
            try:
                n = self.need(state)
            except Unsupported:
                n = None
            if n is None:
                continue
            if n + 1 <= after:
                keep.append(t)
            elif n <= after:
                tight.append(t)
        chosen = keep or tight
        if not chosen:
            # nothing closes in time (a completion found longer than the shortest, e.g.
            # for a pattern): write the completion anyway, and say so once
            first = spelling.first_token(text) if text else None
            if first is None or not bits[first]:
                return "no token closes the answer in time"
            chosen = [first]
            if need > after and not self.late:
                self.late = True
                log.warning(
                    "JSON budget: the answer needs %d more tokens to close and %d are left; "
                    "it may be cut at max_tokens (the answer ends %r).",
                    need,
                    after,
                    self.tail,
                )
        new = np.zeros_like(bits)
        new[chosen] = 1
        row[:] = np.packbits(new, bitorder="little").view(row.dtype)[: row.shape[0]]
        return None


def _json_schema(request) -> str | None:
    so = request.structured_output_request
    if so is None:
        return None
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions

    kind, spec = so.structured_output_key
    if kind == StructuredOutputOptions.JSON:
        return spec
    if kind == StructuredOutputOptions.JSON_OBJECT:
        return '{"type": "object"}'
    return None


def _vocab(manager, grammar) -> Vocab:
    backend = manager.backend
    vocab = getattr(backend, _ATTR, None)
    if vocab is None:
        info = grammar.ctx.tokenizer_info
        vocab = Vocab(info.decoded_vocab, info.stop_token_ids, grammar.vocab_size)
        setattr(backend, _ATTR, vocab)
    return vocab


def narrow(manager, requests, request_ids, result) -> None:
    """Apply the budget to the rows vLLM filled (one per request: no speculative
    decoding, checked by the caller)."""
    from vllm.v1.structured_output.backend_xgrammar import XgrammarGrammar

    max_model_len = manager.vllm_config.model_config.max_model_len
    for row, req_id in enumerate(request_ids):
        request = requests[req_id]
        schema = _json_schema(request)
        if schema is None:
            continue
        so = request.structured_output_request
        grammar = so.grammar
        if not isinstance(grammar, XgrammarGrammar) or grammar.is_terminated():
            continue
        tracker = getattr(so, _ATTR, None)
        if tracker is None:
            try:
                tracker = Tracker(schema, _vocab(manager, grammar))
            except Exception as exc:  # a schema the parser does not read
                tracker = Tracker('{"not": {}}', _vocab(manager, grammar))
                tracker.off = f"schema not followed: {exc}"
            setattr(so, _ATTR, tracker)
        if tracker.off:
            continue
        tracker.follow(request.output_token_ids)
        remaining = min(
            request.max_tokens - request.num_output_tokens, max_model_len - request.num_tokens
        )
        try:
            why = tracker.restrict(result[row], remaining, grammar.matcher)
        except Exception as exc:  # never let the hook fail a step
            tracker.off = why = f"error: {exc!r}"
        if why:
            tracker.off = why
            log.warning(
                "JSON budget: request %s is no longer kept within max_tokens (%s; the "
                "answer ends %r); its answer may be cut at max_tokens as without the plugin.",
                req_id,
                why,
                tracker.tail,
            )


def apply() -> None:
    """Install the hook (idempotent). Whether it acts is read per step
    (VLLM_X86_JSON_BUDGET), so the switch needs no restart of this process."""
    from vllm.v1.structured_output import StructuredOutputManager

    original = StructuredOutputManager.grammar_bitmask
    if getattr(original, MARK, False):
        return

    def grammar_bitmask(
        self, requests, structured_output_request_ids, scheduled_spec_decode_tokens
    ):
        result = original(
            self, requests, structured_output_request_ids, scheduled_spec_decode_tokens
        )
        if (
            result is not None
            and self.vllm_config.num_speculative_tokens == 0
            and (self.reasoner_cls is None or self.enable_in_reasoning)
            and len(result) == len(structured_output_request_ids)
            and enabled()
        ):
            narrow(self, requests, structured_output_request_ids, result)
        return result

    setattr(grammar_bitmask, MARK, True)
    grammar_bitmask.__wrapped__ = original
    StructuredOutputManager.grammar_bitmask = grammar_bitmask
