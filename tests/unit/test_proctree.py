"""The benchmark's process-tree monitor counts only the CPU a tree uses while monitored."""

import subprocess
import sys
import time

from vllm_x86.tools.bench.proctree import TreeMonitor

# burns about `busy` s of CPU, then sleeps until told to burn again (a line on stdin)
CHILD = """
import sys, time
def burn(s):
    t = time.process_time()
    while time.process_time() - t < s:
        pass
burn(float(sys.argv[1]))
print("ready", flush=True)
sys.stdin.readline()
burn(float(sys.argv[2]))
print("done", flush=True)
sys.stdin.readline()
"""


def test_cpu_used_before_monitoring_is_not_the_trees():
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD, "1.0", "0.3"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline().strip() == "ready"  # 1 s of CPU already used
        with TreeMonitor(p.pid, interval=0.05) as m:
            p.stdin.write("go\n")
            p.stdin.flush()
            assert p.stdout.readline().strip() == "done"
            time.sleep(0.1)
        used = m.result()["tree_cpu_s"]
        assert 0.25 <= used < 0.8, used  # the 0.3 s burnt while monitored, not the 1 s before
    finally:
        p.kill()
        p.wait()


def test_no_pss_read_inside_a_timed_section():
    """Reading PSS walks the tree's page tables (tens of ms of CPU for a served model):
    inside quiet() the monitor reads only CPU and RSS, and one PSS sample follows."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with TreeMonitor(p.pid, interval=0.02) as m:
            time.sleep(0.2)
            assert m.pss_samples > 0  # outside a section it reads PSS
            with m.quiet():
                before, samples = m.pss_samples, m.samples
                time.sleep(0.3)
                assert m.pss_samples == before
                assert m.samples > samples  # still sampling CPU and RSS
            assert m.pss_samples >= before + 1  # the sample right after the section
        r = m.result()
        assert r["peak_pss_mib"] > 1 and r["peak_rss_mib"] >= r["peak_pss_mib"]
    finally:
        p.kill()
        p.wait()


def test_cpu_only_monitor_reports_no_pss():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with TreeMonitor(p.pid, interval=0.02, pss=False) as m:
            time.sleep(0.2)
        r = m.result()
        assert r["pss_samples"] == 0 and r["peak_pss_mib"] is None
        assert r["memory_samples"] > 3 and r["peak_rss_mib"] > 1
    finally:
        p.kill()
        p.wait()


# maps 64 MiB of anonymous memory, writes 16 MiB of it, prints the mapping's range
KV_CHILD = """
import ctypes, mmap, sys
mm = mmap.mmap(-1, 64 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
for off in range(0, 16 << 20, 4096):
    mm[off] = 1
print(addr, addr + (64 << 20), flush=True)
sys.stdin.readline()
"""


def test_kv_cache_pages_are_counted_apart():
    """The pages of the ranges the KV cache lies in are counted page by page and taken
    out of the PSS: 16 MiB written of a 64 MiB mapping."""
    p = subprocess.Popen(
        [sys.executable, "-c", KV_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        start, end = (int(x) for x in p.stdout.readline().split())
        with TreeMonitor(p.pid, interval=0.02, kv_ranges=lambda: {p.pid: [(start, end)]}) as m:
            time.sleep(0.2)
        r = m.result()
        assert 16.0 <= r["kv_resident_mib"] < 16.5, r
        assert r["peak_pss_mib"] > 16
        assert abs(r["peak_pss_less_kv_mib"] - (r["peak_pss_mib"] - r["kv_resident_mib"])) < 2
        # not told where a cache lies (stock vLLM): no figure, not a zero
        with TreeMonitor(p.pid, interval=0.02, kv_ranges=lambda: {}) as m:
            time.sleep(0.1)
        assert m.result()["kv_resident_mib"] is None
    finally:
        p.kill()
        p.wait()


def test_kv_ranges_come_from_the_engines_log_line(tmp_path):
    from vllm_x86.tools.bench.server import kv_ranges_in_log

    log = tmp_path / "server.log"
    log.write_text(
        "(APIServer pid=10) INFO ... non-default args\n"
        "(EngineCore pid=12) INFO 12-06 23:20:02 [kv_alloc.py:97] KV cache: 1.00 GiB of fresh "
        "zero pages at 0x7f0000000000-0x7f0040000000 (mapped, not written: ...)\n"
        "(Worker pid=13) INFO ... KV cache: 0.50 GiB of fresh zero pages at "
        "0x10000-0x20000, 0x30000-0x40000 (mapped, ...)\n"
    )
    assert kv_ranges_in_log(log) == {
        12: [(0x7F0000000000, 0x7F0040000000)],
        13: [(0x10000, 0x20000), (0x30000, 0x40000)],
    }
    log.write_text("(APIServer pid=10) INFO stock vLLM: no such line\n")
    assert kv_ranges_in_log(log) == {}
    assert kv_ranges_in_log(tmp_path / "missing.log") == {}
