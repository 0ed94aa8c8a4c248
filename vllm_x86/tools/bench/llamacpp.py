"""One measurement of llama.cpp (through llama-cpp-python) in a fresh process.

The parent (`measure_llamacpp`) launches ``python -m vllm_x86.tools.bench.llamacpp`` with
the GGUF file, the prompts and the launch time, samples the process's memory, and
reads one ``RESULT {json}`` line back. The child loads the model with the ``Llama``
class (one thread per CPU it may run on) and does what the server contenders do, in
the same order, on the same token ids, greedy: a 1-token request as soon as the model
is loaded (``startup_s`` runs from the parent's launch to its first token), a warm-up,
TTFT of each long prompt, then decode of ``new_tokens`` tokens for one request.

Decode at more than one concurrent request is not applicable: a ``Llama`` object
decodes one sequence at a time (no continuous batching), and llama-cpp-python's own
server takes one request at a time. The report says so instead of giving numbers.
Unlike the vLLM contenders (timed over HTTP, with detokenisation in the server), this
one is timed in-process: it pays no HTTP or streaming cost.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

from vllm_x86.tools.bench.contenders import BenchError
from vllm_x86.tools.bench.proctree import MiB, TreeMonitor
from vllm_x86.tools.bench.server import log_tail, relative_times, stop_group, summarize_batch
from vllm_x86.tools.bench.workload import PromptSet, Workload

NOT_APPLICABLE = (
    "n/a: llama-cpp-python's Llama decodes one sequence at a time (no continuous "
    "batching; its server serves one request at a time)"
)
NOT_APART = (
    "n/a: llama.cpp's KV cache (allocated for its whole context at load) is part of its "
    "process's memory and not told apart"
)


def crash_hint(returncode: int | None) -> str:
    """A sentence for a llama.cpp killed by a signal: a native build of llama-cpp-python
    on a CPU with AMX compiles its AMX code, which GCC before 13.2 miscompiles (a crash at
    the first decode, with nothing in the log)."""
    if returncode not in (-signal.SIGSEGV, -signal.SIGILL, -signal.SIGBUS):
        return ""
    from vllm_x86.tools.bench.contenders import llamacpp_install

    return (
        f"\nllama.cpp died of signal {-returncode}. If llama-cpp-python was built natively "
        "on this CPU (a plain `pip install`), rebuild it without AMX code: "
        f"{llamacpp_install()} --force-reinstall --no-deps --no-cache-dir"
    )


def measure_llamacpp(
    gguf: Path,
    env: dict[str, str],
    prompts: PromptSet,
    w: Workload,
    log_path: Path,
    work_dir: Path,
    timeout_s: float = 1200.0,
) -> dict:
    work_dir.mkdir(parents=True, exist_ok=True)
    prompts_path = work_dir / "prompts.json"
    prompts_path.write_text(json.dumps(prompts.to_json()))
    threads = len(os.sched_getaffinity(0))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t_launch_wall = time.time()
    cmd = [
        sys.executable, "-m", "vllm_x86.tools.bench.llamacpp",
        "--gguf", str(gguf),
        "--prompts", str(prompts_path),
        "--workload", json.dumps(w.to_json()),
        "--threads", str(threads),
        "--t-launch", repr(t_launch_wall),
    ]  # fmt: skip
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True
        )
        try:
            # PSS from the child itself, read after its timed work (proctree: reading it
            # costs the CPU being timed)
            with TreeMonitor(proc.pid, pss=False) as sampler:
                out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise BenchError(f"llama.cpp did not finish in {timeout_s:.0f} s") from None
        finally:
            stop_group(proc, grace_s=5)
    result = None
    for line in out.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[7:])
    if proc.returncode != 0 or result is None:
        raise BenchError(
            f"llama.cpp run failed (exit code {proc.returncode}, log: {log_path}):\n"
            + log_tail(log_path)
            + crash_hint(proc.returncode)
        )
    result.update(sampler.result())
    # the child's own figures are exact even if it exited between two samples
    result["peak_rss_mib"] = max(result["peak_rss_mib"], result.pop("self_peak_rss_mib"))
    result["peak_pss_mib"] = result.pop("self_pss_mib")
    missed_cpu = result.pop("self_cpu_s") - result["tree_cpu_s"]
    if missed_cpu > 0 and result.get("other_cpu_pct") is not None and result["monitored_s"]:
        result["other_cpu_pct"] = max(
            0.0, result["other_cpu_pct"] - 100.0 * missed_cpu / result["monitored_s"]
        )
    result["command"] = cmd
    return result


# ----------------------------------------------------------------------------- child


def _child(args: argparse.Namespace) -> dict:
    from llama_cpp import Llama

    wl = json.loads(args.workload)
    w = Workload(**{**wl, "concurrency": tuple(wl["concurrency"])})
    prompts = json.loads(Path(args.prompts).read_text())
    llm = Llama(
        model_path=args.gguf,
        n_ctx=w.max_model_len,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_batch=512,
        seed=0,
        verbose=False,
    )

    def request(ids: list[int], n: int) -> dict:
        llm.reset()
        out: list[int] = []
        t_send = time.perf_counter()
        t_first = t_last = None
        for tok in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
            t_last = time.perf_counter()
            if t_first is None:
                t_first = t_last
            out.append(tok)
            if len(out) >= n:
                break
        text = llm.detokenize(out).decode("utf-8", errors="replace")
        return {
            "prompt_tokens": len(ids),
            "t_send": t_send,
            "t_first": t_first,
            "t_last": t_last,
            "tokens": len(out),
            "chunks": len(out),
            "text": text,
        }

    first = request(prompts["warmup"], 1)
    first_wall = time.time() - (time.perf_counter() - first["t_first"])
    t0 = first["t_first"] - (first_wall - args.t_launch)  # the launch on perf_counter's clock
    m: dict = {"startup_s": first_wall - args.t_launch}
    raw: dict = {"first_request": relative_times(first, t0)}

    request(prompts["ttft_warmup"], 1)
    request(prompts["warmup_batch"][0], 8)

    ttft = []
    for ids in prompts["ttft"]:
        r = request(ids, 1)
        ttft.append(r["t_first"] - r["t_send"])
    raw["ttft_s"] = ttft
    m["ttft_s"] = statistics.median(ttft)
    m["prefill_tok_s"] = len(prompts["ttft"][0]) / m["ttft_s"]

    for c in w.concurrency:
        if c == 1:
            r = request(prompts["decode"][0], w.new_tokens)
            b = summarize_batch([r], t0)
            m["decode_1_tok_s"] = b["tok_s"]
            m["text"] = r["text"]
            raw["decode_1"] = b
        else:
            m[f"decode_{c}_tok_s"] = None
    m["not_applicable"] = {f"decode_{c}_tok_s": NOT_APPLICABLE for c in w.concurrency if c > 1}
    for key in ("kv_resident_mib", "peak_pss_less_kv_mib"):
        m["not_applicable"][key] = NOT_APART
    m["threads"] = args.threads
    m["raw"] = raw
    # the model still loaded: its largest; read as the monitor reads the others' (psutil)
    m["self_pss_mib"] = psutil.Process().memory_full_info().pss / MiB
    llm.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    m["self_peak_rss_mib"] = usage.ru_maxrss / 1024
    m["self_cpu_s"] = usage.ru_utime + usage.ru_stime
    return m


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="one llama.cpp measurement (run by vllm-x86 bench)")
    p.add_argument("--gguf", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--workload", required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--t-launch", type=float, required=True, help="time.time() at launch")
    args = p.parse_args(argv)
    result = _child(args)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
