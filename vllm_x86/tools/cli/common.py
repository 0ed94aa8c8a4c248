"""What `vllm-x86 serve`, the daemon and the demo share: the error type whose message is
for the user, the vLLM server command line built from `vllm-x86 serve`'s arguments, and
one streamed chat answer. Kept apart from main.py so the daemon and the demo do not
import the whole command line (and main.py can import them without a circle).
"""

from __future__ import annotations

import os
import sys

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


class CliError(Exception):
    """An error whose message is meant for the user (printed without a traceback)."""


# ----------------------------------------------------------------------------- serve


def _flag_value(args: list[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def int_flag(args: list[str], *flags: str) -> int | None:
    """The first of `flags` given, as a number; None when none is, or it is not a
    number (vLLM's own parser then says what is wrong with it)."""
    for flag in flags:
        value = _flag_value(args, flag)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _has_flag(args: list[str], *flags: str) -> bool:
    return any(a == f or a.startswith(f + "=") for a in args for f in flags)


def resolve_serve_model(model: str | None, revision: str | None = None) -> tuple[str, str | None]:
    """(model directory for vLLM, served name or None). Raises CliError with what to do.

    A directory serves itself; nothing serves the default model; a catalog name is pulled
    if needed and served under that name; a hub id (org/name) is that hub model from the
    local Hugging Face cache, served under the hub id, and an error before vLLM starts
    when the cache does not have it (vllm-x86 never downloads from the hub). A prepacked
    directory (`vllm-x86 quantize`) whose manifest or files are damaged is refused here,
    before vLLM starts (quant/format.py, check_prepacked)."""
    from vllm_x86.runtime.quant.format import FormatError, check_prepacked
    from vllm_x86.tools.models.pull import PullError, resolve

    if model is not None and os.path.exists(os.path.expanduser(model)):
        path = os.path.expanduser(model)
        if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
            raise CliError(f"'{model}' is a directory but not a model: it has no config.json")
        resolved: tuple[str, str | None] = (path, None)
    else:
        try:
            resolved = resolve(model, revision)
        except PullError as e:
            raise CliError(str(e)) from None
    if os.path.isdir(resolved[0]):
        try:
            check_prepacked(resolved[0])
        except FormatError as e:
            raise CliError(str(e)) from None
    return resolved


def serve_argv(model: str | None, passthrough: list[str]) -> tuple[list[str], str, int]:
    """The vLLM OpenAI-server command line `vllm-x86 serve` runs, with host and port."""
    if _has_flag(passthrough, "--model"):
        model = _flag_value(passthrough, "--model")
        passthrough = _strip_flag(passthrough, "--model")
    revision = _flag_value(passthrough, "--revision")
    path, served_name = resolve_serve_model(model, revision)
    if revision is not None and served_name is not None and "/" in served_name:
        # a hub id: the revision chose the snapshot, and vLLM gets that directory
        passthrough = _strip_flag(passthrough, "--revision")
    path, passthrough, served_name = _prepacked_instead(model, path, passthrough, served_name)
    argv = [sys.executable, "-m", server_module(passthrough), "--model", path]
    host = _flag_value(passthrough, "--host")
    if host is None:
        host = DEFAULT_HOST
        argv += ["--host", host]
    port = int(_flag_value(passthrough, "--port") or DEFAULT_PORT)
    if served_name and not _has_flag(passthrough, "--served-model-name"):
        argv += ["--served-model-name", served_name]
    if _eager_without_compiler(passthrough):
        argv += ["--enforce-eager"]
    return argv + passthrough, host, port


# Flags of vLLM's launch modes that its OpenAI server module ignores (vllm_serve.py)
LAUNCH_MODE_FLAGS = ("--headless", "--api-server-count", "-asc")


def server_module(passthrough: list[str]) -> str:
    """The module `vllm-x86 serve` runs: vLLM's OpenAI server, or vllm_serve.py (vLLM's
    `vllm serve`) for the launch modes the server module ignores."""
    if _has_flag(passthrough, *LAUNCH_MODE_FLAGS):
        return "vllm_x86.tools.cli.vllm_serve"
    return "vllm.entrypoints.openai.api_server"


def is_headless(argv: list[str]) -> bool:
    return _has_flag(argv, "--headless")


def _prepacked_instead(
    model: str | None, path: str, passthrough: list[str], served_name: str | None
) -> tuple[str, list[str], str | None]:
    """`--quantization x86_int8|x86_int4` of a model that `vllm-x86 quantize` has already
    written with those settings: serve that prepacked directory instead, under the name
    the model would have had (quantize/index.py says when one qualifies)."""
    quant = _flag_value(passthrough, "--quantization")
    if quant not in ("x86_int8", "x86_int4") or not os.path.isdir(path):
        return path, passthrough, served_name
    from vllm_x86.tools.quantize import index

    found = index.find(path, 8 if quant == "x86_int8" else 4)
    if found is None:
        return path, passthrough, served_name
    how = "GPTQ, calibrated" if found["method"] == "gptq" else "rounded as while loading"
    print(
        f"vllm-x86: serving the prepacked {quant.removeprefix('x86_').upper()} checkpoint "
        f"{found['out']} (`vllm-x86 quantize`, {how}) instead of quantizing {path} again "
        "while it loads; VLLM_X86_USE_PREPACKED=0 quantizes it again",
        file=sys.stderr,
        flush=True,
    )
    if served_name is None and not _has_flag(passthrough, "--served-model-name"):
        served_name = model or path  # the name clients would have seen
    return found["out"], _strip_flag(passthrough, "--quantization"), served_name


# Flags by which a user chooses the compilation mode themselves.
COMPILE_FLAGS = ("--enforce-eager", "--compilation-config", "-cc", "-O", "--optimization-level")


def _eager_without_compiler(passthrough: list[str]) -> bool:
    """True (and a warning on stderr) when vLLM's compiled mode cannot run here: no C++
    compiler for Inductor, and the user chose no compilation mode. Installed from the
    wheel, the plugin needs no compiler; vLLM's compiled mode does."""
    from vllm_x86.runtime import hardware

    chosen = any(a.startswith("-O") for a in passthrough) or _has_flag(passthrough, *COMPILE_FLAGS)
    if chosen or hardware.cxx_compiler() is not None:
        return False
    print(
        "vllm-x86: warning: no C++ compiler found ($CXX, g++, c++ or clang++ on PATH); "
        "vLLM's compiled mode compiles C++ while it serves, so this server runs in eager "
        "mode (--enforce-eager). Install g++ for compiled mode.",
        file=sys.stderr,
        flush=True,
    )
    return True


def _strip_flag(args: list[str], flag: str) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = True
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return out


def chat_once(
    client, model: str, messages: list[dict], max_tokens: int, temperature: float, out=sys.stdout
) -> tuple[str, int, float]:
    """Stream one answer to `out`; return (text, completion tokens, seconds)."""
    import time

    t0 = time.perf_counter()
    parts: list[str] = []
    usage_tokens = 0
    first = None
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=temperature,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage_tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            delta = choice.delta.content or ""
            if delta:
                if first is None:
                    first = time.perf_counter()
                parts.append(delta)
                out.write(delta)
                out.flush()
    out.write("\n")
    elapsed = time.perf_counter() - (first or t0)
    return "".join(parts), usage_tokens, elapsed
