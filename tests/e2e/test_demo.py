"""`vllm-x86 demo` (what `make demo` runs), for real: pull, serve, ask, stop."""

from __future__ import annotations

import re
import socket
import subprocess

import pytest

from tests.conftest import PYTHON, clean_env

pytestmark = pytest.mark.slow


def test_demo_answers_the_question_and_stops_its_server(default_model):
    p = subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.cli", "demo", "--max-tokens", "16"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    # compiled, as `vllm-x86 serve` ends; the fp32 reference's answer
    # (tests/models/test_default_model_parity.py)
    assert "A: The capital of France is Paris." in p.stdout, p.stdout
    assert re.search(r"\[\d+ tokens in [\d.]+ s: [\d.]+ tokens/s; ", p.stdout), p.stdout
    assert "compiled, as `vllm-x86 serve` runs it" in p.stderr, p.stderr
    assert "4/4 stop the server" in p.stderr
    # the model was compiled ahead (by this demo or an earlier pull) and recorded
    from vllm_x86.tools.models.compile_ahead import compiled_artifact

    assert compiled_artifact(default_model) is not None
    port = int(re.search(r"start the server on http://127\.0\.0\.1:(\d+)", p.stderr).group(1))
    with socket.socket() as s:  # the server is gone: nothing listens on its port
        assert s.connect_ex(("127.0.0.1", port)) != 0
