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

The two source hashes are also kept on disk (``<VLLM_X86_CACHE_DIR>/inductor-keys.json``),
each under a stamp of the files it hashes (path, size and modification time of every
Python and extension-module file of the torch or Triton package, and torch's version):
computed beside a start that overlapped with other work they took 1.5-3 s of the
engine's start (the GIL and two cores shared with the weight loading); read back they
take the 40-100 ms of the stamp. They go back into torch through its own cache API
(``torch_key.set``, ``triton_key.set``; ledger: inductor_source_keys). A changed file, a
reinstalled or upgraded package changes the stamp, and the hash is computed again.

The vector-ISA check is remembered the same way: a test library that has loaded once
(its path, size and modification time, on a CPU with the same ISA flags, beside the
same torch) is not dlopen-ed again in a subprocess (each took about 0.45 s here: a
Python start loading libtorch); the check itself stays torch's (ledger:
inductor_isa_probe_memo).

Nothing else of torch is changed: the rest are torch's own functions, called earlier.
If one fails here it is logged, and Inductor computes it again where it always did.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

from vllm_x86.runtime.log import get_logger

logger = get_logger("inductor_checks")

MEMO_FILE = "inductor-keys.json"
# The file kinds build_code_hash reads (modules: sources and extension modules), plus
# what torch_key adds by name.
_STAMPED = (".py", ".so")
_TORCH_EXTRA = ("codegen/aoti_runtime/interface.cpp", "script.ld")


def _stamp(root: str, extra: tuple[str, ...] = ()) -> str:
    """A hash of where, how large and how recent every module file under `root` is."""
    h = hashlib.sha256(root.encode())

    def add(path: str) -> None:
        try:
            st = os.stat(path)
        except OSError:  # gone, or an extra file this torch does not have
            return
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())

    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith(_STAMPED):
                add(os.path.join(dirpath, f))
    for rel in extra:
        add(os.path.join(root, rel))
    return h.hexdigest()


def _memo_path() -> Path:
    from vllm_x86.runtime import envs

    return Path(envs.cache_dir()) / MEMO_FILE


def _read_memo() -> dict:
    try:
        data = json.loads(_memo_path().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_memo(entries: dict) -> None:
    from vllm_x86.runtime import diskfaults

    path = _memo_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        diskfaults.write_atomic(path, json.dumps(entries, indent=1, sort_keys=True))
    except OSError as e:  # a read-only cache: computed again next time
        logger.debug("vllm-x86: could not keep Inductor's source hashes in %s: %s", path, e)


def _probe_key(output_path: str) -> str | None:
    from vllm_x86.runtime import hardware

    try:
        st = os.stat(output_path)
    except OSError:
        return None
    import torch

    cpu = hardware.cpu_info()
    flags = ",".join(sorted(f for f in hardware.ISA_FLAGS if cpu.has(f)))
    # torch's version too: the probe loads the library beside that torch's libraries
    return f"{output_path}|{st.st_size}|{st.st_mtime_ns}|{flags}|{torch.__version__}"


def remember_isa_probes() -> None:
    """Make Inductor's dlopen probe of a vector-ISA test library (VecISA._probe_load)
    answer from the memo for a library that loaded before (idempotent)."""
    from torch._inductor import cpu_vec_isa

    from vllm_x86.runtime.patches.ledger import MARK

    original = cpu_vec_isa.VecISA.__dict__.get("_probe_load")
    if original is None or getattr(original, MARK, False):
        return

    def _probe_load(self, output_path: str) -> bool:
        key = _probe_key(output_path)
        if key is not None and key in _read_memo().get("isa_probes", []):
            return True
        ok = original(self, output_path)
        if ok and key is not None:
            memo = _read_memo()
            probes = [p for p in memo.get("isa_probes", []) if isinstance(p, str)]
            memo["isa_probes"] = sorted(set(probes[-63:] + [key]))
            _write_memo(memo)
        return ok

    setattr(_probe_load, MARK, True)
    cpu_vec_isa.VecISA._probe_load = _probe_load


def _source_keys() -> None:
    """torch_key and triton_key from the memo where their files are unchanged, else
    computed (by torch) and remembered."""
    import torch
    from torch._inductor import codecache

    memo = _read_memo()
    changed = False
    torch_root = os.path.dirname(torch.__file__)
    jobs = [
        ("torch_key", codecache.torch_key, _stamp(torch_root, _TORCH_EXTRA) + torch.__version__)
    ]
    triton_fn = getattr(codecache, "triton_key", None)
    try:
        import importlib.util

        spec = importlib.util.find_spec("triton")
    except (ImportError, ValueError):
        spec = None
    if triton_fn is not None and spec is not None and spec.submodule_search_locations:
        jobs.append(("triton_key", triton_fn, _stamp(list(spec.submodule_search_locations)[0])))
    for name, fn, stamp in jobs:
        entry = memo.get(name)
        if isinstance(entry, dict) and entry.get("stamp") == stamp and "value" in entry:
            value = entry["value"]
            value = bytes.fromhex(value["hex"]) if isinstance(value, dict) else value
            try:
                fn.set(value)
            except RuntimeError:  # already computed in this process
                pass
            continue
        value = fn()
        stored = {"hex": value.hex()} if isinstance(value, bytes) else value
        memo[name] = {"stamp": stamp, "value": stored}
        changed = True
    if changed:
        _write_memo(memo)


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
    try:
        _source_keys()
        remember_isa_probes()
    except Exception as e:  # the memo is an optimisation: torch computes them below
        failed.append(f"Inductor check memo ({type(e).__name__}: {e})")
    for name, fn in (
        ("torch_key", getattr(codecache, "torch_key", None)),
        (
            "CacheBase.get_system",
            getattr(getattr(codecache, "CacheBase", None), "get_system", None),
        ),
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
        logger.warning(
            "vllm-x86: Inductor's start-up check %s failed beside the start; "
            "Inductor runs it again when it needs it",
            f,
        )
    logger.debug(
        "vllm-x86: Inductor's start-up checks took %.2f s beside the start (waited %.2f s)",
        _result.get("seconds", 0.0),
        time.perf_counter() - t0,
    )
