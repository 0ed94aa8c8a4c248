"""A full or unwritable disk while writing: the sentence a user reads, and the removal
of what an interrupted write left behind.

Every writer of the plugin (``vllm-x86 pull``, ``vllm-x86 quantize``, the compile
cache) writes under a temporary name in the directory of its result and renames it
when it is whole, so a later start never trusts a half-written directory; what a
killed run left under such a name is removed by the next run, which says so in one
line (leftover_note). Written here rather than taken from a library: the rule is a few
errno values, the free space (shutil.disk_usage) and the errno that safetensors' Rust
errors carry in their text ("(os error 28)"), which no library maps for us.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
UNWRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")
_PY_OS_ERROR = re.compile(r"\[Errno (\d+)\]")


def write_atomic(path: Path, text: str, prefix: str = "") -> None:
    """Write a small file under a temporary name beside it (``PREFIX<name>.<pid>.tmp``,
    which the writers' leftover checks know), then rename it over `path`."""
    tmp = path.with_name(f"{prefix}{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def os_error(exc: BaseException | None) -> OSError | None:
    """The OSError behind `exc`: itself, one it was raised from, or the errno a
    library's message carries (safetensors: "... (os error 28)")."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno is not None:
            return exc
        m = _RUST_OS_ERROR.search(str(exc)) or _PY_OS_ERROR.search(str(exc))
        if m:
            n = int(m[1])
            return OSError(n, os.strerror(n))
        exc = exc.__cause__ or exc.__context__
    return None


def is_disk_fault(exc: BaseException) -> bool:
    err = os_error(exc)
    return err is not None and err.errno in DISK_FULL | UNWRITABLE


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free space for an unprivileged writer on the file system of `path` (or of its
    nearest existing parent), or None when it cannot be read."""
    p = Path(path).absolute()
    while not p.exists() and p.parent != p:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def mb(n: int) -> str:
    v = n / 1e6
    return f"{v:.1f} MB" if v < 10 else f"{v:.0f} MB"


def sentence(
    exc: BaseException, path: str | os.PathLike, needs: str | None = None, elsewhere: str = ""
) -> str | None:
    """What went wrong, for a full or unwritable disk (None for any other error):
    "no space left on PATH (needs about N MB, M MB free); free some space there or
    ELSEWHERE" or "cannot write to PATH: read-only file system; ELSEWHERE"."""
    err = os_error(exc)
    if err is None:
        return None
    if err.errno in DISK_FULL:
        details = [needs] if needs else []
        free = free_bytes(path)
        if free is not None:
            details.append(f"{mb(free)} free")
        text = f"no space left on {path}" + (f" ({', '.join(details)})" if details else "")
        return text + "; free some space there" + (f" or {elsewhere}" if elsewhere else "")
    if err.errno in UNWRITABLE:
        why = "read-only file system" if err.errno == errno.EROFS else "permission denied"
        return f"cannot write to {path}: {why}" + (f"; {elsewhere}" if elsewhere else "")
    return None


def size_of(path: Path) -> int:
    """Bytes in a file or a directory tree (what removing it frees)."""
    try:
        if path.is_symlink() or path.is_file():
            return path.lstat().st_size
        return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir())
    except OSError:
        return 0


def remove(paths: Iterable[Path]) -> tuple[list[str], int]:
    """Remove files and directory trees; (the names removed, the bytes freed)."""
    names, freed = [], 0
    for p in paths:
        if not (p.exists() or p.is_symlink()):
            continue
        n = size_of(p)
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except OSError:
            continue  # a read-only cache: nothing to free, and nothing that is trusted
        names.append(p.name)
        freed += n
    return names, freed


def leftover_note(what: str, names: list[str], freed: int, where: str | os.PathLike) -> str:
    """One line: "removed WHAT in WHERE: NAMES (N MB freed)"."""
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"removed {what} in {where}: {shown} ({mb(freed)} freed)"
