"""The machine's memory bandwidth for streaming reads, with 1 thread and all threads.

Two read kernels go over a float32 buffer much larger than the caches, each touching
every byte once: a sum (``Tensor.sum``) and a matrix-vector product (``torch.mv``,
the shape of work a one-request decode does over its weights). Each is timed
``repeats`` times; a figure is the best GB/s (10^9 bytes per second) over kernels and
repeats, because noise on a shared machine only ever makes a read slower. Every
sample is kept in the JSON.

Run in a fresh process (``python -m vllm_x86.tools.bench.bandwidth``, one JSON line on
stdout) so that its threads and its buffer do not stay in the harness.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from vllm_x86.tools.bench.contenders import BenchError


def probe(size_mib: int = 1024, repeats: int = 5, threads: list[int] | None = None) -> dict:
    import torch

    n_all = len(os.sched_getaffinity(0))
    threads = threads or sorted({1, n_all})
    n = size_mib * (1 << 20) // 4
    cols = 4096
    n -= n % cols
    buf = torch.ones(n, dtype=torch.float32)
    mat = buf.view(-1, cols)
    vec = torch.ones(cols, dtype=torch.float32)
    nbytes = n * 4
    kernels = {"sum": lambda: buf.sum(), "gemv": lambda: torch.mv(mat, vec)}
    out: dict = {"buffer_bytes": nbytes, "repeats": repeats, "cpus": n_all, "by_threads": {}}
    before = torch.get_num_threads()
    try:
        for t in threads:
            torch.set_num_threads(t)
            samples: dict[str, list[float]] = {}
            for name, fn in kernels.items():
                fn()  # first touch and warm-up
                gbs = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    fn()
                    gbs.append(nbytes / (time.perf_counter() - t0) / 1e9)
                samples[name] = gbs
            best = max(max(v) for v in samples.values())
            out["by_threads"][str(t)] = {"gb_s": best, "samples_gb_s": samples}
    finally:
        torch.set_num_threads(before)
    out["gb_s_1_thread"] = out["by_threads"]["1"]["gb_s"]
    out["gb_s_all_threads"] = out["by_threads"][str(max(threads))]["gb_s"]
    out["all_threads"] = max(threads)
    return out


def probe_in_subprocess(size_mib: int = 1024, repeats: int = 5, timeout_s: float = 300) -> dict:
    cmd = [
        sys.executable, "-m", "vllm_x86.tools.bench.bandwidth",
        "--size-mib", str(size_mib), "--repeats", str(repeats),
    ]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if p.returncode != 0:
        raise BenchError(f"the bandwidth probe failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    print(json.dumps(probe(a.size_mib, a.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
