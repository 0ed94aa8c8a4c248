"""Compile a model ahead of time, so that its first `vllm-x86 serve` runs compiled.

vLLM compiles a model (Inductor, C++) the first time it is served in compiled mode; the
plugin's staged warm-up serves eagerly meanwhile and switches when the background
compile is done (runtime/startup/staged.py). On a small CPU that first minute or two
is slow twice over: eager decoding, and a compile process beside it. `vllm-x86 pull`
therefore compiles right after it pulls (``--no-compile`` skips it), and
`vllm-x86 demo` does the same before it serves, so a first `vllm-x86 serve MODEL`
finds the compiled model in the cache and answers compiled from the first request.

How: this starts the real server, ``vllm-x86 serve MODEL --no-daemon`` on a free
loopback port with the compile in the foreground (``VLLM_X86_STAGED_WARMUP=0``), waits
until it answers /health (vLLM has then compiled the model, saved it to its cache, and
the worker has sealed it with the plugin's manifest), and stops it. Starting the same
command line as a user's serve is what makes vLLM's cache key the same: the key hashes
the whole engine configuration (model, dtype, maximum length, quantization, compile
settings), which only vLLM's own argument parsing reproduces exactly. Served with other
flags (``--max-model-len``, ``--quantization``, ...) a model has another key, and its
first serve compiles in the background as before.

A marker in the model directory (``MARKER``) names the artifact the run produced or
loaded; the next pull checks that it is still in the cache (same plugin, vLLM, torch
and CPU: ``compile_cache.cache_root``), has its manifest, and was made by the same
runtime code (``runtime_fingerprint``), and compiles again only when one of them fails.
Two runs for the same model directory at once take turns (an flock on ``LOCK``): the
second waits and then loads what the first compiled.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from vllm_x86.runtime import diskfaults

MARKER = ".vllm-x86-compiled.json"
LOCK = ".vllm-x86-compile.lock"  # held while a compile of the directory's model runs
AOT_SUBDIR = "torch_compile_cache/torch_aot_compile"
MANIFEST = "vllm-x86-manifest.json"
# vLLM's log lines naming the artifact it loaded or wrote (a run can rewrite an entry
# that existed before: one an interrupted start left without its compiled model).
_LOADED = re.compile(
    r"(?:Directly load AOT compilation from path|saved AOT compiled function to) (\S+)"
)


class CompileAheadError(RuntimeError):
    """Compiling ahead failed; the message is meant for the user."""


def _say(msg: str) -> None:
    print(f"[vllm-x86 compile] {msg}", file=sys.stderr, flush=True)


def _cache_root() -> Path:
    from vllm_x86.runtime.startup.compile_cache import cache_root

    return cache_root()


def _entries(root: Path) -> set[str]:
    try:
        return {p.name for p in (root / AOT_SUBDIR).iterdir() if p.is_dir()}
    except OSError:
        return set()


def runtime_fingerprint() -> str:
    """The plugin's runtime code (compile_cache.runtime_fingerprint: what the engine
    configuration, and so vLLM's cache key, is made from besides the flags) and the C++
    wrapper setting as `vllm-x86 serve` will apply it."""
    import hashlib

    from vllm_x86.runtime.defaults import apply_layer_name_env
    from vllm_x86.runtime.startup.compile_cache import runtime_fingerprint as code

    h = hashlib.sha256()
    h.update(f"cpp_wrapper={apply_layer_name_env(dict(os.environ))};".encode())
    h.update(code().encode())
    return h.hexdigest()[:16]


def compiled_artifact(model_dir: Path) -> Path | None:
    """The compiled artifact a previous compile-ahead recorded for this model directory,
    if it is still in this machine's and this install's compile cache; else None."""
    try:
        data = json.loads((Path(model_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    root = _cache_root()
    if data.get("cache_root") != str(root):
        return None  # another plugin, vLLM, torch or CPU compiled it
    if data.get("runtime") != runtime_fingerprint():
        return None  # other plugin code: its engine configuration may differ
    entry = root / AOT_SUBDIR / str(data.get("artifact", ""))
    return entry if data.get("artifact") and (entry / MANIFEST).is_file() else None


def _entry_of(path: str) -> str | None:
    """The artifact directory's name in a path vLLM logged (…/torch_aot_compile/<hash>/…)."""
    parts = Path(path).parts
    if "torch_aot_compile" in parts:
        i = parts.index("torch_aot_compile")
        return parts[i + 1] if i + 1 < len(parts) else None
    return None


def can_compile() -> str | None:
    """None when this machine can compile a model; otherwise why not (a sentence)."""
    from vllm_x86.runtime import hardware

    if hardware.cxx_compiler() is None:
        return (
            "no C++ compiler ($CXX, g++, c++ or clang++ on PATH): vLLM's compiled mode "
            "needs one, so `vllm-x86 serve` runs eagerly here"
        )
    return None


def _wait_ready(base: str, proc: subprocess.Popen, log_path: str, timeout: float) -> None:
    t0 = time.monotonic()
    last = t0
    while True:
        if proc.poll() is not None:
            with open(log_path, errors="replace") as f:
                tail = f.read()[-2500:]
            raise CompileAheadError(
                f"the compile run exited with code {proc.returncode} before the model "
                f"was ready (log: {log_path}); the first `vllm-x86 serve` will compile "
                f"in the background instead. End of the log:\n{tail}"
            )
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        now = time.monotonic()
        if now - t0 > timeout:
            raise CompileAheadError(
                f"compiling took more than {timeout:.0f} s and was stopped (log: "
                f"{log_path}); the first `vllm-x86 serve` will compile in the background"
            )
        if now - last >= 10:
            _say(f"compiling ... {now - t0:.0f} s")
            last = now
        time.sleep(0.5)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def compile_ahead(
    model: str, model_dir: Path, serve_args: tuple[str, ...] = (), timeout: float = 1800.0
) -> Path | None:
    """Compile `model` (a catalog name or directory, as given to `vllm-x86 serve`) for
    `vllm-x86 serve model *serve_args`, unless already done; return the artifact
    directory (None when the run neither compiled nor loaded one it could name)."""
    found = compiled_artifact(model_dir)
    if found is not None:
        _say(f"already compiled for this machine ({found.name[:12]}…)")
        return found
    with _compile_lock(model, Path(model_dir)):
        found = compiled_artifact(model_dir)  # compiled by the run this one waited for
        if found is not None:
            _say(f"compiled meanwhile by the other run ({found.name[:12]}…)")
            return found
        return _compile(model, Path(model_dir), serve_args, timeout)


@contextlib.contextmanager
def _compile_lock(model: str, model_dir: Path):
    """One compile of a model at a time: a second `pull` or `demo` of the same model (two
    terminals, two test workers) waits for the first one's compile and then loads it,
    instead of compiling it again beside it on the same cores. An flock on LOCK in the
    model directory, released when the process ends however it ends; a directory this
    process cannot write to is compiled without it."""
    try:
        f = open(model_dir / LOCK, "a")
    except OSError:
        yield
        return
    from vllm_x86.tools.models.pull import lock_or_wait

    with f:
        lock_or_wait(f, f"another process is compiling {model}; waiting for it to finish", _say)
        yield


def _compile(model: str, model_dir: Path, serve_args: tuple[str, ...], timeout: float):
    from vllm_x86.tools.ports import free_port

    root = _cache_root()
    before = _entries(root)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="vllm-x86-compile-", suffix=".log", delete=False)
    _say(
        f"compiling {model} for this CPU, so that `vllm-x86 serve` runs compiled from its "
        f"first request (a minute or two on a small CPU; once per model and machine; "
        f"--no-compile skips it). Log: {log.name}"
    )
    env = dict(os.environ)
    env["VLLM_X86_STAGED_WARMUP"] = "0"  # compile in the foreground: ready = compiled
    cmd = [sys.executable, "-m", "vllm_x86.tools.cli", "serve", model, "--no-daemon"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), *serve_args]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        _wait_ready(base, proc, log.name, timeout)
    finally:
        _stop(proc)
    text = Path(log.name).read_text(errors="replace")
    new = sorted(_entries(root) - before)
    loaded = _LOADED.findall(text)
    name = new[-1] if new else (_entry_of(loaded[-1]) if loaded else None)
    if name is None or not (root / AOT_SUBDIR / name).is_dir():
        _say(
            f"the model ran, but no compiled artifact could be named (log: {log.name}); "
            "the first `vllm-x86 serve` will compile in the background if it needs to"
        )
        return None
    record = {
        "cache_root": str(root),
        "runtime": runtime_fingerprint(),
        "artifact": name,
        "serve_args": list(serve_args),
    }
    try:
        diskfaults.write_atomic(Path(model_dir) / MARKER, json.dumps(record, indent=1))
    except OSError as e:
        _say(f"could not record the compiled artifact in {model_dir} ({e.strerror})")
    what = "compiled" if new else "found compiled"
    _say(f"{what} in {time.monotonic() - t0:.0f} s: {root / AOT_SUBDIR / name}")
    try:
        os.unlink(log.name)
    except OSError:
        pass
    return root / AOT_SUBDIR / name
