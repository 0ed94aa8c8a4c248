"""The engine's heap given back after warm-up (vllm_x86/runtime/heap.py), in a fresh
process whose heap holds freed memory the way a model load leaves it."""

from __future__ import annotations

import json
import subprocess

from tests.conftest import PYTHON, clean_env

# ~300 MB in blocks below glibc's mmap threshold (they come from the main heap, as a
# model load's temporaries do), written to, then a small block above them that pins the
# heap's top, so that free() alone returns nothing.
_FRAGMENTED = r"""
import ctypes, json
from vllm_x86.runtime import heap
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
blocks = [libc.malloc(96 * 1024) for _ in range(3200)]
for b in blocks:
    ctypes.memset(b, 1, 96 * 1024)
pin = libc.malloc(4096)
for b in blocks:
    libc.free(b)
before = heap.resident_bytes()
freed = heap.return_freed_memory("in the test")
print(json.dumps({"before": before, "after": heap.resident_bytes(), "freed": freed}))
"""

MB = 10**6
PAGES_BETWEEN_READS = 16


def _run(**env: str) -> tuple[dict, str]:
    r = subprocess.run(
        [PYTHON, "-c", _FRAGMENTED], env=clean_env(**env), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_freed_heap_pages_go_back_to_the_system():
    out, _ = _run()
    assert out["before"] > 250 * MB  # the freed blocks were still resident
    assert out["before"] - out["after"] > 250 * MB
    # what it reports is the shrink it measured; the test's reads come a few
    # allocations before and after its own, so they may differ by a few pages
    assert abs(out["freed"] - (out["before"] - out["after"])) <= PAGES_BETWEEN_READS * 4096


def test_turned_off_the_freed_pages_stay():
    out, _ = _run(VLLM_X86_MALLOC_TRIM="0")
    assert out["freed"] is None
    assert out["before"] - out["after"] < 20 * MB
    assert out["after"] > 250 * MB
