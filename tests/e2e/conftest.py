"""The OpenAI server that tests/e2e/test_robustness.py and tests/e2e/test_fuzz.py send
bad input, abandoned streams and fuzzed requests to: one `vllm-x86 serve` of the
default model (eager, 256-token context, so a prompt over the context is cheap), on a
free loopback port, for the session. Under `make test`'s xdist a worker starts it once
for whichever of the two modules it runs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import PYTHON, clean_env

MAX_LEN = 256


class ServeProcess:
    """`vllm-x86 serve MODEL --no-daemon ARGS` on a free loopback port, ready
    (``/health`` answers 200) when constructed; ``stop()`` ends its process group."""

    def __init__(self, model: str, args: list[str], log_path: Path, env=None, timeout=600):
        from vllm_x86.tools.ports import free_port

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(
                [PYTHON, "-m", "vllm_x86.tools.cli", "serve", model, "--no-daemon",
                 "--port", str(self.port), *args],
                stdout=log, stderr=subprocess.STDOUT, env=env or clean_env(),
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"server exited ({self.proc.returncode}):\n{self.log()[-4000:]}")
            try:
                if httpx.get(f"{self.base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"server not ready in {timeout} s:\n{self.log()[-4000:]}")
            time.sleep(0.5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def group_pids(self) -> dict[int, str]:
        """pid -> process name (comm) of every process of the server's group."""
        out = {}
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                if os.getpgid(int(p)) == self.proc.pid:
                    out[int(p)] = Path(f"/proc/{p}/comm").read_text().strip()
            except (OSError, ProcessLookupError):
                continue
        return out

    def metrics(self) -> dict[str, float]:
        """vLLM's request gauges and finished-request counters, summed over engines:
        ``running``, ``waiting`` and ``finished:<reason>``."""
        text = httpx.get(f"{self.base}/metrics", timeout=10).text
        out: dict[str, float] = {"running": 0.0, "waiting": 0.0}
        for name, labels, value in re.findall(r"^vllm:(\w+)\{([^}]*)\} (\S+)$", text, re.M):
            if name == "num_requests_running":
                out["running"] += float(value)
            elif name == "num_requests_waiting":
                out["waiting"] += float(value)
            elif name == "request_success_total":
                reason = re.search(r'finished_reason="(\w+)"', labels)
                key = f"finished:{reason.group(1) if reason else '?'}"
                out[key] = out.get(key, 0.0) + float(value)
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything of the group left behind
        except ProcessLookupError:
            pass


@pytest.fixture(scope="session")
def openai_server(default_model, tmp_path_factory):
    """The default model served as its catalog name, eager, 256-token context."""
    srv = ServeProcess(
        default_model.name,
        ["--enforce-eager", "--max-model-len", str(MAX_LEN)],
        tmp_path_factory.mktemp("openai_server") / "server.log",
    )
    srv.model = default_model.name
    try:
        yield srv
    finally:
        srv.stop()
