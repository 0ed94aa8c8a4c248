"""Start-up work done once instead of in every engine start: Inductor's per-process checks
run beside the start (startup/inductor_checks.py), and vLLM CPU's Triton-kernel stand-ins
registered once per process tree (X86Platform.register_triton_kernel_overrides)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


def _run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _run_in(cache, code: str) -> str:
    env = dict(os.environ, VLLM_X86_CACHE_DIR=str(cache))
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


_BOOM = """
def boom(*a, **k):
    raise AssertionError("computed again")
from torch._inductor import codecache, cpu_vec_isa
import torch._inductor.runtime.triton_compat as tc
codecache.build_code_hash = boom
tc.triton_key = boom
import subprocess, sys
_run = subprocess.run
def no_probe(cmd, *a, **k):  # the dlopen probe is a Python subprocess; g++ --version is fine
    if cmd and cmd[0] == sys.executable:
        raise AssertionError("probed again")
    return _run(cmd, *a, **k)
subprocess.run = no_probe
"""


@pytest.mark.slow  # imports vLLM in a fresh interpreter
def test_a_second_start_reads_inductors_checks_back(tmp_path):
    # A first process computes the checks beside its start (start/wait) and remembers
    # them; a second one gets the same answers with torch's hashing and probing made
    # to fail: nothing is computed again.
    first = _run_in(
        tmp_path,
        """
        from vllm_x86.runtime.startup import inductor_checks
        inductor_checks.start()
        inductor_checks.wait()
        assert inductor_checks._result["failed"] == [], inductor_checks._result
        from torch._inductor import codecache, cpu_vec_isa
        print(codecache.torch_key().hex())
        print(codecache.CacheBase.get_system()["hash"])
        print([str(i) for i in cpu_vec_isa.valid_vec_isa_list()])
        """,
    )
    assert (tmp_path / "inductor-keys.json").is_file()
    second = _run_in(
        tmp_path,
        _BOOM
        + """
from vllm_x86.runtime.startup import inductor_checks
failed = inductor_checks.compute()
assert failed == [], failed
print(codecache.torch_key().hex())
print(codecache.CacheBase.get_system()["hash"])
print([str(i) for i in cpu_vec_isa.valid_vec_isa_list()])
""",
    )
    assert second == first
    assert "avx2" in first.splitlines()[-1]


def test_the_stamp_follows_the_files(tmp_path):
    from vllm_x86.runtime.startup import inductor_checks

    (tmp_path / "pkg").mkdir()
    f = tmp_path / "pkg" / "a.py"
    f.write_text("x = 1\n")
    (tmp_path / "pkg" / "notes.txt").write_text("not a module")
    before = inductor_checks._stamp(str(tmp_path))
    (tmp_path / "pkg" / "notes.txt").write_text("other")  # not what torch hashes
    assert inductor_checks._stamp(str(tmp_path)) == before
    f.write_text("x = 22\n")
    assert inductor_checks._stamp(str(tmp_path)) != before


def test_inductor_checks_wait_without_start_is_a_no_op():
    from vllm_x86.runtime.startup import inductor_checks

    inductor_checks.wait()


@pytest.mark.slow  # imports vLLM in a fresh interpreter
def test_triton_kernel_overrides_once_per_process_tree():
    # Registered in a parent (the daemon's role), the kernels stay rebound in a forked
    # child, which skips vLLM's scan of every module; a fresh process registers.
    out = _run(
        """
        import os
        from vllm.platforms import current_platform
        from vllm.triton_utils import HAS_TRITON
        from vllm.triton_utils import dispatcher
        from vllm.v1.worker import block_table
        assert type(current_platform).__name__ == "X86Platform"
        if HAS_TRITON:
            print("triton has a CPU backend: nothing to register")
            raise SystemExit(0)
        # (in a tuple: vLLM's scan rebinds module globals, this script's too)
        before = (block_table.ComputeSlotMappingKernel.kernel,)
        assert not isinstance(before[0], dispatcher.KernelOverride)
        current_platform.register_triton_kernel_overrides()
        after = block_table.ComputeSlotMappingKernel.kernel
        assert isinstance(after, dispatcher.KernelOverride), after
        pid = os.fork()
        if pid == 0:
            def boom(*a, **k):
                raise AssertionError("scanned again")
            dispatcher._rebind_kernels = boom
            dispatcher.register_kernels = boom
            try:
                current_platform.register_triton_kernel_overrides()
                assert block_table.ComputeSlotMappingKernel.kernel is after
            except BaseException as e:
                print("child:", e)
                os._exit(1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        print("once")
        """
    )
    assert out.strip().splitlines()[-1] in ("once", "triton has a CPU backend: nothing to register")


def test_daemon_prepares_the_op_table_modules():
    from vllm_x86.tools.daemon.server import _op_table_modules

    mods = _op_table_modules()
    assert "vllm_x86.runtime.quant.linear" in mods and "vllm.model_executor.layers.linear" in mods
    import importlib

    for m in mods:
        importlib.import_module(m)
    assert os.environ.get("VLLM_X86_DISABLE") != "1"
