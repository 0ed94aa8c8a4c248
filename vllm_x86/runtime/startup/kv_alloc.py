"""The KV cache from fresh zero pages: a start-up that does not write 1 GiB of zeros.

vLLM allocates the whole KV cache as one ``torch.zeros`` buffer
(``vllm/v1/worker/utils.py``, ``allocate_kv_cache``). On a CPU that is a memset of the
full cache at start-up, paid before the server answers: every page is faulted in and
written, 0.7-0.8 s for the plugin's default 1 GiB on the 2-core development machine
(``vllm_x86/tools/bench/micro/kv_alloc.py`` measures it against this module's allocation, side by side).

An anonymous private memory mapping is zero by definition (the kernel hands out zeroed
pages, POSIX ``MAP_ANONYMOUS``), so the same zero buffer can come from ``mmap`` without
touching it: pages are faulted in, already zero, when the cache first writes them, and
a short conversation touches a small part of the cache. The contents are identical to
``torch.zeros``; only when the memory is claimed changes. vLLM has checked before this
point that the memory is available (``determine_available_memory``), as it does for
``torch.zeros``.

``fresh_zero_pages()`` is a context manager (a ``TorchFunctionMode``) that serves large
CPU ``torch.zeros`` calls this way and passes every other call through unchanged. The
worker enters it around vLLM's KV cache allocation only, through the hook vLLM gives
for exactly that (``Worker._maybe_get_memory_pool_context(tag="kv_cache")``).
``VLLM_X86_KV_ZERO_PAGES=0`` turns it off (vLLM's ``torch.zeros``). The function mode and
the hook are records of the patch ledger (kv_cache_fresh_zero_pages,
kv_cache_pool_context; runtime/patches/ledger.py).
"""

from __future__ import annotations

import math
import mmap

import torch
from torch.overrides import TorchFunctionMode

from vllm_x86.runtime.log import get_logger

logger = get_logger("kv_alloc")

# Smaller buffers are cheap to zero; only the cache itself is worth a mapping.
MIN_BYTES = 64 << 20


def zero_pages(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A 1-D CPU tensor of ``numel`` zeros backed by an anonymous private mapping.

    The tensor keeps the mapping alive (``torch.frombuffer`` holds the buffer); it is
    unmapped when the last view of the tensor goes."""
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    mm = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(mm, dtype=dtype, count=numel)


def _zeros_request(args, kwargs) -> tuple[int, torch.dtype] | None:
    """(numel, dtype) when a ``torch.zeros`` call can be served from fresh pages."""
    if set(kwargs) - {"dtype", "device", "layout", "pin_memory", "requires_grad"}:
        return None  # out=, names=, memory_format=: not ours
    if kwargs.get("requires_grad") or kwargs.get("pin_memory"):
        return None
    if kwargs.get("layout", torch.strided) != torch.strided:
        return None
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != "cpu":
        return None
    size = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple, torch.Size)) else args
    if not size or not all(isinstance(s, int) and s >= 0 for s in size):
        return None
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    if dtype.is_complex or dtype == torch.bool:
        return None
    numel = math.prod(size)
    if numel * torch.empty((), dtype=dtype).element_size() < MIN_BYTES:
        return None
    return numel, dtype


class fresh_zero_pages(TorchFunctionMode):  # noqa: N801 (used as a context manager)
    """Within this context, large CPU ``torch.zeros`` come from fresh zero pages."""

    def __init__(self) -> None:
        super().__init__()
        self.served: list[int] = []  # bytes of each buffer served, for the log and tests
        self.ranges: list[tuple[int, int]] = []  # their addresses [start, end)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.zeros:
            req = _zeros_request(args, kwargs)
            if req is not None:
                numel, dtype = req
                size = args[0] if len(args) == 1 and not isinstance(args[0], int) else args
                out = zero_pages(numel, dtype).view(tuple(size))
                self.served.append(out.numel() * out.element_size())
                self.ranges.append((out.data_ptr(), out.data_ptr() + self.served[-1]))
                return out
        return func(*args, **kwargs)

    def __exit__(self, *exc):
        if self.served and exc[0] is None:
            # the addresses let a reader of /proc/PID/pagemap count the cache's resident
            # pages apart (the bench's kv_resident_mib, tools/bench/proctree.py)
            logger.info(
                "KV cache: %.2f GiB of fresh zero pages at %s (mapped, not written: pages "
                "are claimed as the cache fills; VLLM_X86_KV_ZERO_PAGES=0 zeroes it at "
                "start-up)",
                sum(self.served) / (1 << 30),
                ", ".join(f"{a:#x}-{b:#x}" for a, b in self.ranges),
            )
        return super().__exit__(*exc)
