"""What the project's forked child processes share (the daemon's model servers, the
staged warm-up's compile process): asking the kernel for a signal when the parent dies,
and leaving without running the parent's exit handlers."""

from __future__ import annotations

import ctypes
import os
import sys
from typing import NoReturn

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: no orphan handling, still works
        pass


def die_with_parent(sig: int) -> None:
    """The kernel sends this process `sig` when the thread that forked it exits."""
    prctl(PR_SET_PDEATHSIG, sig)


def exit_now(code: int) -> NoReturn:
    """Flush what the child printed and leave at once (``os._exit``): a forked child
    must not run the parent's atexit handlers or finalizers."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)
