"""One server against copies of it on two hosts behind vLLM's router, side by side.

    python -m vllm_x86.tools.bench.replicas [--model NAME] [--concurrency 32,64]
        [--rounds 2] [--new-tokens 32] [--summary FILE.json]

Two hosts are simulated on this machine (netns.py: two network namespaces on a private
veth link). Three servers of the model run at once, eager: "one server" on host A with
every core (two threads on this 2-core VM), and one replica on each host with one core
each (`taskset`, VLLM_X86_THREADS=1) behind `vllm-router` on host A. Each measurement
sends 2 x concurrency completions (ignore_eos, the same new tokens each) at that
concurrency from host A's namespace, one contender after the other, round by round, and
reports output tokens per second, with the load average before each run.

The harness (harness.py) starts one contender's server at a time on this machine and
cannot place servers on two hosts; this tool does only that part, with the harness's
rules: alternating contenders in one invocation, the machine's other work beside each
figure, no figure asserted anywhere. Needs root (network namespaces) and vllm-router
(requirements-dev.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from vllm_x86.tools.bench import netns
from vllm_x86.tools.bench.server import stop_group

ROUTER = Path(sys.executable).parent / "vllm-router"
CONTENDERS = ("one server", "two replicas + router")


def _wait(pool, url: str, proc: subprocess.Popen, log: Path, timeout: float = 600) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: the process exited:\n{log.read_text()[-3000:]}")
        try:
            if pool.submit(httpx.get, url, timeout=2).result().status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url}: not ready in {timeout} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


def _load(base: str, model: str, conc: int, new: int, hostns: str) -> tuple[float, int]:
    """(output tokens/s, failed requests) of 2 x conc completions at concurrency conc."""
    import httpx

    def one(i: int) -> int:
        body = {"model": model, "prompt": f"Tell a story, number {i}.", "max_tokens": new,
                "ignore_eos": True, "temperature": 0}  # fmt: skip
        r = httpx.post(base + "/v1/completions", json=body, timeout=600)
        return r.json()["usage"]["completion_tokens"] if r.status_code == 200 else -1

    t0 = time.monotonic()
    with ThreadPoolExecutor(conc, initializer=netns.enter_netns, initargs=(hostns,)) as ex:
        counts = list(ex.map(one, range(2 * conc)))
    dt = time.monotonic() - t0
    return sum(c for c in counts if c > 0) / dt, sum(c < 0 for c in counts)


def run(model: str, concurrency: list[int], rounds: int, new: int, workdir: Path) -> dict:
    from vllm_x86.tools.ports import free_port

    why = netns.missing_capability()
    if why:
        raise SystemExit(f"two simulated hosts: {why}")
    if not ROUTER.exists():
        raise SystemExit(f"vllm-router is not installed ({ROUTER}): pip install vllm-router")
    cpus = sorted(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_X86_", "VLLM_CPU_"))}
    procs: dict[str, subprocess.Popen] = {}
    net = netns.TwoHosts()
    a, b = net.hosts
    pool = ThreadPoolExecutor(2, initializer=netns.enter_netns, initargs=(a.netns,))

    def start(name, host, argv, extra_env) -> Path:
        log = workdir / f"{name}.log"
        procs[name] = host.popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                 env={**env, **extra_env}, start_new_session=True)  # fmt: skip
        return log

    def serve(name, host, port, pin, threads) -> Path:
        argv = ["taskset", "-c", ",".join(map(str, pin)), sys.executable, "-m",
                "vllm_x86.tools.cli", "serve", model, "--no-daemon", "--host", host.address,
                "--port", str(port), "--enforce-eager", "--max-model-len", "256"]  # fmt: skip
        return start(name, host, argv, {"VLLM_X86_THREADS": str(threads)})

    try:
        single, replica, router = free_port(), free_port(), free_port()
        urls = {
            "one server": f"http://{a.address}:{single}",
            "two replicas + router": f"http://{a.address}:{router}",
        }
        logs = {
            "single": serve("single", a, single, cpus, len(cpus)),
            "replica-a": serve("replica-a", a, replica, cpus[:1], 1),
            "replica-b": serve("replica-b", b, replica, cpus[-1:], 1),
        }
        _wait(pool, f"{urls['one server']}/health", procs["single"], logs["single"])
        for name, host in (("replica-a", a), ("replica-b", b)):
            url = f"http://{host.address}:{replica}/health"
            _wait(pool, url, procs[name], logs[name])
        logs["router"] = start("router", a, [
            str(ROUTER), "--host", a.address, "--port", str(router),
            "--worker-urls", f"http://{a.address}:{replica}", f"http://{b.address}:{replica}",
            "--policy", "round_robin",
        ], {})  # fmt: skip
        _wait(pool, f"{urls['two replicas + router']}/v1/models", procs["router"], logs["router"])
        for c in CONTENDERS:  # warm-up, not counted
            _load(urls[c], model, 4, new, a.netns)
        samples = []
        for rnd in range(1, rounds + 1):
            for conc in concurrency:
                for c in CONTENDERS:
                    load1 = os.getloadavg()[0]
                    tps, failed = _load(urls[c], model, conc, new, a.netns)
                    samples.append({"round": rnd, "concurrency": conc, "contender": c,
                                    "tok_s": round(tps, 1), "failed": failed,
                                    "load1_before": round(load1, 2)})  # fmt: skip
                    print(f"round {rnd} concurrency {conc:3d} {c:22s} {tps:7.1f} tok/s "
                          f"(failed {failed}; load average before {load1:.1f})", flush=True)  # fmt: skip
    finally:
        for p in procs.values():
            stop_group(p)
        pool.shutdown()
        net.close()
    return summarize(model, concurrency, rounds, new, samples)


def summarize(model, concurrency, rounds, new, samples) -> dict:
    from vllm_x86.runtime import hardware

    table = {}
    for conc in concurrency:
        row = {}
        for c in CONTENDERS:
            vals = [s["tok_s"] for s in samples if s["concurrency"] == conc and s["contender"] == c]
            row[c] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
        ratios = [
            r["tok_s"] / o["tok_s"]
            for r in samples
            for o in samples
            if r["contender"] == CONTENDERS[1] and o["contender"] == CONTENDERS[0]
            and r["round"] == o["round"] and r["concurrency"] == o["concurrency"] == conc
        ]  # fmt: skip
        row["ratio"] = {"median": round(statistics.median(ratios), 3),
                        "min": round(min(ratios), 3), "max": round(max(ratios), 3)}  # fmt: skip
        table[str(conc)] = row
    cpu = hardware.cpu_info()
    return {
        "command": "python -m vllm_x86.tools.bench.replicas " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{cpu.model_name}, {cpu.physical_cores} cores",
        "model": model,
        "new_tokens": new,
        "rounds": rounds,
        "layout": "one server: every core; replicas: one core each on hosts A and B "
        "(network namespaces), vllm-router on A, round robin; all eager",
        "output_tok_s": table,
        "samples": samples,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m vllm_x86.tools.bench.replicas", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--model", default=None, help="catalog name or directory (default model)")
    p.add_argument("--concurrency", default="32,64")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--summary", type=Path, help="write the figures and samples as JSON here")
    p.add_argument("--workdir", type=Path, default=Path("out/replicas"), help="server logs")
    a = p.parse_args(argv)
    from vllm_x86.tools.models.catalog import DEFAULT_MODEL

    a.workdir.mkdir(parents=True, exist_ok=True)
    conc = [int(x) for x in a.concurrency.split(",") if x]
    out = run(a.model or DEFAULT_MODEL, conc, a.rounds, a.new_tokens, a.workdir)
    print("\n| concurrency | one server (tok/s) | two replicas + router (tok/s) | ratio |")
    print("|---|---|---|---|")
    for c, row in out["output_tok_s"].items():
        one, two, r = row[CONTENDERS[0]], row[CONTENDERS[1]], row["ratio"]
        print(f"| {c} | {one['median']:.1f} ({one['min']:.1f}–{one['max']:.1f}) | "
              f"{two['median']:.1f} ({two['min']:.1f}–{two['max']:.1f}) | "
              f"{r['median']:.2f}x ({r['min']:.2f}–{r['max']:.2f}) |")  # fmt: skip
    if a.summary:
        a.summary.write_text(json.dumps(out, indent=1) + "\n")
        print(f"summary: {a.summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
