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
