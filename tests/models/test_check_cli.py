"""`vllm-x86 check` end to end on the default model (real weights: 0.25 GiB)."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import PYTHON, clean_env


@pytest.mark.slow
def test_check_passes_every_stage_on_the_default_model(default_model):
    p = subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.cli", "check", str(default_model)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = p.stdout
    assert p.returncode == 0, out[-3000:] + p.stderr[-3000:]
    assert "checking the real weights" in out
    assert "vllm-x86 kernel" in out  # the op inventory shows the plugin's rows
    for stage in ("architecture", "ops", "parity", "speed"):
        assert f"   {stage:<13} ok" in out
    assert "fp32-eager     ok  tokens_equal 16" in out
