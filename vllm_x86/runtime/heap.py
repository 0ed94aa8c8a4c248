"""The engine gives its heap's freed pages back to the system once it is warm.

Loading a model (reading, quantizing and packing weights) and warming it up (compiling or
loading the compiled graph, the first steps) allocate and free hundreds of MB of
temporaries. glibc's malloc keeps freed memory inside its heaps for reuse and returns to
the system only a free stretch at the very top of the main heap (M_TRIM_THRESHOLD); and
torch's CPU allocator keeps no cache of its own to empty (it calls malloc and free). So
the process keeps those pages resident, counted in its RSS and PSS, for as long as it
serves. ``malloc_trim(0)`` returns every whole free page of every arena to the system
(``madvise(MADV_DONTNEED)``): the addresses stay mapped, and a page comes back as a zero
page if the heap grows into it again. One call after warm-up costs milliseconds and
nothing afterwards; settings such as ``MALLOC_MMAP_THRESHOLD_`` would instead change
every allocation of the serving process, and page faults on every large buffer of a
prefill.

Measured (Xeon VM, 2 vCPUs, `vllm-x86 serve smollm2-135m-instruct-q4_1`, INT4 quantized
while loading, compiled): the engine process 960-973 -> 855 MiB resident after warm-up,
and its PSS after a request 726-815 -> 707-710 MiB (docs/startup.md). Importing vLLM's
server alone leaves nothing to trim; its tokenizer copies do (each a JSON round trip of
the Rust tokenizer: about 110 MiB of freed heap after two copies of Qwen2.5's), so the
API server trims once after making them (patches/frontend_warmup.py).

glibc only: where the C library has no malloc_trim (musl), nothing is done and the
worker's log says so. ``VLLM_X86_MALLOC_TRIM=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util

from vllm_x86.runtime import envs
from vllm_x86.runtime.log import get_logger

logger = get_logger("heap")

MiB = 2**20


def resident_bytes() -> int:
    """This process's resident set (/proc/self/statm), in bytes."""
    import os

    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _libc_trim():
    """glibc's malloc_trim, or None where the C library has none."""
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return getattr(libc, "malloc_trim", None)  # int malloc_trim(size_t pad)


def return_freed_memory(when: str) -> int | None:
    """Give the heap's free pages back to the system (see the module's docstring) and log
    how much the resident set shrank; that amount in bytes (0 or more), or None where it
    was not done (turned off, or no malloc_trim in this C library)."""
    if not envs.get_bool("VLLM_X86_MALLOC_TRIM"):
        return None
    trim = _libc_trim()
    if trim is None:
        logger.info(
            "vllm-x86: this C library has no malloc_trim: the memory freed %s stays "
            "with the process",
            when,
        )
        return None
    before = resident_bytes()
    trim(ctypes.c_size_t(0))
    after = resident_bytes()
    freed = max(0, before - after)
    logger.info(
        "vllm-x86: returned %.0f MiB of freed heap to the system %s (resident %.0f -> "
        "%.0f MiB; VLLM_X86_MALLOC_TRIM=0 keeps it)",
        freed / MiB,
        when,
        before / MiB,
        after / MiB,
    )
    return freed
