"""The plugin's machine-dependent choices: thread layout, KV-cache size, memory source."""

from __future__ import annotations

import pytest

from tests.helpers.machines import cpu
from vllm_x86.runtime import defaults, hardware
from vllm_x86.runtime.hardware import GiB


@pytest.fixture(autouse=True)
def _no_user_settings(monkeypatch):
    for k in ("VLLM_X86_THREADS", "VLLM_X86_KV_CACHE_GIB"):
        monkeypatch.delenv(k, raising=False)


def test_small_machine_uses_every_core():
    bind, reason = defaults.choose_threads(cpu(2))
    assert bind == "0-1"
    assert "every core" in reason


def test_small_machine_with_smt_uses_one_thread_per_core():
    bind, _ = defaults.choose_threads(cpu(2, smt=2))
    assert bind == "0,2"


def test_large_machine_keeps_vllm_layout():
    bind, reason = defaults.choose_threads(cpu(32))
    assert bind is None
    assert "vLLM's layout" in reason


def test_threads_setting(monkeypatch):
    monkeypatch.setenv("VLLM_X86_THREADS", "1")
    assert defaults.choose_threads(cpu(2))[0] == "0"
    monkeypatch.setenv("VLLM_X86_THREADS", "lots")
    with pytest.raises(ValueError, match="VLLM_X86_THREADS"):
        defaults.choose_threads(cpu(2))


def test_two_ranks_on_two_cores_get_one_core_each():
    bind, reason = defaults.choose_threads(cpu(2), ranks=2)
    assert bind == "0|1"
    assert "rank 0 on CPUs 0, rank 1 on CPUs 1" in reason


def test_one_rank_per_numa_node_on_a_two_socket_machine():
    # 2 nodes of 32 cores: each rank keeps its node and leaves a core to the engine loop
    bind, reason = defaults.choose_threads(cpu(64, nodes=2), ranks=2)
    assert bind == "0-30|32-62"
    assert "one NUMA node each" in reason


def test_more_ranks_than_nodes_split_each_node():
    assert defaults.rank_cpus(cpu(16, nodes=2), 4) == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
        [12, 13, 14, 15],
    ]
    # 3 ranks over 2 nodes cannot divide the nodes: the cores are split in node order
    assert defaults.rank_cpus(cpu(6, nodes=2), 3) == [[0, 1], [2, 3], [4, 5]]
    # SMT siblings are left out: one logical CPU per core
    assert defaults.choose_threads(cpu(4, smt=2), ranks=2)[0] == "0,2|4,6"


def test_more_ranks_than_cores_is_refused_with_what_would_work():
    with pytest.raises(
        defaults.LayoutError, match="3 ranks need at least 3 physical cores.*at most 2"
    ):
        defaults.choose_threads(cpu(2), ranks=3)


def test_threads_setting_applies_per_rank(monkeypatch):
    monkeypatch.setenv("VLLM_X86_THREADS", "2")
    assert defaults.choose_threads(cpu(8), ranks=2)[0] == "0-1|4-5"


def mem(avail_gib: float) -> hardware.MemoryInfo:
    return hardware.MemoryInfo(total=int(64 * GiB), available=int(avail_gib * GiB), source="test")


def test_kv_cache_is_a_quarter_of_available_memory_without_model_shape():
    size, _ = defaults.choose_kv_cache_bytes(mem(24))
    assert size == 6 * GiB


def test_kv_cache_fits_four_full_sequences():
    # SmolLM2: 30 layers x 3 KV heads x 64 x 2 (K, V) x 2 bytes = 23040 B per token
    small, why = defaults.choose_kv_cache_bytes(mem(24), 23040, 8192)
    assert small == 1 * GiB  # 0.70 GiB needed, 1 GiB floor
    assert "4 sequences of 8192 tokens" in why
    # Qwen3-0.6B: 28 x 8 x 128 x 2 x 2 = 114688 B per token, 40960 tokens -> capped
    big, _ = defaults.choose_kv_cache_bytes(mem(24), 114688, 40960)
    assert big == 6 * GiB
    mid, _ = defaults.choose_kv_cache_bytes(mem(24), 114688, 4096)
    assert mid == 1792 << 20  # 1.75 GiB, rounded up to 64 MiB


def test_kv_cache_bounds():
    assert defaults.choose_kv_cache_bytes(mem(3.5))[0] == 1 * GiB  # at least 1 GiB
    assert defaults.choose_kv_cache_bytes(mem(2))[0] == GiB // 2  # but leave 2 GiB free
    assert defaults.choose_kv_cache_bytes(mem(1000))[0] == 32 * GiB


def test_kv_cache_setting(monkeypatch):
    monkeypatch.setenv("VLLM_X86_KV_CACHE_GIB", "1.5")
    assert defaults.choose_kv_cache_bytes(mem(24))[0] == int(1.5 * GiB)
    monkeypatch.setenv("VLLM_X86_KV_CACHE_GIB", "-1")
    with pytest.raises(ValueError, match="positive"):
        defaults.choose_kv_cache_bytes(mem(24))


def test_single_node_memory_comes_from_the_system():
    """This VM's node 0 reports a fraction of the machine's memory; with one node the
    plugin plans with the system-wide numbers."""
    info = hardware.memory_info()
    system_total = hardware._meminfo(open("/proc/meminfo").read())["MemTotal"]
    if len(hardware.cpu_info().numa_nodes) == 1:
        assert info.total == min(system_total, info.cgroup_limit or system_total)
        assert info.source.startswith("system")


def test_meminfo_parsing():
    text = "Node 0 MemTotal:  8611576 kB\nNode 0 MemFree:   4387552 kB\n"
    assert hardware._meminfo(text) == {"MemTotal": 8611576 * 1024, "MemFree": 4387552 * 1024}
    assert hardware._meminfo("MemAvailable:   24213216 kB")["MemAvailable"] == 24213216 * 1024


def test_omp_spin_count_where_every_core_runs_a_model_thread():
    chosen, reason = defaults.omp_env(cpu(2), environ={})
    assert chosen == {"GOMP_SPINCOUNT": "10000"}
    assert "engine loop" in reason
    env = {}
    assert defaults.apply_omp_env(env, cpu(2)) == chosen
    assert env == {"GOMP_SPINCOUNT": "10000", defaults.OMP_CHOSEN_ENV: "GOMP_SPINCOUNT=10000"}


@pytest.mark.parametrize(
    ("environ", "why"),
    [
        ({"GOMP_SPINCOUNT": "300000"}, "your GOMP_SPINCOUNT / OMP_WAIT_POLICY"),
        ({"OMP_WAIT_POLICY": "ACTIVE"}, "your GOMP_SPINCOUNT / OMP_WAIT_POLICY"),
        ({"VLLM_CPU_OMP_THREADS_BIND": "0"}, "libgomp's defaults: you chose the thread layout"),
        ({"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}, "libgomp's defaults: you chose the thread layout"),
    ],
)
def test_omp_settings_of_yours_are_left_alone(environ, why):
    env = dict(environ)
    assert defaults.omp_env(cpu(2), environ=env) == ({}, why)
    assert defaults.apply_omp_env(env, cpu(2)) == {}
    assert env == environ


def test_no_omp_setting_where_a_core_is_left_to_the_engine_loop(monkeypatch):
    left = ({}, "libgomp's defaults: a core is left to the engine loop")
    assert defaults.omp_env(cpu(32), environ={}) == left  # vLLM's layout
    monkeypatch.setenv("VLLM_X86_THREADS", "1")
    assert defaults.omp_env(cpu(2), environ={}) == left
    monkeypatch.setenv("VLLM_X86_THREADS", "2")
    assert defaults.omp_env(cpu(2), environ={})[0] == {"GOMP_SPINCOUNT": "10000"}
