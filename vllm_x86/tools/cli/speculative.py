"""`vllm-x86 serve --speculative ngram|draft:MODEL|off`: vLLM's speculative decoding with CPU
defaults.

``--speculative ngram`` becomes vLLM's ``--speculative-config`` for n-gram prompt
lookup (drafts copied from the prompt and the text so far; no draft model), with the
defaults in NGRAM_DEFAULTS. ``--speculative draft:MODEL`` drafts with a smaller model
that shares the model's tokenizer (a catalog name, pulled if needed, a directory or a
hub id in the local cache, as ``serve`` takes its model), DRAFT_TOKENS tokens at a time,
quantized as the served model is (vLLM loads a draft unquantized unless its config says
otherwise, which on a CPU makes an INT4 model's draft read 4x the bytes).
``VLLM_X86_SPECULATIVE`` (runtime/envs.py) gives the same choice for servers started
without the flag; the flag wins over it, and a user's own
vLLM flags for speculation (``--speculative-config``/``-sc``, ``--spec-method``,
``--spec-model``, ``--spec-tokens``) win over both. The default is off: it measured
faster only where answers copy the prompt (editing code), which a server cannot know
at start-up, and slower on free chat (docs/speculative.md has the figures).
"""

from __future__ import annotations

import json

from vllm_x86.tools.cli.common import CliError, _flag_value, _strip_flag

CHOICES = ("off", "ngram", "draft:MODEL")
DRAFT_PREFIX = "draft:"
# tokens a draft model guesses per step: each costs one of its decode steps
DRAFT_TOKENS = 3

# n-gram prompt lookup for CPU: up to 4 drafted tokens from a 2- to 4-token match.
NGRAM_DEFAULTS = {"num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}

# vLLM's own flags for speculative decoding (vllm/engine/arg_utils.py), also in their
# dotted forms (--speculative-config.method ngram).
VLLM_FLAGS = ("--speculative-config", "-sc", "--spec-method", "--spec-model", "--spec-tokens")


def _users_own(passthrough: list[str]) -> str | None:
    for a in passthrough:
        for f in VLLM_FLAGS:
            if a == f or a.startswith((f + "=", f + ".")):
                return f
    return None


def speculative_args(passthrough: list[str], env_value: str | None) -> tuple[list[str], str]:
    """(vLLM flags with `--speculative` translated, the line that says what was chosen).

    ``env_value`` is VLLM_X86_SPECULATIVE (None or empty: unset). Raises CliError for a
    value that is not one of CHOICES, or a draft model that cannot be found."""
    flag = _flag_value(passthrough, "--speculative")
    if flag is None and "--speculative" in passthrough:
        raise CliError(f"--speculative needs a value: {' or '.join(CHOICES)}")
    rest = _strip_flag(passthrough, "--speculative")
    source = "--speculative"
    choice = flag
    if choice is None:
        choice, source = (env_value or "").strip() or None, "VLLM_X86_SPECULATIVE"
    if choice is not None and not choice.lower().startswith(DRAFT_PREFIX):
        choice = choice.lower()  # the words, not a draft model's path
    draft = None
    if choice is not None and choice.lower().startswith(DRAFT_PREFIX):
        draft = choice[len(DRAFT_PREFIX) :].strip()
        if not draft:
            raise CliError(
                f"{source}={choice!r} names no draft model: give one after 'draft:', e.g. "
                "draft:qwen2.5-coder-0.5b-instruct-q4_k_m"
            )
    elif choice is not None and choice not in CHOICES:
        raise CliError(
            f"{source}={choice!r} is not a speculative decoding choice: use "
            f"{' or '.join(CHOICES)} (or vLLM's own --speculative-config JSON)"
        )
    own = _users_own(rest)
    if own is not None:
        if choice == "ngram" or draft is not None:
            return rest, (
                f"vllm-x86: speculative decoding as your {own} says ({source} {choice} "
                "is ignored: your vLLM flag wins)"
            )
        return rest, f"vllm-x86: speculative decoding as your {own} says"
    if draft is not None:
        return _draft_args(rest, draft, source)
    if choice == "ngram":
        cfg = {"method": "ngram", **NGRAM_DEFAULTS}
        return rest + ["--speculative-config", json.dumps(cfg, separators=(",", ":"))], (
            f"vllm-x86: speculative decoding on ({source} ngram): n-gram prompt lookup, up "
            f"to {cfg['num_speculative_tokens']} drafted tokens from a "
            f"{cfg['prompt_lookup_min']}-{cfg['prompt_lookup_max']}-token match in the "
            "prompt or the text so far; greedy answers stay the model's own up to "
            "rounding (docs/speculative.md)"
        )
    if choice == "off":
        return rest, f"vllm-x86: speculative decoding off ({source} off)"
    return rest, (
        "vllm-x86: speculative decoding off (the default: it measured faster only when "
        "answers copy the prompt, as in code editing, and slower on free chat; "
        "--speculative ngram turns it on, and --speculative draft:MODEL drafts with a "
        "smaller model of the same tokenizer, docs/speculative.md)"
    )


def draft_config(path: str, quantization: str | None) -> dict:
    """vLLM's speculative config for the draft model at `path`, DRAFT_TOKENS a step, with
    the served model's on-the-fly `quantization` (None: unquantized, as the model)."""
    cfg: dict = {"method": "draft_model", "model": path, "num_speculative_tokens": DRAFT_TOKENS}
    if quantization:
        cfg["quantization"] = quantization
    return cfg


def _draft_args(rest: list[str], draft: str, source: str) -> tuple[list[str], str]:
    """vLLM's draft-model config for ``draft:MODEL``, quantized as the served model."""
    from vllm_x86.tools.cli.common import resolve_serve_model

    try:
        path, _ = resolve_serve_model(draft, None)
    except CliError as e:
        raise CliError(f"{source} draft:{draft}: {e}") from None
    quant = _flag_value(rest, "--quantization") or _flag_value(rest, "-q")
    cfg = draft_config(path, quant)
    how = f"quantized as the model ({quant})" if quant else "unquantized, as the model"
    return rest + ["--speculative-config", json.dumps(cfg, separators=(",", ":"))], (
        f"vllm-x86: speculative decoding on ({source} draft:{draft}): the draft model "
        f"{path} guesses up to {DRAFT_TOKENS} tokens a step, {how}; greedy answers "
        "stay the model's own up to rounding. On 2 cores a 0.5B draft for a 1.5B model "
        "measured 1.08x on edits and slower on chat (docs/speculative.md)"
    )
