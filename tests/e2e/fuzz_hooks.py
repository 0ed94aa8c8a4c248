"""Schemathesis hooks for tests/e2e/test_fuzz.py (loaded by `schemathesis run` through
SCHEMATHESIS_HOOKS=tests.e2e.fuzz_hooks): every generated request stays cheap to
answer. Whatever the fuzzer sends, a request generates at most MAX_TOKENS tokens for at
most MAX_SEQUENCES sequences: larger token counts are lowered and an absent or null
count is set (vLLM's default is the whole context left), so a run spends its time on
many requests rather than on a few long answers. Values the server refuses before it
generates (negative, a string, a list) are left as generated."""

from __future__ import annotations

import schemathesis

MAX_TOKENS = 8
MAX_SEQUENCES = 2
CAPS = {
    "max_tokens": MAX_TOKENS,
    "max_completion_tokens": MAX_TOKENS,
    "max_output_tokens": MAX_TOKENS,
    "min_tokens": MAX_TOKENS,
    "n": MAX_SEQUENCES,
    "best_of": MAX_SEQUENCES,
}
# the token count each generating endpoint reads, where it is absent or null
DEFAULT_COUNT = {
    "/v1/chat/completions": "max_tokens",
    "/v1/completions": "max_tokens",
    "/v1/chat/completions/batch": "max_tokens",
    "/invocations": "max_tokens",
    "/v1/messages": "max_tokens",
    "/v1/responses": "max_output_tokens",
    "/generative_scoring": "max_tokens",
}


def cap(obj, depth: int = 0) -> None:
    """Lowers every count in CAPS over its cap, in `obj` and the objects it holds."""
    if depth > 6:
        return
    if isinstance(obj, dict):
        for key, limit in CAPS.items():
            value = obj.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > limit:
                obj[key] = limit
        for value in obj.values():
            cap(value, depth + 1)
    elif isinstance(obj, list):
        for value in obj[:64]:
            cap(value, depth + 1)


@schemathesis.hook
def before_call(context, case, kwargs):
    body = case.body
    if not isinstance(body, dict):
        return
    key = DEFAULT_COUNT.get(case.operation.path)
    if key is not None and body.get(key) is None:
        body[key] = MAX_TOKENS
    cap(body)
