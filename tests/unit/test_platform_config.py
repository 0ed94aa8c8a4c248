"""What X86Platform does to a vLLM config, and that explicit user settings win."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import PYTHON, clean_env

CODE = r"""
import json, os, sys
from vllm.engine.arg_utils import EngineArgs
kw = json.loads(sys.argv[2])
cfg = EngineArgs(model=sys.argv[1], max_model_len=1024, **kw).create_engine_config()
print("CONFIG " + json.dumps({
    "kv_bytes": cfg.cache_config.kv_cache_memory_bytes,
    "worker_cls": cfg.parallel_config.worker_cls,
    "bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
    "reserved": os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU"),
    "method": os.environ.get("VLLM_WORKER_MULTIPROC_METHOD"),
    "frozen": __import__("gc").get_freeze_count(),
    "gomp": os.environ.get("GOMP_SPINCOUNT"),
    "executor": cfg.parallel_config.distributed_executor_backend,
    "cpp_wrapper": cfg.compilation_config.inductor_compile_config.get("cpp_wrapper", False),
}))
"""


def config(model, engine_kwargs=None, **env) -> dict:
    p = subprocess.run(
        [PYTHON, "-c", CODE, str(model), json.dumps(engine_kwargs or {})],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    for line in p.stdout.splitlines():
        if line.startswith("CONFIG "):
            return json.loads(line[7:]) | {"log": p.stdout + p.stderr}
    raise AssertionError(p.stderr[-3000:])


@pytest.fixture(scope="module")
def model(default_model):
    return default_model


@pytest.mark.slow  # a fresh interpreter importing vLLM (~10 s here)
def test_plugin_defaults(model):
    from vllm_x86.runtime.defaults import choose_threads

    c = config(model)
    assert c["worker_cls"] == "vllm_x86.runtime.worker.X86Worker"
    assert c["kv_bytes"] is not None and c["kv_bytes"] >= 1 << 30
    bind, _ = choose_threads()
    assert c["bind"] == bind
    assert c["reserved"] is None  # an explicit CPU list needs no reservation setting
    assert "vllm-x86: KV cache" in c["log"]
    # for the engine and worker processes vLLM spawns from here (defaults.omp_env)
    from vllm_x86.runtime.defaults import omp_env

    assert c["gomp"] == omp_env(environ={})[0].get("GOMP_SPINCOUNT")


@pytest.mark.slow  # a fresh interpreter importing vLLM (~10 s here)
def test_openmp_setting_left_alone_in_process_and_when_yours(model):
    """The model runs in this process (no engine process): its libgomp has read its
    environment already, so nothing is set; a GOMP_SPINCOUNT of yours stays."""
    assert config(model, VLLM_ENABLE_V1_MULTIPROCESSING="0")["gomp"] is None
    assert config(model, GOMP_SPINCOUNT="1234")["gomp"] == "1234"


@pytest.mark.slow  # a fresh interpreter importing vLLM (~10 s here)
def test_user_kv_cache_space_wins(model):
    c = config(model, VLLM_CPU_KVCACHE_SPACE="3")
    assert c["kv_bytes"] == 3 << 30
    assert "KV cache from VLLM_CPU_KVCACHE_SPACE=3" in c["log"]


@pytest.mark.slow  # a fresh interpreter importing vLLM (~10 s here)
def test_user_gpu_memory_utilization_wins(model):
    c = config(model, {"gpu_memory_utilization": 0.3})
    assert c["kv_bytes"] is None
    assert "--gpu-memory-utilization=0.3" in c["log"]


@pytest.mark.slow  # a fresh interpreter importing vLLM (~10 s here)
def test_user_thread_binding_wins(model):
    c = config(model, VLLM_CPU_OMP_THREADS_BIND="0")
    assert c["bind"] == "0"
    assert "thread layout from your settings" in c["log"]


@pytest.mark.slow  # a fresh interpreter importing vLLM (~10 s here)
def test_disabled_plugin_leaves_stock_config(model):
    c = config(model, VLLM_X86_DISABLE="1")
    assert c["worker_cls"] == "vllm.v1.worker.cpu_worker.CPUWorker"
    assert c["kv_bytes"] is None
    assert c["bind"] is None


@pytest.mark.slow  # a fresh interpreter importing vLLM (~10 s here)
@pytest.mark.parametrize("fork", ["1", "0"])
def test_serve_forks_the_engine_from_a_frozen_heap(model, fork):
    """In `vllm-x86 serve` with fork, the server freezes its gc heap before the engine
    processes are forked from it (their collections then skip the imports)."""
    c = config(model, VLLM_X86_SERVE_DEFAULTS="1", VLLM_X86_ENGINE_FORK=fork)
    assert c["method"] == ("fork" if fork == "1" else "spawn")
    assert (c["frozen"] > 10_000) == (fork == "1"), c["frozen"]


@pytest.mark.slow  # fresh interpreters importing vLLM (~10 s each here)
def test_one_worker_runs_in_the_engine_process(model):
    """In `vllm-x86 serve` (serve defaults, forked engine) one worker runs inside the
    engine-core process ('uni'); vLLM CPU's worker process ('mp') with the setting off,
    outside the plugin's servers, or when the user names a backend."""
    assert config(model, VLLM_X86_SERVE_DEFAULTS="1")["executor"] == "uni"
    off = config(model, VLLM_X86_SERVE_DEFAULTS="1", VLLM_X86_WORKER_IN_ENGINE="0")
    assert off["executor"] == "mp"
    plain = config(model)
    assert plain["executor"] == "mp"  # the LLM class, vLLM's own server
    assert plain["cpp_wrapper"] is False  # VLLM_X86_CPP_WRAPPER is off by default
    named = config(model, {"distributed_executor_backend": "mp"}, VLLM_X86_SERVE_DEFAULTS="1")
    assert named["executor"] == "mp"


def test_validate_environ_hides_only_the_plugins_settings(monkeypatch):
    """vLLM's check of VLLM_* variables does not call the plugin's settings unknown, sees
    every other one as before, and finds the environment as it was afterwards."""
    from vllm_x86.runtime.platform import X86Platform

    monkeypatch.setenv("VLLM_X86_OPS", "1")
    monkeypatch.setenv("VLLM_X86_SERVE_DEFAULTS", "0")
    monkeypatch.delenv("VLLM_NOT_A_SETTING", raising=False)
    before = dict(os.environ)
    X86Platform.validate_environ(hard_fail=True)
    assert dict(os.environ) == before
    monkeypatch.setenv("VLLM_NOT_A_SETTING", "1")
    with pytest.raises(ValueError, match="Unknown vLLM environment variable detected: VLLM_NOT_A"):
        X86Platform.validate_environ(hard_fail=True)
    assert os.environ["VLLM_X86_OPS"] == "1"  # put back after the error too


@pytest.mark.slow  # fresh interpreters importing vLLM
def test_cpp_wrapper_needs_plain_layer_names(model):
    """VLLM_X86_CPP_WRAPPER=1 turns on Inductor's C++ wrapper only where vLLM was
    imported with plain-string layer names (VLLM_USE_LAYERNAME=0, which `vllm-x86
    serve` sets); otherwise the config keeps the Python wrapper and the log says why."""
    on = config(model, VLLM_X86_CPP_WRAPPER="1", VLLM_USE_LAYERNAME="0")
    assert on["cpp_wrapper"] is True
    refused = config(model, VLLM_X86_CPP_WRAPPER="1", VLLM_USE_LAYERNAME="1")
    assert refused["cpp_wrapper"] is False
    assert "VLLM_USE_LAYERNAME=0" in refused["log"]


def test_serve_sets_plain_layer_names_only_for_the_cpp_wrapper():
    from vllm_x86.runtime.defaults import apply_layer_name_env

    env = {}
    assert apply_layer_name_env(env) is False and env == {}
    env = {"VLLM_X86_CPP_WRAPPER": "1"}
    assert apply_layer_name_env(env) is True and env["VLLM_USE_LAYERNAME"] == "0"
    env = {"VLLM_X86_CPP_WRAPPER": "1", "VLLM_USE_LAYERNAME": "1"}  # the user's choice stays
    assert apply_layer_name_env(env) is False and env["VLLM_USE_LAYERNAME"] == "1"
