"""The compile cache across restarts: compiled `vllm-x86 serve` of the tiny random model
fills a fresh cache (and records its manifest); the next start loads the compiled model
from it instead of compiling again, with the same greedy text; then the cached artifact
is damaged, and the next start detects it, moves it aside, compiles again and answers
with the same greedy text."""

from __future__ import annotations

import pytest

from tests.conftest import clean_env
from tests.e2e.tiny_server import TinyServer
from vllm_x86.runtime.startup import compile_cache as cc

pytestmark = pytest.mark.slow


def _start_and_ask(model, env, log_path) -> str:
    srv = TinyServer(model, env, log_path)
    try:
        return srv.ask()
    finally:
        srv.stop()


def test_cache_is_loaded_and_a_damaged_entry_rebuilt(tmp_path):
    from vllm_x86.tools.bench.synthetic import build

    tiny = build("tiny-llama")
    cache = tmp_path / "cache"
    # compiling before serving (staged warm-up off: tests/e2e/test_staged_warmup.py)
    env = clean_env(VLLM_X86_CACHE_DIR=str(cache), VLLM_X86_STAGED_WARMUP="0")
    first = _start_and_ask(tiny, env, tmp_path / "first.log")
    log1 = (tmp_path / "first.log").read_text()
    assert "keyed by plugin code and graph settings, vLLM, torch, Python and ISA" in log1
    short = "compiled model found in vLLM's cache: warming up with 16 tokens"
    assert short not in log1  # compiling: vLLM's full-size warm-up
    assert "vllm-x86: compiling the model: no compiled model for these settings" in log1
    roots = list((cache / "compile").iterdir())
    assert len(roots) == 1
    entries = [p for p in (roots[0] / cc.AOT_SUBDIR).iterdir() if p.is_dir()]
    assert entries and all((e / cc.MANIFEST).exists() for e in entries), log1[-3000:]
    # an intact cache: vLLM loads its AOT artifact (runtime/patches/aot_finalize_loading.py), no compile
    again = _start_and_ask(tiny, env, tmp_path / "again.log")
    log_again = (tmp_path / "again.log").read_text()
    assert "Directly load AOT compilation" in log_again, log_again[-4000:]
    assert "Compiling model again" not in log_again
    assert short in log_again  # loading: the worker's short warm-up (worker.py)
    assert "vllm-x86: compiling the model" not in log_again
    assert again == first
    for e in entries:
        model = next(e.rglob("model"))
        model.write_bytes(b"\x00" * model.stat().st_size)  # same size, wrong bytes
    second = _start_and_ask(tiny, env, tmp_path / "second.log")
    log2 = (tmp_path / "second.log").read_text()
    assert "is damaged" in log2 and "moved to" in log2
    assert short not in log2  # the entry was moved aside: vLLM compiles, full warm-up
    assert "vllm-x86: compiling the model" in log2
    assert second == first
    assert list((roots[0] / "quarantine").iterdir())
