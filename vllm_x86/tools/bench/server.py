"""One measurement of a vLLM contender through its real OpenAI server.

A fresh server process per measurement, launched the way a user launches it
(`vllm-x86 serve MODEL` for the plugin, `python -m vllm.entrypoints.openai.api_server`
for stock vLLM), driven over HTTP with streaming completions (asyncio + httpx), then
stopped. The order inside one measurement:

1. launch; poll ``/health`` every 0.1 s; as soon as it answers, send a 1-token request:
   its first streamed chunk ends ``startup_s`` (measured from just before the launch);
2. warm-up: one long prompt and 8 short concurrent requests (prompts used nowhere else);
3. TTFT: each long prompt alone, 1 token each (time to the first SSE chunk);
4. decode: for each concurrency C, C requests at once, ``new_tokens`` tokens each;
5. stop the process group (SIGINT, then SIGKILL after 30 s).

The process tree's memory (and the CPU other processes used meanwhile) is sampled from
launch to the end of step 4.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from vllm_x86.tools.bench.contenders import BenchError, Contender
from vllm_x86.tools.bench.proctree import TreeMonitor, descendants, wait_gone
from vllm_x86.tools.bench.workload import PromptSet, Workload
from vllm_x86.tools.ports import free_port

SERVED_NAME = "bench"
HEALTH_POLL_S = 0.1


def server_command(
    contender: Contender, model: str, port: int, dtype: str, mode: str, max_model_len: int
) -> list[str]:
    """The command line a contender's server runs with (flags identical for all)."""
    flags = [
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", dtype,
        "--max-model-len", str(max_model_len),
        "--served-model-name", SERVED_NAME,
    ]  # fmt: skip
    if (contender.mode or mode) == "eager":
        flags.append("--enforce-eager")
    flags.extend(contender.args)
    if contender.kind == "plugin-server":
        # --no-daemon: a standby daemon running on the machine must not take the run over.
        return [sys.executable, "-m", "vllm_x86.tools.cli", "serve", model, "--no-daemon", *flags]
    if contender.kind == "vllm-server":
        return [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model,
            *flags,
        ]
    raise ValueError(f"{contender.name} is not a server contender")


def stop_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """Stop a process group started with start_new_session=True, and wait until every
    process of the tree is gone (an engine process that outlives its server would
    still be exiting while the next contender runs)."""
    tree = descendants(proc.pid)
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass
    wait_gone(tree, timeout=grace_s)


def log_tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


class _Server:
    def __init__(self, base: str, proc: subprocess.Popen, log_path: Path):
        self.base = base
        self.proc = proc
        self.log_path = log_path

    def died(self) -> BenchError:
        return BenchError(
            f"the server exited with code {self.proc.returncode} (log: {self.log_path}):\n"
            + log_tail(self.log_path)
        )


async def _wait_ready(client: httpx.AsyncClient, srv: _Server, deadline: float) -> float:
    while True:
        if srv.proc.poll() is not None:
            raise srv.died()
        try:
            r = await client.get(f"{srv.base}/health", timeout=1.0)
            if r.status_code == 200:
                return time.perf_counter()
        except httpx.HTTPError:
            pass
        if time.perf_counter() > deadline:
            raise BenchError(f"the server was not ready in time (log: {srv.log_path})")
        await asyncio.sleep(HEALTH_POLL_S)


async def stream_completion(
    client: httpx.AsyncClient, base: str, prompt: list[int], max_tokens: int
) -> dict:
    """One greedy streaming completion; times are time.perf_counter() values."""
    body = {
        "model": SERVED_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t_send = time.perf_counter()
    t_first = t_last = None
    parts: list[str] = []
    chunks = 0
    usage = None
    async with client.stream("POST", f"{base}/v1/completions", json=body) as r:
        if r.status_code != 200:
            text = (await r.aread()).decode(errors="replace")
            raise BenchError(f"the server refused a request ({r.status_code}): {text[:500]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            msg = json.loads(data)
            if msg.get("usage"):
                usage = msg["usage"]
            if msg.get("choices"):
                now = time.perf_counter()
                if t_first is None:
                    t_first = now
                t_last = now
                chunks += 1
                parts.append(msg["choices"][0].get("text") or "")
    if t_first is None:
        raise BenchError("a streamed completion returned no token")
    tokens = usage["completion_tokens"] if usage else chunks
    return {
        "prompt_tokens": len(prompt),
        "t_send": t_send,
        "t_first": t_first,
        "t_last": t_last,
        "tokens": tokens,
        "chunks": chunks,
        "text": "".join(parts),
    }


def summarize_batch(reqs: list[dict], t0: float) -> dict:
    """Figures of C concurrent requests; request times are made relative to t0."""
    start = min(r["t_send"] for r in reqs)
    end = max(r["t_last"] for r in reqs)
    tokens = sum(r["tokens"] for r in reqs)
    tpot = [(r["t_last"] - r["t_first"]) / (r["tokens"] - 1) * 1e3 for r in reqs if r["tokens"] > 1]
    return {
        "tok_s": tokens / (end - start),
        "tokens": tokens,
        "wall_s": end - start,
        "median_tpot_ms": statistics.median(tpot) if tpot else None,
        "requests": [relative_times(r, t0) for r in reqs],
    }


def relative_times(r: dict, t0: float) -> dict:
    out = dict(r)
    for k in ("t_send", "t_first", "t_last"):
        out[k] = round(r[k] - t0, 6)
    return out


async def _drive(
    srv: _Server,
    t_launch: float,
    prompts: PromptSet,
    w: Workload,
    timeout_s: float,
    sampler: TreeMonitor,
):
    """The workload against a started server; every timed section inside
    ``sampler.quiet()`` (no PSS read while it runs, proctree)."""
    limits = httpx.Limits(max_connections=max(w.concurrency) + 8)
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s, connect=5.0), limits=limits
    ) as client:
        with sampler.quiet():
            t_ready = await _wait_ready(client, srv, t_launch + timeout_s)
            first = await stream_completion(client, srv.base, prompts.warmup, 1)
        raw: dict = {"first_request": relative_times(first, t_launch)}
        m: dict = {"ready_s": t_ready - t_launch, "startup_s": first["t_first"] - t_launch}

        await stream_completion(client, srv.base, prompts.ttft_warmup, 1)
        await asyncio.gather(
            *(stream_completion(client, srv.base, p, 8) for p in prompts.warmup_batch)
        )

        ttft = []
        with sampler.quiet():
            for p in prompts.ttft:
                r = await stream_completion(client, srv.base, p, 1)
                ttft.append(r["t_first"] - r["t_send"])
        raw["ttft_s"] = ttft
        m["ttft_s"] = statistics.median(ttft)
        m["prefill_tok_s"] = w.prompt_tokens / m["ttft_s"]

        for c in w.concurrency:
            with sampler.quiet():
                reqs = await asyncio.gather(
                    *(
                        stream_completion(client, srv.base, p, w.new_tokens)
                        for p in prompts.decode[:c]
                    )
                )
            b = summarize_batch(list(reqs), t_launch)
            m[f"decode_{c}_tok_s"] = b["tok_s"]
            raw[f"decode_{c}"] = b
            if c == 1:
                m["text"] = reqs[0]["text"]
        return m, raw


_KV_LINE = re.compile(
    r"pid=(\d+)\)[^\n]*KV cache: [\d.]+ GiB of fresh zero pages at ((?:0x[0-9a-f]+-0x[0-9a-f]+(?:, )?)+)"
)


def kv_ranges_in_log(log_path: Path) -> dict[int, list[tuple[int, int]]]:
    """{pid: [(start, end), ...]} of the KV caches the plugin's workers logged
    (runtime/startup/kv_alloc.py); empty for a server that logged none (stock vLLM, or
    VLLM_X86_KV_ZERO_PAGES=0)."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return {}
    out: dict[int, list[tuple[int, int]]] = {}
    for m in _KV_LINE.finditer(text):
        for r in m.group(2).split(", "):
            a, b = r.split("-")
            out.setdefault(int(m.group(1)), []).append((int(a, 16), int(b, 16)))
    return out


def measure_server(
    contender: Contender,
    model: str,
    env: dict[str, str],
    prompts: PromptSet,
    w: Workload,
    dtype: str,
    mode: str,
    log_path: Path,
    timeout_s: float = 1200.0,
) -> dict:
    """Launch, measure and stop one server; return {metrics..., "raw": {...}}."""
    port = free_port()
    cmd = server_command(contender, model, port, dtype, mode, w.max_model_len)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        t_launch = time.perf_counter()
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        srv = _Server(f"http://127.0.0.1:{port}", proc, log_path)
        sampler = TreeMonitor(proc.pid, kv_ranges=lambda: kv_ranges_in_log(log_path))
        try:
            with sampler:
                metrics, raw = asyncio.run(_drive(srv, t_launch, prompts, w, timeout_s, sampler))
        except (httpx.HTTPError, OSError) as e:
            if proc.poll() is not None:
                raise srv.died() from None
            raise BenchError(f"{contender.name}: {type(e).__name__}: {e} (log: {log_path})") from e
        finally:
            stop_group(proc)
    metrics.update(sampler.result())
    metrics["command"] = cmd
    metrics["raw"] = raw
    return metrics
