"""`vllm-x86 bench startup`: where a server's start-up goes, for each way of starting it.

    vllm-x86 bench startup                                   # default model, eager
    vllm-x86 bench startup --model random:qwen3-0.6b --rounds 2
    vllm-x86 bench startup --mode compiled --starts stock,cold,warm-cache

Ways of starting (``--starts``, run in that order every round, each a fresh start):

- ``stock``: stock vLLM CPU's server (``python -m vllm.entrypoints.openai.api_server``,
  VLLM_X86_DISABLE=1, plus VLLM_CPU_KVCACHE_SPACE=1, the one change it needs to start
  on the development machines);
- ``cold``: ``vllm-x86 serve MODEL --no-daemon``, a new process;
- ``warm-cache`` (compiled mode): like ``cold``, with vLLM's compile cache filled by an
  earlier start of the same model and flags (``cold`` and ``stock`` get an empty one);
- ``cold-spawn``: ``cold`` with VLLM_X86_ENGINE_FORK=0 (engine and worker processes
  spawned, as vLLM CPU does: the plugin's cold start before it forked them);
- ``cold-compile`` (compiled mode): ``cold`` with VLLM_X86_STAGED_WARMUP=0, compiling
  before it serves, as vLLM does (``cold`` serves eagerly while it compiles in the
  background: staged.py); the warm cache is filled this way too;
- ``daemon``: ``vllm-x86 serve MODEL`` while a standby daemon runs (the bench starts
  one in a temporary directory first and reports how long that took); the model server
  is stopped after each measurement, so every round starts the model afresh. In compiled
  mode it uses the warm compile cache, as a daemon would after its first start.

Each start is timed from launching its command to the first token of a 1-token
streamed completion sent as soon as ``/health`` answers (polled every 0.1 s). The
breakdown comes from when the server's log lines appear (the bench tails the log every
10 ms): import and argument parsing (to vLLM's ``non-default args`` line), engine-core
process start, worker process start, weight loading, compilation and warm-up (compiled
mode), KV-cache allocation and engine hand-shake, API-server set-up, then ``/health``
and the first token. A second request (16 greedy tokens of a fixed prompt) checks that
every start produces the same text.

The run's folder (--out, `out/startup/` by default) keeps results.json (every start with
its command line and log times), summary.json (``summary``: medians and each start's
phases) and report.md, with the logs; ``--summary FILE.json`` also writes the summary
where the docs keep the reports they cite (docs/bench/).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from vllm_x86.tools.bench.contenders import STOCK_START_ENV, BenchError
from vllm_x86.tools.bench.proctree import TreeMonitor
from vllm_x86.tools.bench.server import SERVED_NAME, log_tail, stop_group
from vllm_x86.tools.ports import free_port

STARTS = ("stock", "cold", "warm-cache", "daemon", "cold-spawn", "cold-compile")
# The cold start with a start-up lever switched off, to show what it brings.
ABLATIONS = {
    "cold-spawn": {"VLLM_X86_ENGINE_FORK": "0"},
    "cold-compile": {"VLLM_X86_STAGED_WARMUP": "0"},
}
SUMMARY_KIND = "vllm-x86 bench startup summary"
CHECK_PROMPT = "The capital of France is"
CHECK_TOKENS = 16

# (key, what ends at that line, text the line contains); the first line seen counts.
MARKERS = (
    ("args", "import + arguments", "non-default args"),
    ("engine", "engine-core process", "Initializing a V1 LLM engine"),
    ("worker", "worker process", "Starting to load model"),
    ("weights", "weight loading", "Loading weights took"),
    ("warmup", "compile + warm-up", "Warming up done"),
    ("engine_ready", "KV cache + engine ready", "init engine (profile, create kv cache"),
    ("api", "API server set-up", "Starting vLLM server on"),
)
PHASES = [m[0] for m in MARKERS] + ["ready", "first_token"]
PHASE_LABELS = {m[0]: m[1] for m in MARKERS} | {
    "ready": "until /health answers",
    "first_token": "first token",
}


def _say(msg: str) -> None:
    print(f"[vllm-x86 bench startup] {msg}", file=sys.stderr, flush=True)


class LogWatch(threading.Thread):
    """Tails a log file (which may not exist yet) and notes when each marker appears."""

    def __init__(self, path: Path, t0: float):
        super().__init__(daemon=True)
        self.path, self.t0 = path, t0
        self.seen: dict[str, float] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        pos, buf = 0, ""
        while not self._halt.is_set():
            try:
                with open(self.path, errors="replace") as fh:
                    fh.seek(pos)
                    chunk = fh.read()
                    pos = fh.tell()
            except OSError:
                chunk = ""
            if chunk:
                now = time.perf_counter() - self.t0
                buf += chunk
                lines = buf.split("\n")
                buf = lines.pop()
                for line in lines:
                    for key, _, text in MARKERS:
                        if key not in self.seen and text in line:
                            self.seen[key] = now
            self._halt.wait(0.01)

    def stop(self) -> dict[str, float]:
        self._halt.set()
        self.join(timeout=2)
        return dict(self.seen)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k == "VLLM_X86_CACHE_DIR" or not k.startswith(("VLLM_X86_", "VLLM_CPU_"))
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


async def _first_token(base: str, t0: float, proc: subprocess.Popen | None, timeout_s: float):
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0)) as client:
        deadline = t0 + timeout_s
        while True:
            if proc is not None and proc.poll() not in (None, 0):
                raise BenchError(f"the server command exited with code {proc.returncode}")
            try:
                r = await client.get(f"{base}/health", timeout=1.0)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.perf_counter() > deadline:
                raise BenchError("the server was not ready in time")
            await asyncio.sleep(0.1)
        t_ready = time.perf_counter()
        body = {"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 1, "temperature": 0.0,
                "stream": True}  # fmt: skip
        t_first = None
        async with client.stream("POST", f"{base}/v1/completions", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                raise BenchError(f"the first request was refused ({r.status_code}): {text[:300]}")
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]" and t_first is None:
                    t_first = time.perf_counter()
        check = await client.post(
            f"{base}/v1/completions",
            json={
                "model": SERVED_NAME,
                "prompt": CHECK_PROMPT,
                "max_tokens": CHECK_TOKENS,
                "temperature": 0.0,
            },  # fmt: skip
        )
        text = check.json()["choices"][0]["text"] if check.status_code == 200 else None
        return t_ready, t_first, text


def _phases(seen: dict[str, float], ready: float, first: float) -> dict[str, float | None]:
    """Durations of consecutive phases; a phase whose line never appeared (eager mode has
    no warm-up line) is None and its time counts in the next phase seen."""
    out: dict[str, float | None] = {}
    prev = 0.0
    for key in PHASES:
        t = {"ready": ready, "first_token": first}.get(key, seen.get(key))
        if t is None or t < prev:
            out[key] = None
            continue
        out[key] = t - prev
        prev = t
    return out


class Daemon:
    """A standby daemon in a temporary directory, for the `daemon` starts."""

    def __init__(self, env: dict[str, str]):
        self.dir = Path(tempfile.mkdtemp(prefix="vllm-x86-bench-daemon-"))
        self.env = dict(env, VLLM_X86_DAEMON_DIR=str(self.dir))
        self.warm_s: float | None = None

    def start(self) -> None:
        t0 = time.perf_counter()
        r = subprocess.run(
            [sys.executable, "-m", "vllm_x86.tools.cli", "daemon", "start"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if r.returncode != 0:
            raise BenchError(f"the daemon did not start:\n{r.stderr[-2000:]}")
        self.warm_s = time.perf_counter() - t0

    def status(self) -> dict:
        from vllm_x86.tools.daemon.client import running
        from vllm_x86.tools.daemon.paths import files

        st = running(files(self.dir))
        if st is None:
            raise BenchError(f"the bench's daemon stopped (log: {self.dir / 'daemon.log'})")
        return st

    def stop_model(self) -> None:
        from vllm_x86.tools.daemon.client import request
        from vllm_x86.tools.daemon.paths import files

        request(files(self.dir), "POST", "/stop-model", {}, timeout=120)

    def stop(self) -> None:
        from vllm_x86.tools.daemon.client import stop
        from vllm_x86.tools.daemon.paths import files

        stop(files(self.dir))
        shutil.rmtree(self.dir, ignore_errors=True)


def measure(kind: str, model: Path, ns, log_path: Path, cache_root: Path | None,
            daemon: Daemon | None) -> dict:  # fmt: skip
    port = free_port()
    flags = ["--host", "127.0.0.1", "--port", str(port), "--dtype", ns.dtype,
             "--max-model-len", str(ns.max_model_len), "--served-model-name", SERVED_NAME]  # fmt: skip
    if ns.mode == "eager":
        flags.append("--enforce-eager")
    extra = {"VLLM_CACHE_ROOT": str(cache_root)} if cache_root is not None else {}
    if kind == "stock":
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
        env = _clean_env(VLLM_X86_DISABLE="1", **STOCK_START_ENV, **extra)
    else:
        cmd = [sys.executable, "-m", "vllm_x86.tools.cli", "serve", str(model)]
        env = _clean_env(**extra, **ABLATIONS.get(kind, {}))
        if kind == "daemon":
            env = dict(daemon.env, **extra)
            cmd.append("--detach")  # return once ready: the bench stops the model itself
        else:
            cmd.append("--no-daemon")
    cmd += flags
    watch_path = log_path
    if kind == "daemon":
        st = daemon.status()
        seq = (st["server"] or {}).get("seq", 0) + 1
        watch_path = daemon.dir / f"model-{seq}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]  # other work on the machine makes a start slower
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        # The processes that do the start: the launched command's tree, or the daemon's
        # (its model server is the daemon's child, not the hand-over command's).
        root = daemon.status()["pid"] if kind == "daemon" else None
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        watch = LogWatch(watch_path, t0)
        watch.start()
        # CPU only: reading PSS would take CPU from the start being timed (proctree)
        monitor = TreeMonitor(root or proc.pid, interval=0.1, pss=False)
        try:
            with monitor:
                t_ready, t_first, text = asyncio.run(
                    _first_token(f"http://127.0.0.1:{port}", t0, proc, ns.timeout)
                )
        except (BenchError, httpx.HTTPError, OSError) as e:
            tail = log_tail(watch_path, 2000)
            raise BenchError(f"{kind}: {e} (log: {watch_path}):\n{tail}") from None
        finally:
            try:
                seen = watch.stop()
                if kind == "daemon":
                    try:
                        proc.wait(timeout=60)  # the hand-over command returns once ready
                    except subprocess.TimeoutExpired:
                        pass
                    daemon.stop_model()
            finally:
                stop_group(proc)
    if kind == "daemon":
        shutil.copyfile(watch_path, log_path.with_suffix(".server.log"))
    usage = monitor.result()
    other = usage["other_cpu_pct"] or 0.0
    return {
        "other_cpu_pct": other,
        "load_avg_1min": load,
        "startup_s": t_first - t0,
        "ready_s": t_ready - t0,
        "phases": _phases(seen, t_ready - t0, t_first - t0),
        "markers_s": seen,
        "text": text,
        "command": cmd,
    }


def _fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f}"


def medians(results: dict) -> dict[str, dict]:
    """For each way of starting: the median launch-to-first-token and phase times."""
    runs = results["runs"]
    med: dict[str, dict] = {}
    for k in dict.fromkeys(r["start"] for r in runs):
        rs = [r for r in runs if r["start"] == k]
        med[k] = {
            "startup_s": statistics.median(r["startup_s"] for r in rs),
            "phases": {},
        }
        for p in PHASES:
            vals = [r["phases"][p] for r in rs if r["phases"].get(p) is not None]
            med[k]["phases"][p] = statistics.median(vals) if vals else None
    return med


def summary(results: dict) -> dict:
    """What the report is made from: the medians, and each start's figures (phases, the
    other work beside it, the greedy check's text), without the command lines and log
    times (results.json in the run's folder keeps them)."""
    drop = ("command", "markers_s")
    return {
        "kind": SUMMARY_KIND,
        **{k: v for k, v in results.items() if k not in ("runs", "kind")},
        "medians": medians(results),
        "runs": [{k: v for k, v in r.items() if k not in drop} for r in results["runs"]],
    }


def report(results: dict) -> str:
    runs = results["runs"]
    med = medians(results)
    kinds = list(med)
    head = "| phase (s) | " + " | ".join(kinds) + " |"
    lines = [
        f"Model: {results['model']} ({results['dtype']}, {results['mode']}, max-model-len "
        f"{results['max_model_len']}), {results['rounds']} round(s), medians.",
        "",
        head,
        "|" + "---|" * (len(kinds) + 1),
    ]
    for p in PHASES:
        lines.append(
            f"| {PHASE_LABELS[p]} | " + " | ".join(_fmt(med[k]["phases"][p]) for k in kinds) + " |"
        )
    lines.append(
        "| **launch to first token** | "
        + " | ".join(f"**{med[k]['startup_s']:.1f}**" for k in kinds)
        + " |"
    )
    if "stock" in med:
        lines.append(
            "| speed-up vs stock | "
            + " | ".join(f"{med['stock']['startup_s'] / med[k]['startup_s']:.1f}x" for k in kinds)
            + " |"
        )
    lines += ["", "Every start (other work: CPU other processes used during the start, in % "
              "of one CPU; the machine has " f"{os.cpu_count()}):", "",
              "| round | start | launch to first token (s) | other work |", "|---|---|---|---|"]  # fmt: skip
    for r in runs:
        lines.append(
            f"| {r['round']} | {r['start']} | {r['startup_s']:.1f} | "
            f"{r.get('other_cpu_pct', 0.0):.0f}% |"
        )
    texts = {r["text"] for r in runs}
    lines += ["", f"Greedy check ({CHECK_TOKENS} tokens of {CHECK_PROMPT!r}): "
              + ("the same text from every start" if len(texts) == 1
                 else "TEXTS DIFFER: " + "; ".join(f"{r['start']}: {r['text']!r}" for r in runs))]  # fmt: skip
    if results.get("daemon_warm_s") is not None:
        lines.append(
            f"The standby daemon itself took {results['daemon_warm_s']:.1f} s to start "
            "(`vllm-x86 daemon start`, once, before the rounds)."
        )
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm-x86 bench startup",
        description="Start-up breakdown of vLLM's OpenAI server: stock vLLM CPU, a cold "
        "`vllm-x86 serve`, a start with a warm compile cache, and a start from the standby "
        "daemon, timed from launch to first token. Writes results.json, summary.json and "
        "report.md to a new folder under --out and prints the report. Method and results: "
        "docs/startup.md.",
    )
    p.add_argument("--model", help="model directory, catalog name or random:SHAPE "
                   "(default: the default model)")  # fmt: skip
    p.add_argument("--starts", default=None,
                   help=f"comma-separated, in order each round: {', '.join(STARTS)} (default: "
                   "stock,cold,daemon in eager mode; stock,cold,warm-cache,daemon compiled)")  # fmt: skip
    p.add_argument("--mode", choices=["eager", "compiled"], default="eager",
                   help="--enforce-eager or vLLM's compiled mode (default: %(default)s)")  # fmt: skip
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--rounds", type=int, default=1, help="(default: %(default)s)")
    p.add_argument("--max-model-len", type=int, default=2048, help="(default: %(default)s)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per start")
    p.add_argument(
        "--wait-quiet",
        type=int,
        default=60,
        metavar="SECONDS",
        help="before each start, wait up to this long for other processes to use less than "
        "20%% of a CPU (default: %(default)s; 0: do not wait)",
    )
    p.add_argument("--out", default="out/startup", help="(default: %(default)s)")
    p.add_argument(
        "--summary",
        metavar="FILE.json",
        help="also write the summary (medians and each start's phases, no command lines "
        "or log times) to FILE.json, e.g. docs/bench/DATE-startup-NAME.json",
    )
    return p


def _wait_quiet(max_wait_s: int) -> float:
    from vllm_x86.tools.bench.harness import _wait_quiet as wait

    return wait(max_wait_s)


def main(argv: list[str]) -> int:
    from vllm_x86.tools.bench.harness import resolve_model

    ns = build_parser().parse_args(argv)
    default = "stock,cold,daemon" if ns.mode == "eager" else "stock,cold,warm-cache,daemon"
    starts = [s.strip() for s in (ns.starts or default).split(",") if s.strip()]
    try:
        unknown = [s for s in starts if s not in STARTS]
        if unknown or not starts:
            raise BenchError(f"unknown start(s) {unknown}; known: {', '.join(STARTS)}")
        for kind in ("warm-cache", "cold-compile"):
            if kind in starts and ns.mode != "compiled":
                raise BenchError(f"{kind} is about compiling: use --mode compiled")
        if ns.rounds < 1:
            raise BenchError("--rounds must be at least 1")
        if ns.summary and not ns.summary.endswith(".json"):
            raise BenchError(f"--summary {ns.summary}: give a .json file name")
        model, label, _ = resolve_model(ns.model)
        return _run(ns, starts, model, label)
    except BenchError as e:
        print(f"vllm-x86: error: {e}", file=sys.stderr)
        return 1


def _run(ns, starts: list[str], model: Path, label: str) -> int:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(ns.out) / f"{stamp}-{label.replace(':', '-').replace('/', '-')}"
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "model": label, "model_dir": str(model), "dtype": ns.dtype, "mode": ns.mode,
        "max_model_len": ns.max_model_len, "rounds": ns.rounds, "starts": starts,
        "argv": ["vllm-x86", "bench", "startup", *sys.argv[3:]], "runs": [],
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }  # fmt: skip
    for f in model.iterdir():  # read once, so the first start does not pay a cold page cache
        if f.is_file():
            with open(f, "rb") as fh:
                while fh.read(16 << 20):
                    pass
    caches = Path(tempfile.mkdtemp(prefix="vllm-x86-bench-cc-"))
    warm_cache = caches / "warm"
    daemon = None
    try:
        if "daemon" in starts:
            _say("starting a standby daemon for the daemon starts")
            daemon = Daemon(_clean_env())
            daemon.start()
            results["daemon_warm_s"] = daemon.warm_s
            _say(f"  daemon ready in {daemon.warm_s:.1f} s")
        for rnd in range(1, ns.rounds + 1):
            for kind in starts:
                cache = None
                if ns.mode == "compiled":
                    if kind in ("warm-cache", "daemon"):
                        if not warm_cache.exists():
                            _say("filling the compile cache for warm starts (not measured)")
                            measure("cold-compile", model, ns, out / "logs" / "prime.log",
                                    warm_cache, None)  # fmt: skip
                        cache = warm_cache
                    else:
                        cache = caches / f"r{rnd}-{kind}"
                other = _wait_quiet(ns.wait_quiet)
                _say(f"round {rnd}: {kind} ...")
                r = measure(kind, model, ns, out / "logs" / f"r{rnd}-{kind}.log", cache, daemon)
                r.update(start=kind, round=rnd, other_cpu_pct_before=other)
                results["runs"].append(r)
                _say(
                    f"  {kind}: first token {r['startup_s']:.1f} s after launch "
                    f"(other work {r['other_cpu_pct']:.0f}% of a CPU)"
                )
                (out / "results.json").write_text(json.dumps(results, indent=1))
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(caches, ignore_errors=True)
    text = report(results)
    (out / "report.md").write_text(text)
    summ = json.dumps(summary(results), indent=1) + "\n"
    (out / "summary.json").write_text(summ)
    print(text)
    _say(f"written to {out}")
    if ns.summary:
        Path(ns.summary).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.summary).write_text(summ)
        _say(f"summary: {ns.summary}")
    return 0
