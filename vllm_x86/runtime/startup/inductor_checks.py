"""Inductor's once-per-process checks of a compiled start, taken off its path.

Before vLLM can load (or build) a compiled model, Inductor computes three things once
per process and caches them there:

- ``torch_key``: a SHA-256 of torch's Python sources, part of the compile cache's key;
- ``CacheBase.get_system``: imports Triton to hash its sources (``triton_key``), also
  part of the key, Triton being installed even where it has no CPU backend;
- ``valid_vec_isa_list``: which vector ISAs (AVX-512, AVX2, AVX-512 BF16) its C++
  compiler can build *and* load, each checked by ``dlopen``-ing a test library in a
  fresh Python subprocess.

On the 2-vCPU development VM they took 0.5-0.8 s and 0.8 s of every compiled start,
daemon starts included, in the engine process's path (py-spy of a SmolLM2 start from
the daemon, 2026-12-06). They read files and wait on subprocesses, so they overlap
well with other work:

- the worker starts them in a background thread as the engine process begins
  (``start``, before it pins its threads, so the thread and its subprocesses may run
  on the other core while the weights load) and waits for them before its first
  compiled call (``wait``);
- the daemon runs them before it forks any model server (``compute``), whose processes
  inherit the results.

Nothing of torch is changed: these are torch's own functions, called earlier. If one
fails here it is logged, and Inductor computes it again where it always did.
"""

from __future__ import annotations

import threading
import time

from vllm_x86.runtime.log import get_logger

logger = get_logger("inductor_checks")

_thread: threading.Thread | None = None
_result: dict[str, object] = {}


def compute() -> list[str]:
    """Run the three checks now, in this thread. Returns what could not be computed
    (``name (error)``), empty when all were."""
    failed = []
    t0 = time.perf_counter()
    try:
        from torch._inductor import codecache, cpu_vec_isa
    except Exception as e:  # a torch without Inductor: nothing to prepare
        return [f"torch._inductor ({type(e).__name__}: {e})"]
    for name, fn in (
        ("torch_key", getattr(codecache, "torch_key", None)),
        ("CacheBase.get_system", getattr(getattr(codecache, "CacheBase", None), "get_system", None)),
        ("valid_vec_isa_list", getattr(cpu_vec_isa, "valid_vec_isa_list", None)),
    ):
        try:
            if fn is None:
                raise AttributeError("not in this torch")
            fn()
        except Exception as e:
            failed.append(f"{name} ({type(e).__name__}: {e})")
    _result["seconds"] = time.perf_counter() - t0
    _result["failed"] = failed
    return failed


def start() -> None:
    """Start ``compute`` in a background thread (once per process)."""
    global _thread
    if _thread is not None:
        return
    _thread = threading.Thread(target=compute, name="vllm-x86-inductor-checks", daemon=True)
    _thread.start()


def wait() -> None:
    """Wait for a started ``compute`` (no-op when none was started) and log it."""
    global _thread
    if _thread is None:
        return
    t0 = time.perf_counter()
    _thread.join()
    _thread = None
    failed = _result.get("failed") or []
    for f in failed:
        logger.warning("vllm-x86: Inductor's start-up check %s failed beside the start; "
                       "Inductor runs it again when it needs it", f)
    logger.debug(
        "vllm-x86: Inductor's start-up checks took %.2f s beside the start (waited %.2f s)",
        _result.get("seconds", 0.0),
        time.perf_counter() - t0,
    )
