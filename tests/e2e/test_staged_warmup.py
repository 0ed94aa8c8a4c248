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
import subprocess
import time

import httpx
import pytest

from tests.conftest import PYTHON, clean_env
from vllm_x86 import compile_cache as cc
from vllm_x86.ports import free_port

pytestmark = pytest.mark.slow

EAGER_NOW = "staged warm-up: no compiled model in the cache for these settings; serving eagerly"
SWITCHED = "staged warm-up: serving the compiled model"


class Server:
    def __init__(self, model, env, log_path):
        self.port = free_port()
        self.log_path = log_path
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(
                [PYTHON, "-m", "vllm_x86.cli", "serve", str(model), "--no-daemon", "--port",
                 str(self.port), "--max-model-len", "256", "--dtype", "float32",
                 "--served-model-name", "tiny"],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.base = f"http://127.0.0.1:{self.port}"
        self.t0 = time.monotonic()
        deadline = self.t0 + 600
        while True:
            assert self.proc.poll() is None, self.log()[-4000:]
            try:
                if httpx.get(f"{self.base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, self.log()[-4000:]
            time.sleep(0.2)
        self.ready_s = time.monotonic() - self.t0

    def log(self) -> str:
        return self.log_path.read_text()

    def ask(self) -> str:
        r = httpx.post(
            f"{self.base}/v1/completions",
            timeout=120,
            json={"model": "tiny", "prompt": "The capital of France is", "max_tokens": 8,
                  "temperature": 0},
        )  # fmt: skip
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    def wait_for_log(self, text: str, timeout: float = 600) -> None:
        """Keep asking (a step is where the worker looks) until the log says `text`."""
        deadline = time.monotonic() + timeout
        while text not in self.log():
            assert self.proc.poll() is None, self.log()[-4000:]
            assert time.monotonic() < deadline, self.log()[-4000:]
            self.ask()
            time.sleep(1)

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        deadline = time.monotonic() + 30
        while _group_alive(self.proc.pid):  # the compile process goes with the server
            assert time.monotonic() < deadline, "a process of the server outlived it"
            time.sleep(0.2)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.fixture(scope="module")
def tiny():
    from vllm_x86.bench.synthetic import build

    return build("tiny-llama")


def test_serves_eagerly_at_once_then_switches_to_the_compiled_model(tiny, tmp_path):
    env = clean_env(VLLM_X86_CACHE_DIR=str(tmp_path / "cache"))
    srv = Server(tiny, env, tmp_path / "first.log")
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
    again = Server(tiny, env, tmp_path / "again.log")
    try:
        log = again.log()
        assert "Directly load AOT compilation" in log, log[-4000:]
        assert EAGER_NOW not in log
        assert again.ask() == eager
    finally:
        again.stop()


def test_a_failed_background_compile_leaves_the_server_serving_eagerly(tiny, tmp_path):
    env = clean_env(VLLM_X86_CACHE_DIR=str(tmp_path / "cache"))
    srv = Server(tiny, env, tmp_path / "server.log")
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
