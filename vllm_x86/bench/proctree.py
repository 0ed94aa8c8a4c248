"""Peak memory of a whole process tree (a server and the engine processes it starts).

Two figures, both summed over every process of the tree:

- ``peak_rss_mib``: each process's own peak RSS as the kernel records it (``VmHWM`` in
  /proc/PID/status, exact, read at every sample and once more before the tree is
  stopped), added up. Processes may peak at different moments, so this is an upper
  bound of the tree's RSS at any one moment; and RSS counts pages that processes share
  (the torch and vLLM libraries, copy-on-write memory after fork) once per process.
- ``peak_pss_mib``: the largest sum of PSS seen in the samples (every 0.25 s). PSS
  splits each shared page between the processes that map it, so the sum is the tree's
  real share of memory; being sampled, it can miss a peak shorter than the interval.
"""

from __future__ import annotations

import threading

import psutil

MiB = 1 << 20


def _hwm_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class TreeMemorySampler:
    """Samples a process tree every `interval` seconds in a background thread."""

    def __init__(self, pid: int, interval: float = 0.25):
        self.pid = pid
        self.interval = interval
        self.hwm: dict[int, int] = {}  # pid -> peak RSS seen (VmHWM)
        self.peak_rss_sampled = 0
        self.peak_pss = 0
        self.peak_procs = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-memory", daemon=True)

    def __enter__(self) -> TreeMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.sample()  # a last look before the tree is stopped

    def sample(self) -> None:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        rss = pss = 0
        for p in procs:
            try:
                m = p.memory_full_info()
            except psutil.Error:
                continue
            rss += m.rss
            pss += getattr(m, "pss", m.rss)
            hwm = _hwm_bytes(p.pid)
            if hwm is not None:
                self.hwm[p.pid] = max(self.hwm.get(p.pid, 0), hwm)
        self.samples += 1
        self.peak_rss_sampled = max(self.peak_rss_sampled, rss)
        self.peak_pss = max(self.peak_pss, pss)
        self.peak_procs = max(self.peak_procs, len(procs))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def result(self) -> dict:
        return {
            "peak_rss_mib": sum(self.hwm.values()) / MiB,
            "peak_rss_sampled_mib": self.peak_rss_sampled / MiB,
            "peak_pss_mib": self.peak_pss / MiB,
            "peak_processes": self.peak_procs,
            "memory_samples": self.samples,
        }
