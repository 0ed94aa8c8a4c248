"""vllm-x86: a vLLM platform plugin for x86 server CPUs (AMX, AVX-512, AVX2).

Entry points only (see pyproject.toml). Importing this package imports nothing heavy
and touches no hardware; vLLM calls the functions below.
"""

from __future__ import annotations

from vllm_x86._version import __version__
from vllm_x86.runtime.log import get_logger

__all__ = ["__version__", "platform_decision", "register", "register_ops"]

PLATFORM_CLASS = "vllm_x86.runtime.platform.X86Platform"

logger = get_logger("plugin")


def platform_decision() -> tuple[str | None, str]:
    """(platform class path or None, reason). Shared by register() and doctor."""
    from vllm_x86.runtime import envs

    if envs.disabled():
        return None, "VLLM_X86_DISABLE=1 is set: stock vLLM CPU will run"
    from vllm_x86.runtime import hardware

    ok, reason = hardware.plugin_supported()
    if not ok:
        return None, reason
    return PLATFORM_CLASS, reason


def register() -> str | None:
    """``vllm.platform_plugins`` entry point: the platform class path, or None."""
    path, reason = platform_decision()
    if path is None:
        logger.debug("vllm-x86 platform plugin not activated: %s", reason)
    return path


def register_ops() -> None:
    """``vllm.general_plugins`` entry point, called by vLLM in every process that
    inspects or builds a model: installs the runtime patches (runtime/patches/), registers
    the quantization methods and installs the op table (ops/registry.py) when
    X86Platform is vLLM's platform, and does nothing otherwise."""
    path, _ = platform_decision()
    if path is None:
        return
    from vllm_x86.runtime import patches, quant
    from vllm_x86.runtime.ops import registry

    patches.apply_all()
    quant.register()
    registry.register_all()
