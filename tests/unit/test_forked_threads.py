"""A forked worker pins its OpenMP threads itself (worker._pin_forked_threads): the CPU
lists it reads and the pinning op, run in a child process so the test's own threads
stay as they are."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vllm_x86.runtime.worker import _cpu_ids


def test_cpu_lists_of_vllms_binding_environment():
    assert _cpu_ids("0 1") == [0, 1]  # GOMP_CPU_AFFINITY
    assert _cpu_ids("{0,1}") == [0, 1]  # OMP_PLACES
    assert _cpu_ids("0-3 8") == [0, 1, 2, 3, 8]
    assert _cpu_ids("") == []


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to pin to")
def test_bind_threads_pins_each_openmp_thread_to_its_cpu():
    cpus = sorted(os.sched_getaffinity(0))[:2][::-1]  # reversed: not the default order
    code = (
        "import os, torch, vllm_x86.runtime._C as C\n"
        f"got = C.bind_threads({cpus})\n"
        "print(got, sorted(os.sched_getaffinity(0)), torch.get_num_threads())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[0] == f"{cpus} [{cpus[0]}] 2"
