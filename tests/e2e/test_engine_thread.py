"""`vllm-x86 serve` with the engine core as a thread of the server
(VLLM_X86_ENGINE_IN_SERVER=1, patches/engine_thread.py), for real: one process serves
the tiny model, gives the same greedy text as the server with its engine process,
answers concurrent requests and a bad one, and stops on Ctrl-C with status 0."""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import time

import httpx
import pytest

from tests.conftest import clean_env
from tests.e2e.conftest import ServeProcess

pytestmark = pytest.mark.slow

ARGS = ["--enforce-eager", "--max-model-len", "256", "--dtype", "float32",
        "--served-model-name", "tiny"]  # fmt: skip
IN_THREAD = "the engine core runs as a thread of the server process"


@pytest.fixture(scope="module")
def tiny():
    from vllm_x86.tools.bench.synthetic import build

    return str(build("tiny-llama"))


def _complete(base: str, prompt: str, n: int = 12) -> str:
    r = httpx.post(f"{base}/v1/completions", timeout=120,
                   json={"model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0})  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def _answers(srv: ServeProcess) -> list[str]:
    prompts = [f"Tell me about the number {i}." for i in range(4)]
    with cf.ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda p: _complete(srv.base, p), prompts))


def _stop(srv: ServeProcess) -> int:
    os.killpg(srv.proc.pid, signal.SIGINT)
    code = srv.proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while srv.group_pids():
        assert time.monotonic() < deadline, f"left behind: {srv.group_pids()}"
        time.sleep(0.2)
    return code


def test_one_process_serves_the_same_text_and_stops(tiny, tmp_path):
    env = clean_env(VLLM_X86_ENGINE_IN_SERVER="0")
    srv = ServeProcess(tiny, ARGS, tmp_path / "process.log", env=env)
    try:
        assert len(srv.group_pids()) == 2, srv.group_pids()  # the server and its engine
        assert IN_THREAD not in srv.log()
        expected = _answers(srv)
    finally:
        srv.stop()

    env = clean_env(VLLM_X86_ENGINE_IN_SERVER="1")
    srv = ServeProcess(tiny, ARGS, tmp_path / "thread.log", env=env)
    try:
        assert list(srv.group_pids()) == [srv.proc.pid], srv.group_pids()
        assert IN_THREAD in srv.log()
        assert _answers(srv) == expected  # four at once, float32: the same greedy text
        r = httpx.post(f"{srv.base}/v1/completions", timeout=60,
                       json={"model": "tiny", "prompt": "Hi", "max_tokens": -3})  # fmt: skip
        assert r.status_code == 400, r.text  # a bad request is refused, the engine stays
        assert _complete(srv.base, "Tell me about the number 0.") == expected[0]
        code = _stop(srv)
        assert code == 0, srv.log()[-3000:]
        assert "Traceback" not in srv.log(), srv.log()[-3000:]
    finally:
        srv.stop()
