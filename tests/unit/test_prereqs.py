"""scripts/check_prereqs.py, the first step of `make install`: each missing prerequisite
gives its sentence and a non-zero exit within seconds, before anything is installed.

The torch check asks pip's indexes; here they are a local, empty or hand-made index
(PIP_CONFIG_FILE=/dev/null drops this machine's pip configuration), so no test uses the
network.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "check_prereqs.py"
FIX = "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu make install"


def _module():
    spec = importlib.util.spec_from_file_location("check_prereqs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


prereqs = _module()


def run(*args: str, env: dict[str, str] | None = None, limit: float = 10.0):
    """The script in a subprocess: (exit status, stdout + stderr), within `limit` s."""
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    took = time.monotonic() - start
    assert took < limit, f"the check took {took:.1f} s"
    return proc.returncode, proc.stdout + proc.stderr


def pip_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This environment without any pip setting of this machine, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


def empty_index(tmp_path: Path) -> str:
    index = tmp_path / "empty-index"
    index.mkdir()
    return index.as_uri()


def test_torch_missing_from_the_indexes_stops_with_the_command_that_fixes_it(tmp_path):
    rc, out = run("--only", "torch", env=pip_env(tmp_path, PIP_INDEX_URL=empty_index(tmp_path)))
    assert rc == 1, out
    assert "FAIL  torch 2.13.0+cpu" in out
    assert "it is on the PyTorch CPU wheel index" in out
    assert FIX in out
    assert "nothing was installed" in out


def test_torch_on_a_configured_index_passes(tmp_path):
    """An index that has the build (only its file name matters: pip reads the listing)."""
    links = tmp_path / "links"
    links.mkdir()
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    (links / f"torch-2.13.0+cpu-{tag}-{tag}-linux_x86_64.whl").write_bytes(b"")
    (links / f"torch-2.15.0-{tag}-{tag}-linux_x86_64.whl").write_bytes(b"")
    env = pip_env(tmp_path, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(links))
    rc, out = run("--only", "torch", env=env)
    assert rc == 0, out
    assert "ok    torch 2.13.0+cpu on pip's indexes" in out


def test_only_another_torch_on_the_index_fails(tmp_path):
    links = tmp_path / "links"
    links.mkdir()
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    (links / f"torch-2.13.0-{tag}-{tag}-linux_x86_64.whl").write_bytes(b"")
    rc, out = run(
        "--only", "torch", env=pip_env(tmp_path, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(links))
    )
    assert rc == 1 and FIX in out, out


def test_torch_already_in_the_venv_asks_no_index(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "torch-2.13.0+cpu.dist-info").mkdir(parents=True)
    env = pip_env(tmp_path, PIP_INDEX_URL=empty_index(tmp_path))
    rc, out = run("--venv", str(venv), "--only", "torch", env=env)
    assert rc == 0, out
    assert f"torch 2.13.0+cpu (already in {venv})" in out


def test_missing_compiler_names_what_to_install():
    env = dict(os.environ, CXX="/nonexistent/c++")
    rc, out = run("--only", "compiler", env=env)
    assert rc == 1, out
    assert "no C++ compiler: `/nonexistent/c++` was not found" in out
    assert "apt install g++" in out


def _fake_compiler(tmp_path: Path, message: str) -> str:
    cxx = tmp_path / "fake-c++"
    cxx.write_text(f"#!/bin/sh\necho '{message}' >&2\nexit 1\n")
    cxx.chmod(0o755)
    return str(cxx)


@pytest.mark.parametrize(
    "message, sentence",
    [
        ("probe.cpp:3:10: fatal error: omp.h: No such file or directory", "has no OpenMP"),
        ("/usr/bin/ld: cannot find -lgomp: No such file or directory", "has no OpenMP"),
        ("probe.cpp:6:22: error: '__m512bh' was not declared", "GCC 10 or newer"),
        ("probe.cpp:1: error: something else", "failed to compile a small OpenMP test file"),
    ],
)
def test_compiler_failures_say_what_is_missing(tmp_path, message, sentence):
    rc, out = run("--only", "compiler", env=dict(os.environ, CXX=_fake_compiler(tmp_path, message)))
    assert rc == 1, out
    assert sentence in out


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler on this machine")
def test_missing_python_headers_are_named(tmp_path):
    """The real compiler, pointed at a directory without Python.h."""
    with pytest.raises(prereqs.Failed, match="the Python headers are missing"):
        prereqs.check_compiler(include=str(tmp_path))


def test_a_venv_with_another_python_fails_with_a_sentence(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "python"
    fake.write_text("#!/bin/sh\necho 3 10 14\necho /usr/include/python3.10\n")
    fake.chmod(0o755)
    rc, out = run("--venv", str(venv), "--only", "python,venv")
    assert rc == 1, out
    assert "is Python 3.10.14: vllm-x86 needs Python 3.11 or 3.12" in out
    assert "make clean-venv" in out
    assert "ok    venv exists" in out


def test_python_versions():
    assert prereqs.check_python((3, 11, 7), "x") == "Python 3.11 (x)"
    assert prereqs.check_python((3, 12, 0), "x") == "Python 3.12 (x)"
    for version in ((3, 10, 12), (3, 13, 1)):
        with pytest.raises(prereqs.Failed, match="needs Python 3.11 or 3.12"):
            prereqs.check_python(version, "python3")


def test_platform_and_cpu_sentences():
    assert prereqs.check_platform("Linux", "x86_64") == "Linux on x86-64"
    with pytest.raises(prereqs.Failed, match="Linux on x86-64 only"):
        prereqs.check_platform("Darwin", "arm64")
    with pytest.raises(prereqs.Failed, match="Linux on x86-64 only"):
        prereqs.check_platform("Linux", "aarch64")
    ok = "processor : 0\nflags : fpu sse2 avx avx2 fma f16c avx512f amx_tile\n"
    assert prereqs.check_cpu(ok) == "CPU with AVX2 (AVX-512, AMX too)"
    with pytest.raises(prereqs.Failed, match="lacks AVX2, F16C: .* AVX2, FMA and F16C"):
        prereqs.check_cpu("flags : fpu sse2 avx fma\n")


def test_unknown_check_is_refused():
    rc, out = run("--only", "torch,gpu")
    assert rc == 2
    assert "unknown check(s) gpu" in out


def test_every_check_runs_and_each_failure_is_reported(tmp_path):
    """All six at once, two of them failing: both sentences, one summary, exit 1."""
    env = pip_env(tmp_path, PIP_INDEX_URL=empty_index(tmp_path), CXX="/nonexistent/c++")
    rc, out = run(env=env)
    assert rc == 1, out
    assert out.count("FAIL") == 2
    assert "no C++ compiler" in out and FIX in out
    assert "2 prerequisite(s) missing; nothing was installed" in out


def test_the_script_needs_only_the_standard_library():
    """It runs before the venv exists, with the system Python: no project import, no
    third-party module."""
    tree = ast.parse(SCRIPT.read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules.add(node.module.split(".")[0])
    assert modules - {"__future__"} <= set(sys.stdlib_module_names), modules
