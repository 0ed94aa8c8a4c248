"""What a contender's process tree used (peak memory) and what else ran meanwhile.

Memory, summed over every process of the tree:

- ``peak_rss_mib``: each process's own peak RSS as the kernel records it (``VmHWM`` in
  /proc/PID/status, exact, read at every sample and once more before the tree is
  stopped), added up. Processes may peak at different moments, so this is an upper
  bound of the tree's RSS at any one moment; and RSS counts pages that processes share
  (the torch and vLLM libraries, copy-on-write memory after fork) once per process.
- ``peak_pss_mib``: the largest sum of PSS seen in the samples. PSS splits each shared
  page between the processes that map it, so the sum is the tree's real share of
  memory; being sampled, it can miss a peak between two samples.
- ``kv_resident_mib`` and ``peak_pss_less_kv_mib``, where the monitor is told where the
  KV cache lies (``kv_ranges``: the plugin's engine logs its cache's address ranges): the
  most of the cache's pages seen resident, counted page by page in /proc/PID/pagemap
  (present or swapped; the cache is the engine's private memory, so those pages count
  whole in its PSS), and the largest PSS sum less them. The KV cache is reserved at
  start but claimed page by page as requests write it, and vLLM hands out blocks never
  used before ahead of freed ones, so what a run leaves resident depends on how many
  tokens it served, not on the model's own footprint.

Reading PSS is not free: the kernel walks every page table of the process to answer
/proc/PID/smaps_rollup, about 80 ms of a CPU per sample of a served 0.6B model's tree
(measured 2026-12-04), which on a 2-core machine is taken from the contender being
timed. So PSS is read only outside timed sections: a section runs inside
``TreeMonitor.quiet()``, where samples read just CPU times, RSS and ``VmHWM`` (each well
under a millisecond), and a PSS sample follows it. ``TreeMonitor(pid, pss=False)``
never reads PSS (the start-up bench, whose whole run is timed).

Noise: ``other_cpu_pct`` is the CPU time that processes outside the tree and the
harness used while the tree ran, as a percentage of one CPU (machine busy time from
/proc/stat, minus the tree's and the harness's own CPU time). On a shared machine a
run with other work beside it is slower, and the report flags it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

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


def machine_busy_s() -> float:
    """CPU seconds all CPUs spent busy since boot (excluding idle and iowait)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq


def own_cpu_s() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


def other_cpu_pct(seconds: float = 1.0) -> float:
    """CPU used by other processes over `seconds`, in % of one CPU (the harness idles)."""
    b0, o0, t0 = machine_busy_s(), own_cpu_s(), time.monotonic()
    time.sleep(seconds)
    busy = machine_busy_s() - b0 - (own_cpu_s() - o0)
    return max(0.0, 100.0 * busy / (time.monotonic() - t0))


def resident_bytes_in(pid: int, ranges: list[tuple[int, int]]) -> int | None:
    """Bytes of the address ranges [start, end) of process `pid` whose pages are resident
    or swapped (/proc/PID/pagemap: bit 63 present, bit 62 swapped; readable for one's own
    processes); None where it cannot be read."""
    import numpy as np

    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    try:
        with open(f"/proc/{pid}/pagemap", "rb") as f:
            for start, end in ranges:
                first, last = start // page, (end + page - 1) // page
                f.seek(first * 8)
                entries = np.frombuffer(f.read((last - first) * 8), dtype=np.uint64)
                total += int(np.count_nonzero(entries >> np.uint64(62))) * page
    except (OSError, ValueError):
        return None
    return total


class TreeMonitor:
    """Samples a process tree every `interval` seconds in a background thread; PSS
    too where `pss` and not inside ``quiet()``, and then the KV cache's resident pages
    where `kv_ranges` (called at each such sample until it answers) gives
    {pid: [(start, end), ...]} of the caches."""

    def __init__(
        self,
        pid: int,
        interval: float = 0.25,
        pss: bool = True,
        kv_ranges: Callable[[], dict[int, list[tuple[int, int]]]] | None = None,
    ):
        self.pid = pid
        self.interval = interval
        self.pss = pss
        self.kv_ranges = kv_ranges
        self._kv: dict[int, list[tuple[int, int]]] = {}
        self.peak_kv = 0
        self.peak_pss_less_kv = 0
        self.kv_samples = 0
        self._quiet = 0  # sections inside quiet() now
        self._lock = threading.Lock()  # one sample at a time
        self.hwm: dict[int, int] = {}  # pid -> peak RSS seen (VmHWM)
        self.cpu: dict[int, float] = {}  # pid -> CPU seconds seen
        # CPU seconds of the processes already in the tree when monitoring starts (a
        # standby daemon's imports): only what they use from then on counts as the tree's
        self.cpu_base: dict[int, float] = {}
        self.peak_rss_sampled = 0
        self.peak_pss = 0
        self.peak_procs = 0
        self.samples = 0
        self.pss_samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-monitor", daemon=True)
        self._t0 = self._busy0 = self._own0 = 0.0
        self._wall = self._other = self._harness = 0.0

    def __enter__(self) -> TreeMonitor:
        self._t0, self._busy0, self._own0 = time.monotonic(), machine_busy_s(), own_cpu_s()
        for p in self._procs():
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            self.cpu_base[p.pid] = t.user + t.system
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.sample()  # a last look before the tree is stopped
        self._wall = time.monotonic() - self._t0
        busy = machine_busy_s() - self._busy0
        self._harness = own_cpu_s() - self._own0
        self._other = max(0.0, busy - self.tree_cpu_s() - self._harness)

    def tree_cpu_s(self) -> float:
        """CPU seconds the tree used while monitored."""
        return sum(c - self.cpu_base.get(pid, 0.0) for pid, c in self.cpu.items())

    def _procs(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """A timed section: no PSS read inside it (a sample under way finishes first),
        one right after it."""
        self._quiet += 1
        with self._lock:
            pass
        try:
            yield
        finally:
            self._quiet -= 1
            self.sample()

    def sample(self) -> None:
        with self._lock:
            self._sample(self.pss and not self._quiet)

    def _sample(self, with_pss: bool) -> None:
        procs = self._procs()
        if not procs:
            return
        rss = pss = 0
        for p in procs:
            try:
                m = p.memory_full_info() if with_pss else p.memory_info()
                t = p.cpu_times()
            except psutil.Error:
                continue
            rss += m.rss
            pss += getattr(m, "pss", m.rss)
            self.cpu[p.pid] = max(self.cpu.get(p.pid, 0.0), t.user + t.system)
            hwm = _hwm_bytes(p.pid)
            if hwm is not None:
                self.hwm[p.pid] = max(self.hwm.get(p.pid, 0), hwm)
        self.samples += 1
        self.peak_rss_sampled = max(self.peak_rss_sampled, rss)
        if with_pss:
            self.pss_samples += 1
            self.peak_pss = max(self.peak_pss, pss)
            kv = self._kv_resident({p.pid for p in procs})
            if kv is not None:
                self.kv_samples += 1
                self.peak_kv = max(self.peak_kv, kv)
                self.peak_pss_less_kv = max(self.peak_pss_less_kv, pss - kv)
        self.peak_procs = max(self.peak_procs, len(procs))

    def _kv_resident(self, pids: set[int]) -> int | None:
        """Resident bytes of the tree's KV caches, or None (not told where they are)."""
        if not self._kv and self.kv_ranges is not None:
            self._kv = self.kv_ranges() or {}
        found = [resident_bytes_in(pid, r) for pid, r in self._kv.items() if pid in pids]
        if not found or any(b is None for b in found):
            return None
        return sum(found)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def result(self) -> dict:
        return {
            "peak_rss_mib": sum(self.hwm.values()) / MiB,
            "peak_rss_sampled_mib": self.peak_rss_sampled / MiB,
            "peak_pss_mib": self.peak_pss / MiB if self.pss_samples else None,
            "kv_resident_mib": self.peak_kv / MiB if self.kv_samples else None,
            "peak_pss_less_kv_mib": self.peak_pss_less_kv / MiB if self.kv_samples else None,
            "peak_processes": self.peak_procs,
            "memory_samples": self.samples,
            "pss_samples": self.pss_samples,
            "tree_cpu_s": self.tree_cpu_s(),
            "monitored_s": self._wall,
            # the harness itself: its HTTP client and this monitor
            "harness_cpu_s": self._harness,
            "other_cpu_pct": 100.0 * self._other / self._wall if self._wall else None,
        }


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def wait_gone(procs: list[psutil.Process], timeout: float = 30.0) -> None:
    """Wait until every process in `procs` has exited; SIGKILL what is left after
    `timeout`, so that the next contender starts on a quiet machine."""
    procs = [p for p in procs if p.pid != os.getpid()]
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=10)
