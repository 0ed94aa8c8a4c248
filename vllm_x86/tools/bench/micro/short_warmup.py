"""Compiled starts from a filled compile cache: the worker's short warm-up against vLLM's.

    .venv/bin/python vllm_x86/tools/bench/micro/short_warmup.py --model random:qwen3-0.6b --rounds 2

One priming start of `vllm-x86 serve` (compiled mode) fills a compile cache in a fresh
directory; then starts alternate on that cache (A B A B ...): with the worker's short
warm-up (the default) and with `VLLM_X86_SHORT_WARMUP=0` (vLLM's profile run at the
maximum batch). Each start is timed from launch to /health, then gets a first prompt of
about 500 tokens (1 new token: the first prefill after the warm-up), and 16 greedy
tokens of a short prompt, whose text must be the same everywhere. Reports medians
(min-max) and their ratio. Absolute times are for orientation only on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from vllm_x86.tools.bench.synthetic import build

PORT = 47190


def start(model: Path, cache: Path, short: bool, log: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_X86_", "VLLM_CPU_"))}
    env.update(VLLM_X86_CACHE_DIR=str(cache), VLLM_X86_SHORT_WARMUP="1" if short else "0")
    cmd = [sys.executable, "-m", "vllm_x86.tools.cli", "serve", str(model), "--no-daemon",
           "--host", "127.0.0.1", "--port", str(PORT), "--dtype", "bfloat16",
           "--max-model-len", "2048", "--served-model-name", "bench"]  # fmt: skip
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    base = f"http://127.0.0.1:{PORT}"
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited with {proc.returncode}: see {log}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        ready = time.perf_counter() - t0

        def ask(prompt: str, n: int) -> tuple[float, str]:
            t = time.perf_counter()
            r = httpx.post(f"{base}/v1/completions", timeout=300, json={
                "model": "bench", "prompt": prompt, "max_tokens": n, "temperature": 0})  # fmt: skip
            r.raise_for_status()
            return time.perf_counter() - t, r.json()["choices"][0]["text"]

        first, _ = ask(" ".join(["word"] * 500), 1)
        _, text = ask("The capital of France is", 16)
        short_seen = "warming up with" in log.read_text()
        return {"ready": ready, "first_prefill": first, "text": text, "short_seen": short_seen}
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:qwen3-0.6b", help="path or random:SHAPE")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args(argv)
    model = build(a.model.split(":", 1)[1]) if a.model.startswith("random:") else Path(a.model)
    with tempfile.TemporaryDirectory(prefix="vllm-x86-short-warmup-") as tmp:
        cache, logs = Path(tmp) / "cache", Path(tmp)
        print("priming start (compiles into an empty cache) ...", flush=True)
        prime = start(model, cache, True, logs / "prime.log")
        runs: dict[str, list[dict]] = {"short": [], "vllm": []}
        for r in range(a.rounds):
            for name in ("short", "vllm"):
                res = start(model, cache, name == "short", logs / f"r{r}-{name}.log")
                runs[name].append(res)
                print(f"round {r + 1} {name}: ready {res['ready']:.1f} s, first 500-token "
                      f"prompt {res['first_prefill']:.3f} s", flush=True)  # fmt: skip
    assert not prime["short_seen"], "the priming start compiled: it must not warm up short"
    assert all(x["short_seen"] for x in runs["short"]) and not any(
        x["short_seen"] for x in runs["vllm"]
    ), "a start did not take the warm-up it was asked for"

    def fig(name: str, key: str) -> str:
        v = [x[key] for x in runs[name]]
        return f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"

    print("\n| figure (s), median (min-max) | short warm-up | vLLM's warm-up | ratio |")
    print("|---|---|---|---|")
    for key, label in (("ready", "launch to /health"), ("first_prefill", "first 500-token prompt")):
        ratio = statistics.median(x[key] for x in runs["short"]) / statistics.median(
            x[key] for x in runs["vllm"]
        )
        print(f"| {label} | {fig('short', key)} | {fig('vllm', key)} | {ratio:.2f}x |")
    texts = {x["text"] for x in [prime, *runs["short"], *runs["vllm"]]}
    print(f"\ngreedy text (16 tokens): {'the same from every start' if len(texts) == 1 else texts}")
    return 0 if len(texts) == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
