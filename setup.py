"""Builds vllm_x86._C, the plugin's CPU kernels, at install time.

`make install` runs `pip install --no-build-isolation -e .`, so the extension links to
the torch already in the venv (an isolated build would fetch another, multi-GB torch
with another ABI). One library holds AVX2, AVX-512 and AVX-512-BF16 versions of every
kernel (each compiled with `#pragma GCC target` in its own file) and picks one at run
time, so the same build runs on any x86-64 CPU with AVX2.

Flags that matter for correctness:
- `-ffp-contract=off`: never fuse a multiply and an add into an FMA where the reference
  rounds them separately (the rotary kernel must be bit-identical to vLLM's reference);
- no `-ffast-math`: IEEE semantics, NaN and infinities as torch has them.
"""

import os

from setuptools import setup

ext_modules = []
cmdclass = {}
if os.environ.get("VLLM_X86_SKIP_KERNELS") != "1":
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    csrc = "vllm_x86/csrc"
    ext_modules.append(
        CppExtension(
            name="vllm_x86._C",
            sources=[
                f"{csrc}/bindings.cpp",
                f"{csrc}/ops.cpp",
                f"{csrc}/isa_avx2.cpp",
                f"{csrc}/isa_avx512.cpp",
                f"{csrc}/isa_avx512bf16.cpp",
                f"{csrc}/amx_gemm.cpp",
                f"{csrc}/vnni_gemm.cpp",
            ],
            extra_compile_args=["-O3", "-std=c++17", "-ffp-contract=off", "-fopenmp"],
            extra_link_args=["-fopenmp"],
        )
    )
    cmdclass["build_ext"] = BuildExtension.with_options(use_ninja=False)

setup(ext_modules=ext_modules, cmdclass=cmdclass)
