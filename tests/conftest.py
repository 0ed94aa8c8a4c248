"""Shared fixtures. Tests that start an engine, a server or a model are marked slow;
`make test-fast` runs the rest in about a minute."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HELPERS = Path(__file__).resolve().parent / "helpers"
PYTHON = sys.executable


@pytest.fixture(scope="session")
def default_model() -> Path:
    """The default model (SmolLM2-135M-Instruct), pulled and converted once."""
    from vllm_x86.models.pull import pull

    return pull()


@pytest.fixture
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without any VLLM_X86_* / VLLM_CPU_* setting
    (so a developer's shell does not change what a test measures), plus `extra`.
    VLLM_X86_CACHE_DIR stays: it says where the models are, not how they run."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k == "VLLM_X86_CACHE_DIR" or not k.startswith(("VLLM_X86_", "VLLM_CPU_"))
    }
    env.update(extra)
    return env
