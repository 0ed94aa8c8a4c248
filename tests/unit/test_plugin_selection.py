"""vLLM picks the plugin up through its entry points, and not when it is disabled."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import PYTHON, clean_env

WHICH_PLATFORM = (
    "from vllm.platforms import current_platform; "
    "print('PLATFORM', type(current_platform).__module__, type(current_platform).__name__, "
    "current_platform.is_cpu())"
)


def _platform(**env) -> str:
    p = subprocess.run(
        [PYTHON, "-c", WHICH_PLATFORM],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("PLATFORM")]
    assert lines, p.stderr[-3000:]
    return lines[0]


@pytest.mark.slow  # a fresh interpreter importing vLLM (~10 s here)
def test_vllm_selects_the_plugin():
    assert _platform() == "PLATFORM vllm_x86.runtime.platform X86Platform True"


@pytest.mark.slow  # a fresh interpreter importing vLLM (~10 s here)
def test_disable_gives_stock_vllm_cpu():
    assert _platform(VLLM_X86_DISABLE="1") == "PLATFORM vllm.platforms.cpu CpuPlatform True"


def test_register_returns_platform_path(monkeypatch):
    import vllm_x86

    monkeypatch.delenv("VLLM_X86_DISABLE", raising=False)
    assert vllm_x86.register() == "vllm_x86.runtime.platform.X86Platform"
    monkeypatch.setenv("VLLM_X86_DISABLE", "1")
    assert vllm_x86.register() is None


def test_register_declines_without_avx2(monkeypatch):
    import vllm_x86
    from vllm_x86.runtime import hardware

    info = hardware.cpu_info()
    no_avx2 = hardware.CpuInfo(
        arch="x86_64",
        model_name="old",
        flags=frozenset({"sse4_2"}),
        logical_cpus=info.logical_cpus,
        physical_cores=info.physical_cores,
        numa_nodes=info.numa_nodes,
        cpus_by_node=info.cpus_by_node,
        core_cpus=info.core_cpus,
    )
    monkeypatch.setattr(hardware, "cpu_info", lambda: no_avx2)
    monkeypatch.delenv("VLLM_X86_DISABLE", raising=False)
    assert vllm_x86.register() is None
    path, reason = vllm_x86.platform_decision()
    assert path is None and "AVX2" in reason


def test_import_is_light():
    """Importing the package (what vLLM does to call register()) pulls in neither torch
    nor vLLM and reads no hardware."""
    code = (
        "import sys, builtins; opened = []\n"
        "real_open = builtins.open\n"
        "builtins.open = lambda f, *a, **k: (opened.append(str(f)), real_open(f, *a, **k))[1]\n"
        "import vllm_x86\n"
        "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))\n"
        "print([f for f in opened if f.startswith(('/proc', '/sys'))])\n"
    )
    p = subprocess.run([PYTHON, "-c", code], env=clean_env(), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["[]", "[]"]
