"""A server whose compile cache is on a read-only disk: a warning in its log, and it
compiles into a temporary directory (removed when it exits) and answers, instead of
failing at start-up (the unit side, with a full disk too, is
tests/unit/test_disk_faults.py)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import clean_env
from tests.e2e.tiny_server import TinyServer

pytestmark = pytest.mark.slow


def test_server_with_a_read_only_compile_cache_serves_uncached(tmp_path):
    from vllm_x86.tools.bench.synthetic import build

    tiny = build("tiny-llama")
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0:
        pytest.skip("needs root and mount(2) for a small tmpfs")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(ro)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("needs root and mount(2) for a small tmpfs")
    try:
        # staged warm-up (the default of `vllm-x86 serve`): it answers eagerly while its
        # compile process compiles into the temporary directory
        env = clean_env(VLLM_X86_CACHE_DIR=str(ro))
        srv = TinyServer(tiny, env, tmp_path / "server.log")
        try:
            assert srv.ask()
        finally:
            srv.stop()
        log = srv.log()
        m = re.search(
            r"vllm-x86: compile cache not used: cannot write to (\S+): read-only file "
            r"system; set VLLM_X86_CACHE_DIR to a writable directory with room; this start "
            r"compiles into (\S+), removed when it exits",
            log,
        )
        assert m, log[-4000:]
        assert m[1].startswith(str(ro / "compile"))
        assert "compiling in the background" in log  # compiled mode, uncached
        assert not Path(m[2].rstrip(",")).exists()  # removed when the server exited
        assert not any(ro.iterdir())
    finally:
        subprocess.run(["umount", "-l", str(ro)], capture_output=True)
