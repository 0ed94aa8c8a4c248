"""Patch ``responses_assistant_input_without_text`` (a monkey-patch; ledger.py).

Found by fuzzing (tests/e2e/test_fuzz.py, `make fuzz`; docs/reliability.md): vLLM's
Responses API (``POST /v1/responses``) answers 500 Internal Server Error to an ``input``
that holds an assistant message (``{"type": "message", "role": "assistant", ...}``)
whose ``content`` is empty (``IndexError: list index out of range``) or starts with a
refusal part (``AttributeError: 'ResponseOutputRefusal' object has no attribute
'text'``): ``_construct_message_from_response_item``
(``vllm/entrypoints/openai/responses/utils.py``) reads ``item.content[0].text``
without a check. The request is the client's mistake, not the server's, and a 500
tells the client to retry the same request.

The patch wraps that function (vLLM's ``construct_chat_messages_with_tool_call`` looks
it up in its module at each call): for such a message it raises vLLM's own
``VLLMValidationError`` (what the same function raises for encrypted reasoning), which
vLLM's server answers with a 400 and a sentence saying what to send instead; every
other item goes to vLLM's function unchanged. The patch is installed only in a process
that has already imported that module (the OpenAI server imports it at start, before
vLLM loads the plugins), so the engine and worker processes import nothing for it.

Upstream change that removes it: vLLM checking the message's content before reading
its first part. It can go when the pinned vLLM does.
"""

from __future__ import annotations

import sys

from vllm_x86.runtime.patches.ledger import MARK

MODULE = "vllm.entrypoints.openai.responses.utils"


def problem(item) -> str | None:
    """Why vLLM cannot read an assistant message's text from ``item``, or None."""
    content = getattr(item, "content", None)
    if not content:
        return (
            "An assistant message in `input` has an empty `content`: give it at least one "
            '{"type": "output_text", "text": ...} part.'
        )
    first = content[0]
    if getattr(first, "text", None) is None:
        kind = getattr(first, "type", type(first).__name__)
        return (
            f"An assistant message in `input` starts with a `{kind}` part: vLLM reads the "
            'assistant\'s text from the first part, so put a {"type": "output_text", '
            '"text": ...} part first.'
        )
    return None


def apply() -> None:
    """Install the check (idempotent; see the module docstring)."""
    utils = sys.modules.get(MODULE)
    if utils is None:
        return  # not an OpenAI server: nothing to do, nothing imported
    original = getattr(utils, "_construct_message_from_response_item", None)
    message_cls = getattr(utils, "ResponseOutputMessage", None)
    error_cls = getattr(utils, "VLLMValidationError", None)
    if original is None or message_cls is None or error_cls is None:
        return
    if getattr(original, MARK, False):
        return

    def _construct_message_from_response_item(item, prev_msg=None):
        if isinstance(item, message_cls):
            why = problem(item)
            if why is not None:
                raise error_cls(why, parameter="input")
        return original(item, prev_msg=prev_msg)

    setattr(_construct_message_from_response_item, MARK, True)
    _construct_message_from_response_item.__wrapped__ = original
    utils._construct_message_from_response_item = _construct_message_from_response_item
