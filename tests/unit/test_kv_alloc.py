"""The KV cache from fresh zero pages (vllm_x86/runtime/startup/kv_alloc.py)."""

from __future__ import annotations

import gc

import psutil
import pytest
import torch

from vllm_x86.runtime.startup import kv_alloc
from vllm_x86.runtime.startup.kv_alloc import fresh_zero_pages, zero_pages

MIB = 1 << 20


def _rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def test_zero_pages_are_zero_and_not_written_at_allocation():
    before = _rss()
    t = zero_pages(256 * MIB, torch.int8)
    grown = _rss() - before
    assert t.shape == (256 * MIB,) and t.dtype == torch.int8
    assert grown < 32 * MIB, f"allocation wrote {grown / MIB:.0f} MiB"
    assert t.data_ptr() % 4096 == 0
    assert int(t[::4096].abs().sum()) == 0 and int(t[-1]) == 0
    t[: 64 * MIB].fill_(3)  # writing faults pages in
    assert _rss() - before >= 60 * MIB
    assert int(t[64 * MIB]) == 0 and int(t[64 * MIB - 1]) == 3


def test_views_keep_the_mapping_alive():
    t = zero_pages(128 * MIB, torch.int8)
    v = t.view(torch.bfloat16).view(4, -1)[1:3]
    del t
    gc.collect()
    v.fill_(1.5)
    assert float(v.float().mean()) == 1.5


def test_large_zeros_in_the_context_come_from_fresh_pages():
    before = _rss()
    with fresh_zero_pages() as mode:
        buf = torch.zeros(512 * MIB, dtype=torch.int8)
        small = torch.zeros(1000, dtype=torch.int8)
        other = torch.ones(8)
    assert _rss() - before < 64 * MIB
    assert mode.served == [512 * MIB]
    # the log names where it lies, for the bench's count of its resident pages
    assert mode.ranges == [(buf.data_ptr(), buf.data_ptr() + 512 * MIB)]
    assert buf.shape == (512 * MIB,) and buf.dtype == torch.int8
    assert int(buf[:: 1 << 16].abs().sum()) == 0
    assert small.shape == (1000,) and int(small.abs().sum()) == 0
    assert float(other.sum()) == 8.0


@pytest.mark.parametrize(
    "args,kwargs,shape,dtype",
    [
        (((2, 64, 1024, 1024),), {"dtype": torch.bfloat16}, (2, 64, 1024, 1024), torch.bfloat16),
        ((3, 32 * MIB), {"dtype": torch.int8, "device": "cpu"}, (3, 32 * MIB), torch.int8),
        ((torch.Size([80 * MIB]),), {"dtype": torch.uint8}, (80 * MIB,), torch.uint8),
    ],
)
def test_shapes_and_dtypes(args, kwargs, shape, dtype):
    with fresh_zero_pages() as mode:
        t = torch.zeros(*args, **kwargs)
    assert len(mode.served) == 1
    assert tuple(t.shape) == shape and t.dtype == dtype and t.is_contiguous()
    assert float(t.flatten()[:: 1 << 16].float().abs().sum()) == 0.0
    t.flatten()[-1] = 1
    assert float(t.flatten()[-1].float()) == 1.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"dtype": torch.float32, "requires_grad": True},
        {"dtype": torch.bool},
        {"out": "preallocated"},
    ],
)
def test_calls_it_does_not_take_pass_through(kwargs):
    if kwargs.get("out") == "preallocated":
        kwargs = {"out": torch.empty(80 * MIB, dtype=torch.int8)}
    with fresh_zero_pages() as mode:
        t = torch.zeros(80 * MIB, **kwargs)
    assert mode.served == []
    assert t.numel() == 80 * MIB and not bool(t[:: 1 << 16].any())


def test_below_the_threshold_is_left_alone():
    with fresh_zero_pages() as mode:
        torch.zeros(kv_alloc.MIN_BYTES - 1, dtype=torch.int8)
    assert mode.served == []


def test_the_worker_uses_it_for_the_kv_cache_only(monkeypatch):
    from vllm_x86.runtime.worker import X86Worker

    w = X86Worker.__new__(X86Worker)  # the hook reads no worker state for "kv_cache"
    monkeypatch.delenv("VLLM_X86_KV_ZERO_PAGES", raising=False)
    assert isinstance(w._maybe_get_memory_pool_context("kv_cache"), fresh_zero_pages)
    assert not isinstance(w._maybe_get_memory_pool_context("weights"), fresh_zero_pages)
    monkeypatch.setenv("VLLM_X86_KV_ZERO_PAGES", "0")
    assert not isinstance(w._maybe_get_memory_pool_context("kv_cache"), fresh_zero_pages)
