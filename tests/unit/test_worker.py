"""X86Worker.__init__: vLLM's CPUWorker.__init__ step for step (the ledger's
x86_worker_constructor record keeps it in step with the installed vLLM), with the
plugin's memory source."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from vllm_x86.runtime import worker as worker_mod
from vllm_x86.runtime.hardware import GiB, MemoryInfo
from vllm_x86.runtime.worker import X86Worker


@pytest.fixture
def built(monkeypatch):
    """Build X86Worker with the machine, vLLM's C++ op and Worker.__init__ replaced by
    recorders; returns (build(config, nodes, core_node, mem) -> worker, calls)."""
    calls: dict = {}

    def worker_init(self, vllm_config, local_rank, rank, method, is_driver_worker=False):
        calls["worker_init"] = (vllm_config, local_rank, rank, method, is_driver_worker)
        self.parallel_config = SimpleNamespace(disable_custom_all_reduce=False)

    monkeypatch.setattr(worker_mod.Worker, "__init__", worker_init)
    fake_torch = SimpleNamespace(
        ops=SimpleNamespace(
            _C=SimpleNamespace(init_cpu_memory_env=lambda nodes: calls.setdefault("env", nodes))
        )
    )
    monkeypatch.setattr(worker_mod, "torch", fake_torch)

    def build(config, nodes, core_node, mem):
        calls.clear()
        monkeypatch.setattr(worker_mod, "get_visible_memory_node", lambda: nodes)
        monkeypatch.setattr(
            worker_mod, "get_allowed_cpu_list", lambda: [SimpleNamespace(numa_node=core_node)]
        )
        monkeypatch.setattr(
            worker_mod.hardware, "memory_info", lambda node=None: calls.setdefault("mem", mem)
        )
        return X86Worker(config, 0, 0, "tcp://127.0.0.1:1", is_driver_worker=True)

    return build, calls


def _config(fraction: float, kv_bytes: int | None = None):
    return SimpleNamespace(
        cache_config=SimpleNamespace(
            gpu_memory_utilization=fraction, kv_cache_memory_bytes=kv_bytes
        )
    )


def test_x86_worker_builds_as_cpu_worker_does(built):
    build, calls = built
    mem = MemoryInfo(total=16 * GiB, available=12 * GiB, source="test")
    cfg = _config(0.5)
    w = build(cfg, nodes=[0, 1], core_node=1, mem=mem)
    assert calls["env"] == [1] and w._memory_node == 1  # the first CPU's node
    assert w.requested_cpu_memory == math.ceil(16 * GiB * 0.5)
    assert calls["worker_init"] == (cfg, 0, 0, "tcp://127.0.0.1:1", True)
    assert w.parallel_config.disable_custom_all_reduce is True
    # a node this process may not use: the first one it may (vLLM's fallback), or 0
    assert build(cfg, nodes=[2], core_node=5, mem=mem)._memory_node == 2
    assert build(cfg, nodes=[], core_node=5, mem=mem)._memory_node == 0


def test_x86_worker_refuses_more_than_is_available_with_a_sentence(built):
    build, calls = built
    mem = MemoryInfo(total=16 * GiB, available=4 * GiB, source="test numbers")
    with pytest.raises(ValueError, match="asks for 8.0 GiB .* only 4.0 GiB are available"):
        build(_config(0.5), nodes=[0], core_node=0, mem=mem)
    assert "worker_init" not in calls
    # an explicit KV-cache size is checked later, against what is left after the model
    w = build(_config(0.5, kv_bytes=GiB), nodes=[0], core_node=0, mem=mem)
    assert "worker_init" in calls and w.requested_cpu_memory == 8 * GiB
