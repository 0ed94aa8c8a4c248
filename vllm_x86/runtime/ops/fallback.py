"""The one way the op table reports that a kernel could not be used.

No silent fallback (docs/architecture.md). When a plugin kernel cannot run (library not built,
dtype or layout it does not handle), the op runs its reference implementation and the
plugin logs one WARNING per op and reason.
"""

from __future__ import annotations

from vllm_x86.runtime.log import get_logger

logger = get_logger("ops")
_warned: set[tuple[str, str]] = set()


def warn_fallback(op: str, reason: str) -> None:
    key = (op, reason)
    if key in _warned:
        return
    _warned.add(key)
    logger.warning("vllm-x86: %s runs vLLM's reference implementation here: %s", op, reason)
