"""KV cache allocation at start-up: vLLM's torch.zeros against fresh zero pages.

    .venv/bin/python vllm_x86/tools/bench/micro/kv_alloc.py --gib 1 --rounds 5

Side by side, alternating in one process (A B A B ...): vLLM's allocation
(``torch.zeros(bytes, dtype=torch.int8)``, what ``allocate_kv_cache`` does) and the
plugin's (``vllm_x86.runtime.startup.kv_alloc.zero_pages``), each followed by what a first request of
``--touch-mib`` MiB of cache writes, with the compute threads of a worker (2 by
default). Reports medians (min-max) of the allocation time, the first-request write and
the sum, and their ratios. Absolute times are for orientation only on a shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vllm_x86.runtime.startup.kv_alloc import zero_pages


def _zeros(nbytes: int) -> torch.Tensor:
    return torch.zeros(nbytes, dtype=torch.int8)


def _pages(nbytes: int) -> torch.Tensor:
    return zero_pages(nbytes, torch.int8)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="cache size (default 1 GiB)")
    ap.add_argument("--touch-mib", type=float, default=16.0, help="written after allocating")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    nbytes = int(a.gib * (1 << 30))
    touch = int(a.touch_mib * (1 << 20))
    res: dict[str, dict[str, list[float]]] = {
        name: {"alloc": [], "touch": []} for name in ("torch.zeros", "zero pages")
    }
    for _ in range(a.rounds):
        for name, fn in (("torch.zeros", _zeros), ("zero pages", _pages)):
            t0 = time.perf_counter()
            buf = fn(nbytes)
            t1 = time.perf_counter()
            buf[:touch].fill_(1)
            t2 = time.perf_counter()
            assert int(buf[touch : touch + 4096].sum()) == 0  # the rest is still zero
            res[name]["alloc"].append(t1 - t0)
            res[name]["touch"].append(t2 - t1)
            del buf

    def med(xs: list[float]) -> str:
        return f"{statistics.median(xs) * 1e3:.1f} ({min(xs) * 1e3:.1f}-{max(xs) * 1e3:.1f})"

    print(f"{a.gib:g} GiB cache, first request writes {a.touch_mib:g} MiB, {a.rounds} rounds, ms")
    print("| allocation | allocate | first write | sum |")
    print("|---|---|---|---|")
    for name, r in res.items():
        tot = [x + y for x, y in zip(r["alloc"], r["touch"], strict=True)]
        print(f"| {name} | {med(r['alloc'])} | {med(r['touch'])} | {med(tot)} |")
    z = [x + y for x, y in zip(*res["torch.zeros"].values(), strict=True)]
    p = [x + y for x, y in zip(*res["zero pages"].values(), strict=True)]
    ratios = [zz / pp for zz, pp in zip(z, p, strict=True)]
    print(
        f"sum, torch.zeros / zero pages per round: median {statistics.median(ratios):.0f}x "
        f"({min(ratios):.0f}-{max(ratios):.0f}x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
