"""A compiled `vllm-x86 serve` of the tiny random model (float32, 256 tokens, served as
"tiny") on a free loopback port, for the e2e tests that start one and restart it
(test_compile_cache.py, test_staged_warmup.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx

from tests.conftest import PYTHON
from vllm_x86.tools.ports import free_port


class TinyServer:
    """Started and ready (``/health`` answers) when constructed; ``stop()`` waits until
    every process of its group is gone."""

    def __init__(self, model, env, log_path):
        self.port = free_port()
        self.log_path = log_path
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(
                [PYTHON, "-m", "vllm_x86.tools.cli", "serve", str(model), "--no-daemon", "--port",
                 str(self.port), "--max-model-len", "256", "--dtype", "float32",
                 "--served-model-name", "tiny"],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.base = f"http://127.0.0.1:{self.port}"
        self.t0 = time.monotonic()
        deadline = self.t0 + 600
        try:
            while True:
                assert self.proc.poll() is None, self.log()[-4000:]
                try:
                    if httpx.get(f"{self.base}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, self.log()[-4000:]
                time.sleep(0.2)
        except BaseException:  # not ready: leave no server behind for the next test
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            raise
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
