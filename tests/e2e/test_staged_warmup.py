"""Staged warm-up (staged.py), for real: compiled `vllm-x86 serve` of the tiny random
model on an empty compile cache answers before anything is compiled, keeps answering
while a background process compiles, then switches to the compiled model (same greedy
text in float32); the next start loads that compiled model from the cache. A compile
process that dies (here: killed, as the OOM killer would) leaves the server serving
eagerly, with the reason in its log."""

from __future__ import annotations

import os
import re
import signal

import pytest

from tests.conftest import clean_env
from tests.e2e.tiny_server import TinyServer
from vllm_x86.runtime.startup import compile_cache as cc

pytestmark = pytest.mark.slow

EAGER_NOW = "staged warm-up: no compiled model in the cache for these settings; serving eagerly"
SWITCHED = "staged warm-up: serving the compiled model"


@pytest.fixture(scope="module")
def tiny():
    from vllm_x86.tools.bench.synthetic import build

    return build("tiny-llama")


def test_serves_eagerly_at_once_then_switches_to_the_compiled_model(tiny, tmp_path):
    env = clean_env(VLLM_X86_CACHE_DIR=str(tmp_path / "cache"))
    srv = TinyServer(tiny, env, tmp_path / "first.log")
    try:
        log = srv.log()
        assert EAGER_NOW in log, log[-4000:]
        assert "vllm-x86: compiling the model" not in log  # nothing compiled before serving
        assert SWITCHED not in log
        eager = srv.ask()
        srv.wait_for_log(SWITCHED)
        log = srv.log()
        assert "staged warm-up: background compile done in" in log
        assert "Directly load AOT compilation" in log  # the worker loaded what it compiled
        assert srv.ask() == eager  # float32: the compiled model gives the eager text
    finally:
        srv.stop()
    roots = list((tmp_path / "cache" / "compile").iterdir())
    entries = [p for p in (roots[0] / cc.AOT_SUBDIR).iterdir() if p.is_dir()]
    assert entries and all((e / cc.MANIFEST).exists() for e in entries)
    # The next start finds the compiled model: no staging, vLLM loads it.
    again = TinyServer(tiny, env, tmp_path / "again.log")
    try:
        log = again.log()
        assert "Directly load AOT compilation" in log, log[-4000:]
        assert EAGER_NOW not in log
        assert again.ask() == eager
    finally:
        again.stop()


def test_a_failed_background_compile_leaves_the_server_serving_eagerly(tiny, tmp_path):
    env = clean_env(VLLM_X86_CACHE_DIR=str(tmp_path / "cache"))
    srv = TinyServer(tiny, env, tmp_path / "server.log")
    try:
        m = re.search(r"compiling in the background \(pid (\d+), nice 19\)", srv.log())
        assert m, srv.log()[-4000:]
        os.kill(int(m.group(1)), signal.SIGKILL)  # as the OOM killer would
        first = srv.ask()
        srv.wait_for_log("the background compile failed (exit code -9", timeout=60)
        for _ in range(3):
            assert srv.ask() == first
        assert SWITCHED not in srv.log()
    finally:
        srv.stop()
