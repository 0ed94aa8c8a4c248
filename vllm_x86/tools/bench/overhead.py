"""The harness's profiling mode: where one decode step at 1 request goes.

``python -m vllm_x86.tools.bench.overhead --model M --mode eager,compiled
[--quantization x86_int4]`` starts the real server (``vllm-x86 serve M --no-daemon``, the
flags and environment of the harness's ``plugin`` contender) with
``VLLM_X86_STEP_PROFILE=<run dir>`` (runtime/patches/step_profile.py), and for each mode:

1. a warm-up request; then ``--repeats`` timing requests: each one greedy streamed
   completion of ``--tokens`` tokens (ignore_eos) from a short prompt, each SSE chunk's
   arrival noted with ``time.monotonic()`` (the same clock as the server's records), and
   the CPU time of each server process (/proc/PID/stat) before and after; the request
   with the lowest engine period is reported (on a shared machine, others' work only
   adds time), all of them are in the JSON;
2. the ops request: ``<run dir>/ops-request`` is written, and the worker runs torch's
   profiler over the forward of the next ``--ops-steps`` decode steps (a separate
   request, so its overhead touches none of the timing figures);
3. the server is stopped, and the records the three processes wrote are cut to the
   timing request's decode window and turned into mean milliseconds per decode step.

The step (what one token costs, end to end, on the engine's critical path):

- ``engine loop + scheduler``: the engine core's period between two steps minus its wait
  for the worker (Scheduler.schedule, update_from_output, the busy loop, queueing the
  outputs for the API server);
- ``hand-offs``: the engine core's wait for the worker minus the worker's own time in
  execute_model and sample_tokens (two shared-memory round trips per step, the
  SchedulerOutput's serialization, the wake-ups);
- ``input prep``: the worker's execute_model minus its forward and LM head;
- ``GEMM``, ``attention``, ``other ops``, ``Python/dispatch``: the forward's wall time
  (timing request) split in the proportions the profiled request measured: its
  top-level ops' CPU time by category (step_profile.op_category), and the rest of its
  forward's wall time (Python, torch's dispatch, the profiler's own cost);
- ``LM head``: LogitsProcessor.forward, run by compute_logits in execute_model after
  the forward; ``sampling``: the worker's sample_tokens;
- ``unaccounted``: the client's inter-token latency minus the engine's period, which the
  parts above add up to exactly: what the three processes' records do not explain (the
  API server falling behind, a step missed at the window's edge).

Beside the step (at 1 request the API server works while the engine runs the next
step, so these add latency to each token, not to the time between tokens, except where
they take CPU the engine needs): the API server's CPU time per token (all of its work:
ZMQ receive, OutputProcessor.process_outputs with detokenization, the SSE chunk, HTTP),
``process_outputs`` alone, and the engine -> API server hand-off (from the engine core
making its outputs to the API server processing them).

Writes ``<out>/<label>-<mode>.json`` (``--out``, default ``out/overhead``, outside git)
and prints the markdown tables of docs/overhead.md; ``--report FILE...`` prints the
tables of earlier runs. The aggregation is here, not in a profiler's viewer: the figures
come from three processes and the client, on one clock.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx

from vllm_x86.runtime.patches import step_profile
from vllm_x86.tools.bench.contenders import CONTENDERS, BenchError, contender_env
from vllm_x86.tools.bench.proctree import descendants
from vllm_x86.tools.bench.server import SERVED_NAME, log_tail, server_command, stop_group
from vllm_x86.tools.ports import free_port

STEP_PARTS = (
    ("engine_loop", "engine loop + scheduler"),
    ("handoffs", "engine↔worker hand-offs"),
    ("input_prep", "input prep"),
    ("gemm", "GEMM"),
    ("attention", "attention"),
    ("other_ops", "other ops"),
    ("dispatch", "Python/dispatch"),
    ("lm_head", "LM head"),
    ("sampling", "sampling"),
    ("unaccounted", "unaccounted"),
)
PROMPT = "Tell me a long story about the number 7."


def _say(msg: str) -> None:
    print(f"[vllm-x86 overhead] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- aggregation


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def _ms(values) -> float | None:
    m = _mean(values)
    return None if m is None else m * 1e3


def _in_window(records: list[dict], start: float, end: float) -> list[dict]:
    return [r for r in records if start <= r["t"] < end and r.get("tokens") == 1]


def ops_per_step(ops: dict) -> dict:
    """ms per forward of each category, and the top op names, from an ops summary."""
    n = max(ops.get("forwards", 0), 1)
    cats = {step_profile.GEMM: 0.0, step_profile.ATTENTION: 0.0, step_profile.OTHER: 0.0}
    names = []
    for name, e in ops.get("ops", {}).items():
        cat = step_profile.op_category(name)
        cats[cat] += e["us"] / n / 1e3
        names.append((e["us"] / n / 1e3, name, e["calls"] / n, cat, e.get("self_us", 0) / n / 1e3))
    names.sort(reverse=True)
    return {
        "gemm": cats[step_profile.GEMM],
        "attention": cats[step_profile.ATTENTION],
        "other_ops": cats[step_profile.OTHER],
        "forward_profiled": ops.get("forward_us", 0.0) / n / 1e3,
        "forwards": ops.get("forwards", 0),
        "top_ops": [
            {
                "name": nm,
                "ms": round(ms, 4),
                "self_ms": round(sf, 4),
                "calls": round(c, 2),
                "category": cat,
            }
            for ms, nm, c, cat, sf in names[:15]
        ],
    }


def breakdown(
    chunks: list[float],
    engine: list[dict],
    worker: list[dict],
    api: list[dict],
    ops: dict | None,
    cpu_s: dict[str, float] | None = None,
    counts: list[int] | None = None,
) -> dict:
    """Mean ms per decode step of each part (see the module docstring).

    ``chunks``: the timing request's SSE chunk arrival times (time.monotonic());
    ``counts``: the completion tokens streamed up to each chunk (vLLM merges the tokens
    of several steps into one chunk when the HTTP side falls behind), else one a chunk;
    ``engine``/``worker``/``api``: the processes' records (step_profile); ``ops``: the
    worker's ops summary; ``cpu_s``: CPU seconds each process used during the request.
    """
    if len(chunks) < 3:
        raise BenchError("the timing request streamed fewer than 3 tokens")
    t_first, t_last = chunks[0], chunks[-1]
    counts = counts or list(range(1, len(chunks) + 1))
    itl = (t_last - t_first) / (counts[-1] - counts[0]) * 1e3
    steps = sorted(_in_window(engine, t_first, t_last), key=lambda r: r["t"])
    if len(steps) < 2:
        raise BenchError("the engine core recorded no decode steps in the timing request")
    # Each engine step with the worker's record of it (the one that starts before the
    # next engine step): the parts of a step are taken step by step, so they add up to
    # its period even where steps vary (a loaded machine) or one was op-profiled.
    work = sorted((r for r in worker if r.get("tokens") == 1), key=lambda r: r["t"])
    rows, j = [], 0
    for a, b in zip(steps, steps[1:]):
        while j < len(work) and work[j]["t"] < a["t"]:
            j += 1
        w = work[j] if j < len(work) and work[j]["t"] < b["t"] else None
        if w is None or w.get("profiled") or "worker_wait" not in a:
            continue
        rows.append(
            {
                "period": b["t"] - a["t"],
                "wait": a["worker_wait"],
                "execute": w["execute"],
                "forward": w.get("forward", 0.0),
                "lm_head": w.get("lm_head", 0.0),
                "sample": w.get("sample", 0.0),
                "schedule": a.get("schedule"),
                "update_from_output": a.get("update_from_output"),
            }
        )
    if not rows:
        raise BenchError("the worker recorded no decode steps in the timing request")
    m = {k: _ms(r[k] for r in rows) for k in rows[0]}
    period, wait, forward = m["period"], m["wait"], m["forward"]
    out: dict = {
        "itl_ms": itl,
        "tok_s": 1e3 / itl,
        "tokens": counts[-1],
        "chunks": len(chunks),
        "engine_steps": len(steps),
        "worker_steps": len(rows),
        "engine_period": period,
        "engine_loop": period - wait,
        "schedule": m["schedule"],
        "update_from_output": m["update_from_output"],
        "handoffs": wait - m["execute"] - m["sample"],
        "input_prep": m["execute"] - forward - m["lm_head"],
        "forward": forward,
        "lm_head": m["lm_head"],
        "sampling": m["sample"],
    }
    if ops and ops.get("forwards") and ops_per_step(ops)["forward_profiled"] > 0:
        # The profiled request's split of its forward, applied to the timing request's
        # forward (the profiler's own cost, and the load of a shared machine, differ
        # between the two requests; the fractions travel better than the times).
        o = ops_per_step(ops)
        scale = forward / o["forward_profiled"]
        for k in ("gemm", "attention", "other_ops"):
            out[k] = o[k] * scale
        out["dispatch"] = forward - out["gemm"] - out["attention"] - out["other_ops"]
        out["ops"] = o
    else:
        out.update(gemm=None, attention=None, other_ops=None, dispatch=forward)
    out["unaccounted"] = itl - period
    parts = [out[k] for k, _ in STEP_PARTS if out.get(k) is not None]
    out["sum_of_parts"] = sum(parts)
    api_steps = [r for r in api if t_first <= r["t"] < t_last + 0.05]
    out["process_outputs"] = _ms(r["process_outputs"] for r in api_steps)
    out["engine_to_api"] = _ms(r.get("from_engine") for r in api_steps)
    if cpu_s:
        out["cpu_ms_per_token"] = {k: v * 1e3 / counts[-1] for k, v in cpu_s.items()}
        out["api_server"] = out["cpu_ms_per_token"].get("api")
    return out


# ----------------------------------------------------------------------------- the run


def _roles(root: int) -> dict[str, int]:
    """pid of the API server (the root), the engine core and the worker."""
    out = {"api": root}
    for p in descendants(root):
        try:
            title = " ".join(p.cmdline()) + " " + p.name()
        except Exception:  # gone, or not ours to read
            continue
        if "EngineCore" in title:
            out.setdefault("engine", p.pid)
        elif "Worker" in title:
            out.setdefault("worker", p.pid)
    return out


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def stream_times(client: httpx.AsyncClient, base: str, prompt, max_tokens: int) -> tuple:
    """One greedy streamed completion: the monotonic arrival time of each token chunk,
    and the completion tokens streamed up to it (vLLM's continuous usage stats)."""
    body = {
        "model": SERVED_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    times, counts = [], []
    async with client.stream("POST", f"{base}/v1/completions", json=body) as r:
        if r.status_code != 200:
            text = (await r.aread()).decode(errors="replace")
            raise BenchError(f"the server refused a request ({r.status_code}): {text[:300]}")
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                msg = json.loads(line[6:])
                if msg.get("choices"):
                    times.append(time.monotonic())
                    usage = msg.get("usage") or {}
                    counts.append(usage.get("completion_tokens") or len(times))
    return times, counts


def _load(run_dir: Path, prefix: str) -> list[dict]:
    out = []
    for f in sorted(run_dir.glob(f"{prefix}-*.json")):
        try:
            out += json.loads(f.read_text())["records"]
        except (OSError, ValueError, KeyError):
            pass
    return out


def _wait_written(run_dir: Path, after: float, timeout: float = 15.0) -> None:
    """Until each role's file was written after ``after`` (its idle write)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        ok = all(
            any(f.stat().st_mtime >= after for f in run_dir.glob(f"{role}-*.json"))
            for role in ("api", "engine", "worker")
        )
        if ok:
            return
        time.sleep(0.2)


async def _drive(base, proc, log_path, prompt, ns, run_dir: Path) -> tuple:
    async with httpx.AsyncClient(timeout=httpx.Timeout(ns.timeout, connect=5.0)) as client:
        deadline = time.monotonic() + ns.timeout
        while True:
            if proc.poll() is not None:
                raise BenchError(
                    f"the server exited with code {proc.returncode} (log: {log_path}):\n"
                    + log_tail(log_path)
                )
            try:
                if (await client.get(f"{base}/health", timeout=1.0)).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise BenchError(f"the server was not ready in time (log: {log_path})")
            await asyncio.sleep(0.2)
        roles = _roles(proc.pid)
        await stream_times(client, base, prompt, ns.warmup_tokens)
        timings = []
        for _ in range(ns.repeats):
            await asyncio.sleep(0.5)
            cpu0 = {k: cpu_seconds(p) for k, p in roles.items()}
            chunks, counts = await stream_times(client, base, prompt, ns.tokens)
            cpu = {k: cpu_seconds(p) - cpu0[k] for k, p in roles.items()}
            timings.append((chunks, counts, cpu))
        ops = None
        if ns.ops_steps > 0:
            await asyncio.sleep(0.5)
            (run_dir / step_profile.OPS_REQUEST).write_text(str(ns.ops_steps))
            await stream_times(client, base, prompt, ns.ops_steps + 4)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not list(run_dir.glob("ops-*.json")):
                await asyncio.sleep(0.2)
            files = list(run_dir.glob("ops-[0-9]*.json"))
            ops = json.loads(files[0].read_text()) if files else None
        return timings, ops, roles


def analyse(run_dir: Path) -> dict:
    """The breakdown of a run directory's timing requests (client.json and the server's
    records): the least disturbed request's (the lowest engine period: on a shared
    machine, others' work only adds time) among those whose accounting closes, with
    every request's totals."""
    client = json.loads((run_dir / "client.json").read_text())
    ops = client["ops"]
    engine, worker, api = (_load(run_dir, r) for r in ("engine", "worker", "api"))
    each = [
        breakdown(q["chunks"], engine, worker, api, ops, q["cpu_s"], q["counts"])
        for q in client["requests"]
    ]
    # a request whose client read its tokens in a burst (the harness itself starved of
    # CPU: chunks 0 ms apart) says little about the latency: only if all did
    closes = [r for r in each if abs(r["unaccounted"]) <= 0.25 * r["itl_ms"] + 0.5] or each
    result = dict(min(closes, key=lambda r: r["engine_period"]))
    result["requests"] = [
        {k: r[k] for k in ("itl_ms", "engine_period", "unaccounted", "forward")} for r in each
    ]
    return result


def profile_one(ns, model_dir: Path, label: str, mode: str, out: Path) -> dict:
    """Start a server in ``mode``, measure, stop it; the result dictionary."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    q = f"-{ns.quantization}" if ns.quantization else ""
    run_dir = (out / f"{label}{q}-{mode}-{stamp}").resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    contender = CONTENDERS["plugin"]
    if ns.quantization:
        contender = replace(contender, args=("--quantization", ns.quantization))
    env = contender_env(contender)
    env.update(dict(kv.split("=", 1) for kv in ns.env))
    env[step_profile.SETTING] = str(run_dir)
    if mode == "compiled" and not ns.no_kernel_labels:
        # Inductor's C++ kernels under their own names in the profiler; compiled into a
        # cache of their own (the labels change the generated code).
        env["TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE"] = "1"
        env.setdefault("VLLM_CACHE_ROOT", str((out / "compile-cache").resolve()))
    port = free_port()
    cmd = server_command(contender, str(model_dir), port, ns.dtype, mode, ns.max_model_len)
    log_path = run_dir / "server.log"
    from vllm_x86.tools.bench.workload import _encoder

    prompt = _encoder(model_dir)(PROMPT)
    _say(f"{label} {mode}: starting the server (log: {log_path})")
    load0 = os.getloadavg()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            timings, ops, roles = asyncio.run(
                _drive(f"http://127.0.0.1:{port}", proc, log_path, prompt, ns, run_dir)
            )
            load1 = os.getloadavg()
            _wait_written(run_dir, time.time())
        finally:
            stop_group(proc)
    raw = [{"chunks": c, "counts": n, "cpu_s": cpu} for c, n, cpu in timings]
    (run_dir / "client.json").write_text(json.dumps({"requests": raw, "ops": ops}))
    result = analyse(run_dir)
    result.update(
        {
            "label": label,
            "mode": mode,
            "quantization": ns.quantization,
            "dtype": ns.dtype,
            "env": ns.env,
            "command": cmd,
            "roles": roles,
            "loadavg_before": load0,
            "loadavg_after": load1,
            "kernel_labels": bool(ops and any("cpp_fused" in n for n in ops.get("ops", {}))),
            "run_dir": str(run_dir),
        }
    )
    return result


# ----------------------------------------------------------------------------- report


def _f(v, digits: int = 2) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def config_name(r: dict) -> str:
    q = f", {r['quantization']}" if r.get("quantization") else f", {r.get('dtype', '')}"
    return f"{r['label']}{q}"


def markdown(results: list[dict]) -> str:
    head = ["config", "mode", "ITL (ms)", "tok/s"] + [label for _, label in STEP_PARTS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        row = [config_name(r), r["mode"], _f(r["itl_ms"]), _f(r["tok_s"], 1)]
        row += [_f(r.get(k)) for k, _ in STEP_PARTS]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Beside the step (ms per token; not part of the sum above):", ""]
    head2 = [
        "config",
        "mode",
        "API server CPU",
        "process_outputs",
        "engine→API hand-off",
        "engine core CPU",
        "worker CPU",
        "schedule",
        "update_from_output",
        "load avg",
    ]
    lines += ["| " + " | ".join(head2) + " |", "|" + "---|" * len(head2)]
    for r in results:
        cpu = r.get("cpu_ms_per_token", {})
        load = r.get("loadavg_after") or r.get("loadavg_before") or [None]
        row = [
            config_name(r),
            r["mode"],
            _f(cpu.get("api")),
            _f(r.get("process_outputs"), 3),
            _f(r.get("engine_to_api"), 3),
            _f(cpu.get("engine")),
            _f(cpu.get("worker")),
            _f(r.get("schedule"), 3),
            _f(r.get("update_from_output"), 3),
            _f(load[0], 2),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m vllm_x86.tools.bench.overhead",
        description="Where one decode step at 1 request goes (docs/overhead.md).",
    )
    p.add_argument("--model", help="catalog name, model directory or random:SHAPE")
    p.add_argument("--mode", default="eager,compiled", help="eager, compiled or both")
    p.add_argument("--quantization", help="e.g. x86_int4 (quantized while loading)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--tokens", type=int, default=96, help="tokens of the timing request")
    p.add_argument("--warmup-tokens", type=int, default=32)
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timing requests; the one with the lowest engine period is reported",
    )
    p.add_argument("--ops-steps", type=int, default=24, help="decode steps op-profiled")
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--timeout", type=float, default=1200.0)
    p.add_argument("--out", default="out/overhead")
    p.add_argument(
        "--no-kernel-labels",
        action="store_true",
        help="compiled mode: keep Inductor's kernels unlabelled (its compile cache is "
        "then the usual one; the kernels' time falls into Python/dispatch)",
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for the server (the harness clears VLLM_X86_* and VLLM_CPU_* "
        "otherwise), e.g. --env VLLM_X86_OPS=0; repeatable",
    )
    p.add_argument(
        "--recompute",
        action="store_true",
        help="with --report: aggregate each run's raw records again (and update its JSON)",
    )
    p.add_argument("--report", nargs="+", metavar="JSON", help="print the tables of runs")
    return p


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    # a SIGTERM stops the server too (profile_one's finally), as Ctrl-C does
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if ns.report:
            results = []
            for f in ns.report:
                r = json.loads(Path(f).read_text())
                if ns.recompute:  # the aggregation again, from the run's raw records
                    r.update(analyse(Path(r["run_dir"])))
                    Path(f).write_text(json.dumps(r, indent=1))
                results.append(r)
            print(markdown(results))
            return 0
        from vllm_x86.tools.bench.harness import resolve_model

        bad = [kv for kv in ns.env if "=" not in kv]
        if bad:
            raise BenchError(f"--env {bad[0]}: give NAME=VALUE")
        modes = [m.strip() for m in ns.mode.split(",") if m.strip()]
        if not modes or any(m not in ("eager", "compiled") for m in modes):
            raise BenchError(f"--mode {ns.mode}: give eager, compiled or eager,compiled")
        model_dir, label, _ = resolve_model(ns.model)
        label = label.replace("random:", "").replace("/", "-")
        out = Path(ns.out)
        results = []
        for mode in modes:
            r = profile_one(ns, Path(model_dir), label, mode, out)
            q = f"-{ns.quantization}" if ns.quantization else ""
            path = out / f"{label}{q}-{mode}.json"
            path.write_text(json.dumps(r, indent=1))
            _say(f"wrote {path}")
            results.append(r)
        print(markdown(results))
    except BenchError as e:
        print(f"vllm-x86 overhead: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
