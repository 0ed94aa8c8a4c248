"""Exposure, for real: `vllm-x86 serve` on every interface without a key starts and says
the risk; with a key, the OpenAI API refuses requests that lack it.

The every-interface server runs in a network namespace the test makes (`unshare --net`,
only a loopback device inside), so nothing outside this test can reach it; the test's
requests enter the same namespace with `nsenter`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from tests.conftest import PYTHON, clean_env
from vllm_x86.tools.bench.server import stop_group
from vllm_x86.tools.ports import free_port

pytestmark = pytest.mark.slow

WARNING = "vllm-x86: warning: the OpenAI server listens on 0.0.0.0 (every network interface)"


@pytest.fixture(scope="module")
def tiny():
    from vllm_x86.tools.bench.synthetic import build

    return build("tiny-llama")


def _serve_cmd(model, port: int, *extra: str) -> list[str]:
    return [PYTHON, "-m", "vllm_x86.tools.cli", "serve", str(model), "--no-daemon",
            "--port", str(port), "--max-model-len", "128", "--dtype", "float32",
            "--enforce-eager", "--served-model-name", "tiny", *extra]  # fmt: skip


def _curl(prefix: list[str], url: str, key: str | None = None) -> tuple[int, str]:
    cmd = [*prefix, "curl", "-s", "-m", "20", "-o", "-", "-w", "\n%{http_code}", url]
    if key is not None:
        cmd += ["-H", f"Authorization: Bearer {key}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    body, _, code = out.rpartition("\n")
    return int(code or 0), body


def _wait_healthy(proc, prefix, base, log) -> None:
    deadline = time.monotonic() + 300
    while _curl(prefix, f"{base}/health")[0] != 200:
        assert proc.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() < deadline, log.read_text()[-4000:]
        time.sleep(0.5)


def _can_unshare_net() -> bool:
    if not shutil.which("unshare") or not shutil.which("nsenter") or not shutil.which("ip"):
        return False
    r = subprocess.run(["unshare", "--net", "true"], capture_output=True)
    return r.returncode == 0


@pytest.mark.skipif(
    not _can_unshare_net(), reason="needs unshare/nsenter (root) for a network namespace"
)
def test_every_interface_without_a_key_starts_with_a_warning(tiny, tmp_path):
    port = 8000  # the namespace is private: nothing else listens there
    log = tmp_path / "serve.log"
    env = clean_env()
    env.pop("VLLM_API_KEY", None)
    script = "ip link set lo up && exec " + " ".join(_serve_cmd(tiny, port, "--host", "0.0.0.0"))
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            ["unshare", "--net", "sh", "-c", script],
            env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    prefix = ["nsenter", "-t", str(proc.pid), "-n"]
    try:
        _wait_healthy(proc, prefix, f"http://127.0.0.1:{port}", log)
        text = log.read_text()
        assert WARNING in text, text[-3000:]
        assert "--api-key KEY (or set VLLM_API_KEY)" in text
        # It started all the same, on every interface of its namespace, and answers.
        code, body = _curl(prefix, f"http://127.0.0.1:{port}/v1/models")
        assert code == 200 and json.loads(body)["data"][0]["id"] == "tiny"
        listen = subprocess.run([*prefix, "ss", "-Hltn"], capture_output=True, text=True).stdout
        assert f"0.0.0.0:{port}" in listen, listen
    finally:
        stop_group(proc, grace_s=60)


def test_with_a_key_the_api_refuses_requests_without_it(tiny, tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    env = clean_env(VLLM_API_KEY="s3cret-key")
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            _serve_cmd(tiny, port), env=env, stdout=fh, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, [], base, log)
        assert "warning: the OpenAI server" not in log.read_text()  # loopback: no warning
        code, body = _curl([], f"{base}/v1/models")
        assert code == 401, body
        assert "Unauthorized" in body
        code, body = _curl([], f"{base}/v1/models", key="wrong")
        assert code == 401, body
        code, body = _curl([], f"{base}/v1/models", key="s3cret-key")
        assert code == 200 and json.loads(body)["data"][0]["id"] == "tiny"
        # vLLM's SageMaker route generates too: the plugin guards it (runtime/patches/api_auth.py)
        r = subprocess.run(
            ["curl", "-s", "-m", "60", "-w", "\n%{http_code}", f"{base}/invocations",
             "-H", "Content-Type: application/json",
             "-d", json.dumps({"model": "tiny", "prompt": "Hello", "max_tokens": 4})],
            capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        assert r.stdout.endswith("\n401") and "Unauthorized" in r.stdout, r.stdout
        assert _curl([], f"{base}/health")[0] == 200  # probes stay open
        # A completion with the key works; without it, nothing is generated.
        r = subprocess.run(
            ["curl", "-s", "-m", "60", "-w", "\n%{http_code}", f"{base}/v1/completions",
             "-H", "Content-Type: application/json", "-H", "Authorization: Bearer s3cret-key",
             "-d", json.dumps({"model": "tiny", "prompt": "Hello", "max_tokens": 4})],
            capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        body, _, code = r.stdout.rpartition("\n")
        assert code == "200" and json.loads(body)["usage"]["completion_tokens"] == 4, r.stdout
        # `vllm-x86 chat` sends VLLM_API_KEY, as the server reads it
        chat = [PYTHON, "-m", "vllm_x86.tools.cli", "chat", "--url", f"{base}/v1", "--quick",
                "Hello", "--max-tokens", "4"]  # fmt: skip
        r = subprocess.run(chat, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "[4 tokens" in r.stderr, r.stderr[-2000:]
    finally:
        stop_group(proc, grace_s=60)
