"""Speculative decoding on and off, side by side, through the real OpenAI server.

    python -m vllm_x86.tools.bench.speculative                      # default model, ngram
    python -m vllm_x86.tools.bench.speculative --model qwen2.5-coder-0.5b-instruct-q4_k_m \\
        --concurrency 1,4 --rounds 2
    python -m vllm_x86.tools.bench.speculative --draft random:tiny-llama-2l   # draft model
    python -m vllm_x86.tools.bench.speculative --model qwen2.5-coder-1.5b-instruct-q4_k_m \
        --contender plugin-int4-head --draft qwen2.5-coder-0.5b-instruct-q4_k_m
    python -m vllm_x86.tools.bench.speculative --stock              # stock vLLM CPU

What it does (docs/speculative.md):

1. starts two servers of the same model with the same flags, one after the other, and
   keeps both up: ``off`` (no speculation) and ``on`` (``--speculative-config``: n-gram
   prompt lookup by default, or ``--draft MODEL``). Plugin servers are
   ``vllm-x86 serve MODEL --no-daemon`` (contenders.py's ``plugin``, or the server
   contender ``--contender`` names, with its flags and settings: ``plugin-int4-head``
   quantizes to INT4 while loading, and a draft model gets the same ``quantization``),
   ``--stock`` runs vLLM CPU's own server with VLLM_X86_DISABLE=1 (``stock``);
   server.server_command builds both command lines;
2. a short warm-up on each: every workload at every concurrency, 16 tokens;
3. ``--rounds`` rounds; in each, for each workload and concurrency C, both servers in
   turn, the order alternating from one batch to the next (off on, on off, ...), so
   that drift in the machine's other work falls on both: C chat requests at once
   (greedy, ``max_tokens``, streamed with usage), each a different prompt of the
   workload. The ``on`` server's spec-decode counters (``/metrics``:
   ``vllm:spec_decode_num_drafts``, ``..._draft_tokens``, ``..._accepted_tokens``) are
   read before and after each of its batches;
4. prints a markdown table: per workload and C, the median over rounds of the batch's
   output tokens/s (completion tokens of the batch / its wall time, prefill included)
   off and on, their ratio, the acceptance rate (accepted / drafted tokens) and the mean
   acceptance length (1 + accepted / drafts), and how many greedy answers were equal
   with and without speculation (vLLM promises equal greedy output up to the rounding
   of the batched verification; see docs/speculative.md).

Workloads: ``edit`` (Python functions to rewrite with a renamed variable or a typo
fixed: the answer copies most of the prompt, so n-gram drafts come from it) and
``chat`` (open questions: little to copy). Raw samples (every request: text, tokens,
times; every batch: counters, load average) go to ``--out``/RUN/samples.jsonl, the
table to RUN/report.md, the server logs beside them (``out/`` is not in git).

Its own driver rather than the harness (harness.py) or vLLM's ``bench serve``: those
send token-id prompts with ``ignore_eos`` to the completions API, and this needs chat
prompts whose answers copy them, natural ends, the greedy text of both servers to
compare, and the spec-decode counters around each batch.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx

from vllm_x86.tools.bench.contenders import CONTENDERS, BenchError, Contender, contender_env
from vllm_x86.tools.bench.server import SERVED_NAME, server_command, stop_group
from vllm_x86.tools.cli.speculative import NGRAM_DEFAULTS, draft_config  # as `serve` builds them
from vllm_x86.tools.ports import free_port

_CODE = [
    """def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item["price"] * item["quantity"]
    tax = subtotal * tax_rate
    total = subtotal + tax
    return round(total, 2)
""",
    """def count_words(text):
    counts = {}
    for word in text.lower().split():
        word = word.strip(".,;:!?")
        if not word:
            continue
        counts[word] = counts.get(word, 0) + 1
    return sorted(counts.items(), key=lambda kv: kv[1], reverse=True)
""",
    """class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from an empty stack")
        return self.items.pop()

    def peek(self):
        return self.items[-1] if self.items else None
""",
    """def binary_search(values, target):
    low, high = 0, len(values) - 1
    while low <= high:
        middle = (low + high) // 2
        if values[middle] == target:
            return middle
        if values[middle] < target:
            low = middle + 1
        else:
            high = middle - 1
    return -1
""",
]

EDIT_PROMPTS = [
    f"Rewrite this Python code with the variable `subtotal` renamed to `net`. "
    f"Answer with the code only.\n\n```python\n{_CODE[0]}```",
    f"Fix the typo in this Python code (`retrun` should be `return`). Answer with the "
    f"code only.\n\n```python\n{_CODE[1].replace('return sorted', 'retrun sorted')}```",
    f"Rewrite this Python class with the attribute `items` renamed to `elements`. "
    f"Answer with the code only.\n\n```python\n{_CODE[2]}```",
    f"Rewrite this Python function with the variable `middle` renamed to `mid`. "
    f"Answer with the code only.\n\n```python\n{_CODE[3]}```",
]

CHAT_PROMPTS = [
    "What are three good habits for staying healthy?",
    "Explain what a hash table is to a beginner.",
    "Write a short story about a robot that learns to paint.",
    "Why is the sky blue?",
]

WORKLOADS = {"edit": EDIT_PROMPTS, "chat": CHAT_PROMPTS}

COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def _say(msg: str) -> None:
    print(f"[speculative] {msg}", file=sys.stderr, flush=True)


def spec_counters(metrics_text: str) -> dict[str, float] | None:
    """vLLM's spec-decode counters from a /metrics page, summed over engines; None when
    the page has none (no speculation configured)."""
    out: dict[str, float] = {}
    for name, value in re.findall(
        r"^vllm:spec_decode_(num_drafts|num_draft_tokens|num_accepted_tokens)_total\{[^}]*\} (\S+)$",
        metrics_text,
        re.M,
    ):
        out[name] = out.get(name, 0.0) + float(value)
    return out or None


def acceptance(before: dict | None, after: dict | None) -> dict:
    """Acceptance rate and mean acceptance length between two counter readings."""
    if not before or not after:
        return {"drafts": None, "draft_tokens": None, "accepted": None}
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in COUNTERS}
    return {
        "drafts": d["num_drafts"],
        "draft_tokens": d["num_draft_tokens"],
        "accepted": d["num_accepted_tokens"],
    }


async def chat_request(client: httpx.AsyncClient, base: str, prompt: str, max_tokens: int) -> dict:
    """One greedy streamed chat completion; times are time.perf_counter() values."""
    body = {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t_send = time.perf_counter()
    t_first = t_last = None
    parts: list[str] = []
    usage = None
    async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            text = (await r.aread()).decode(errors="replace")
            raise BenchError(f"the server refused a request ({r.status_code}): {text[:300]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            msg = json.loads(line[6:])
            if msg.get("usage"):
                usage = msg["usage"]
            for ch in msg.get("choices") or []:
                piece = (ch.get("delta") or {}).get("content")
                if piece:
                    now = time.perf_counter()
                    t_first = t_first or now
                    t_last = now
                    parts.append(piece)
    t_end = time.perf_counter()
    return {
        "t_send": t_send,
        "t_first": t_first,
        "t_last": t_last or t_end,
        "t_end": t_end,
        "tokens": usage["completion_tokens"] if usage else None,
        "text": "".join(parts),
    }


class Server:
    """One server of the pair, started and ready; ``stop()`` ends its process group."""

    def __init__(self, label: str, cmd: list[str], env: dict, log_path: Path, port: int):
        self.label = label
        self.cmd = cmd
        self.base = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        with open(log_path, "w") as log:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            self.proc = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_ready(self, timeout_s: float) -> float:
        t0 = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise BenchError(
                    f"the {self.label} server exited with code {self.proc.returncode} "
                    f"(log: {self.log_path}):\n{tail}"
                )
            try:
                if httpx.get(f"{self.base}/health", timeout=2).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > timeout_s:
                raise BenchError(f"the {self.label} server was not ready in {timeout_s:.0f} s")
            time.sleep(0.5)

    def counters(self) -> dict | None:
        return spec_counters(httpx.get(f"{self.base}/metrics", timeout=10).text)

    def stop(self) -> None:
        stop_group(self.proc)


async def run_batch(srv: Server, prompts: list[str], max_tokens: int, timeout_s: float) -> dict:
    before = srv.counters()
    load_before = os.getloadavg()[0]
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0)) as client:
        t0 = time.perf_counter()
        reqs = await asyncio.gather(
            *(chat_request(client, srv.base, p, max_tokens) for p in prompts)
        )
        wall = time.perf_counter() - t0
    after = srv.counters()
    tokens = sum(r["tokens"] or 0 for r in reqs)
    for r in reqs:
        for k in ("t_send", "t_first", "t_last", "t_end"):
            r[k] = None if r[k] is None else round(r[k] - t0, 6)
    return {
        "server": srv.label,
        "tokens": tokens,
        "wall_s": wall,
        "tok_s": tokens / wall,
        "load1": [load_before, os.getloadavg()[0]],
        **acceptance(before, after),
        "requests": reqs,
    }


def _median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(samples: list[dict]) -> list[dict]:
    """One row per (workload, concurrency) from the batch samples."""
    rows = []
    keys = sorted({(s["workload"], s["concurrency"]) for s in samples}, key=lambda k: (k[0], k[1]))
    for w, c in keys:
        mine = [s for s in samples if s["workload"] == w and s["concurrency"] == c]
        off = [s for s in mine if s["server"] == "off"]
        on = [s for s in mine if s["server"] == "on"]
        off_tps = _median([s["tok_s"] for s in off])
        on_tps = _median([s["tok_s"] for s in on])
        drafted = sum(s["draft_tokens"] or 0 for s in on)
        accepted = sum(s["accepted"] or 0 for s in on)
        drafts = sum(s["drafts"] or 0 for s in on)
        same = total = 0
        for a, b in zip(off, on):  # the same round: the same prompts in the same order
            for ra, rb in zip(a["requests"], b["requests"]):
                total += 1
                same += ra["text"] == rb["text"]
        rows.append(
            {
                "workload": w,
                "concurrency": c,
                "rounds": min(len(off), len(on)),
                "off_tok_s": off_tps,
                "on_tok_s": on_tps,
                "ratio": on_tps / off_tps if on_tps and off_tps else None,
                "acceptance_rate": accepted / drafted if drafted else None,
                "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
                "drafted_tokens": drafted,
                "same_text": f"{same}/{total}",
                "off_all": [round(s["tok_s"], 2) for s in off],
                "on_all": [round(s["tok_s"], 2) for s in on],
            }
        )
    return rows


def _f(v, fmt: str) -> str:
    return "–" if v is None else format(v, fmt)


def render(rows: list[dict], meta: dict) -> str:
    lines = [
        f"{meta['model']} · {meta['server']} ({meta.get('contender', 'plugin')}) · "
        f"{meta['mode']} · speculation: "
        f"`{meta['speculative_config']}` · max_tokens {meta['max_tokens']} · "
        f"load average {meta['load1_min']:.1f}–{meta['load1_max']:.1f}",
        "",
        "| workload | requests | off tok/s | on tok/s | on/off | acceptance rate "
        "| mean acceptance length | same greedy text |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['concurrency']} | {_f(r['off_tok_s'], '.1f')} "
            f"| {_f(r['on_tok_s'], '.1f')} | {_f(r['ratio'], '.2f')}x "
            f"| {_f(r['acceptance_rate'] and 100 * r['acceptance_rate'], '.0f')} % "
            f"| {_f(r['mean_acceptance_length'], '.2f')} | {r['same_text']} |"
        )
    return "\n".join(lines)


def _levels(s: str) -> list[int]:
    try:
        out = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{s}' is not a list of numbers like 1,4") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("concurrency levels are numbers of 1 or more")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m vllm_x86.tools.bench.speculative",
        description="Speculative decoding on and off, alternating, through the OpenAI "
        "server: tokens/s, acceptance rate, same greedy text (docs/speculative.md).",
    )
    p.add_argument(
        "--model",
        default=None,
        help="catalog name, model directory or random:SHAPE (default: the default model)",
    )
    p.add_argument(
        "--draft",
        default=None,
        help="a draft model (directory or random:SHAPE, sharing the model's tokenizer) "
        "instead of n-gram prompt lookup",
    )
    p.add_argument(
        "--speculative-config",
        default=None,
        help="vLLM's --speculative-config JSON for the 'on' server (overrides the n-gram "
        "defaults and --draft)",
    )
    p.add_argument("--workloads", default="edit,chat", help="edit, chat (default: both)")
    p.add_argument("--concurrency", type=_levels, default=[1, 4], help="default: 1,4")
    p.add_argument("--rounds", type=int, default=2, help="default: 2")
    p.add_argument("--max-tokens", type=int, default=160, help="default: 160")
    p.add_argument("--mode", choices=("eager", "compiled"), default="eager")
    p.add_argument("--stock", action="store_true", help="stock vLLM CPU (VLLM_X86_DISABLE=1)")
    p.add_argument(
        "--contender",
        default=None,
        help="the harness's server contender both servers run as (its flags and "
        "settings, e.g. plugin-int4-head); a draft model gets its --quantization "
        "(default: plugin, or stock with --stock)",
    )
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--timeout", type=float, default=900.0, help="per start and per batch (s)")
    p.add_argument("--out", default="out/speculative", help="default: %(default)s")
    return p


def base_contender(ns: argparse.Namespace) -> Contender:
    """The server contender both servers run as: ``--contender``, else plugin or stock."""
    name = ns.contender or ("stock" if ns.stock else "plugin")
    c = CONTENDERS.get(name)
    if c is None or not c.is_server:
        servers = ", ".join(n for n, x in CONTENDERS.items() if x.is_server)
        raise BenchError(f"'{name}' is not a server contender: use one of {servers}")
    if ns.stock and c.kind != "vllm-server":
        raise BenchError(f"--stock runs stock vLLM's server; '{name}' is a plugin contender")
    return c


def on_config(ns: argparse.Namespace, base: Contender | None = None) -> str:
    if ns.speculative_config:
        return ns.speculative_config
    if ns.draft:
        from vllm_x86.tools.bench.harness import resolve_model

        path, _, _ = resolve_model(ns.draft)
        # as `serve --speculative draft:`: quantized as the model it drafts for
        quant = base.quantization if base is not None else None
        return json.dumps(draft_config(str(path), quant))
    return json.dumps({"method": "ngram", **NGRAM_DEFAULTS})


def run(ns: argparse.Namespace) -> dict:
    from vllm_x86.tools.bench.harness import resolve_model

    workloads = [w.strip() for w in ns.workloads.split(",") if w.strip()]
    for w in workloads:
        if w not in WORKLOADS:
            raise BenchError(f"unknown workload '{w}': use {', '.join(WORKLOADS)}")
    model_dir, label, _ = resolve_model(ns.model)
    base = base_contender(ns)
    spec = on_config(ns, base)
    run_dir = Path(ns.out) / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    servers: dict[str, Server] = {}
    try:
        for name, extra in (("off", ()), ("on", ("--speculative-config", spec))):
            port = free_port()
            c = replace(base, args=base.args + extra)
            cmd = server_command(c, str(model_dir), port, "bfloat16", ns.mode, ns.max_model_len)
            _say(f"starting the '{name}' server: {' '.join(cmd[2:])}")
            srv = Server(name, cmd, contender_env(c), run_dir / f"server-{name}.log", port)
            servers[name] = srv
            _say(f"'{name}' ready in {srv.wait_ready(ns.timeout):.0f} s")
        for srv in servers.values():  # warm-up: every workload and batch size, short
            for w in workloads:
                for c in sorted(set(ns.concurrency)):
                    asyncio.run(run_batch(srv, WORKLOADS[w][-1:] * c, 16, ns.timeout))
        samples: list[dict] = []
        flip = 0
        with open(run_dir / "samples.jsonl", "w") as raw:
            for rnd in range(ns.rounds):
                for w in workloads:
                    prompts = WORKLOADS[w]
                    for c in ns.concurrency:
                        batch = [prompts[(rnd + i) % len(prompts)] for i in range(c)]
                        order = ("off", "on") if flip % 2 == 0 else ("on", "off")
                        flip += 1
                        for name in order:
                            s = asyncio.run(
                                run_batch(servers[name], batch, ns.max_tokens, ns.timeout)
                            )
                            s.update(round=rnd, workload=w, concurrency=c)
                            samples.append(s)
                            raw.write(json.dumps(s) + "\n")
                            raw.flush()
                            _say(
                                f"round {rnd + 1} {w} x{c} {name}: {s['tok_s']:.1f} tok/s "
                                f"(load {s['load1'][1]:.1f})"
                            )
    finally:
        for srv in servers.values():
            srv.stop()
    loads = [x for s in samples for x in s["load1"]]
    meta = {
        "model": label,
        "server": "stock vLLM CPU" if base.kind == "vllm-server" else "vllm-x86 serve",
        "contender": base.name,
        "mode": ns.mode,
        "speculative_config": spec,
        "max_tokens": ns.max_tokens,
        "load1_min": min(loads),
        "load1_max": max(loads),
        "commands": {k: s.cmd for k, s in servers.items()},
        "argv": sys.argv,
    }
    rows = summarize(samples)
    report = render(rows, meta)
    (run_dir / "report.md").write_text(report + "\n")
    (run_dir / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(report)
    _say(f"raw samples in {run_dir}")
    return {"meta": meta, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        run(ns)
    except BenchError as e:
        print(f"vllm-x86 bench speculative: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
