"""The files of one daemon directory (``VLLM_X86_DAEMON_DIR``), who may use them, and
whether a daemon lives.

daemon.pid     the daemon's pid (written first, removed last)
daemon.json    {"pid", "socket", "tcp", "keyed", "version", "started_at"} once it listens
daemon.sock    the control API's Unix socket (HTTP/JSON)
daemon.log     the daemon's own output
model-N.log    the output of the N-th model server the daemon started (last few kept)

The directory is its owner's only: created (or forced) to mode 0700, refused when
another user owns it, and every file in it is 0600, the socket included. A process of
another user cannot even reach the socket (connecting needs search permission on the
directory); the daemon also checks each connection's uid (server.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vllm_x86.runtime import envs

# What a daemon's command line contains (checked so a reused pid is not taken for one).
DAEMON_MODULE = "vllm_x86.tools.daemon"
KEEP_MODEL_LOGS = 5
DIR_MODE = 0o700
FILE_MODE = 0o600
# sockaddr_un.sun_path holds 108 bytes, the terminating NUL included (unix(7)).
SUN_PATH_MAX = 107


class DaemonError(Exception):
    """A daemon operation failed; the message is meant for the user."""


@dataclass(frozen=True)
class DaemonFiles:
    root: Path

    @property
    def pid(self) -> Path:
        return self.root / "daemon.pid"

    @property
    def state(self) -> Path:
        return self.root / "daemon.json"

    @property
    def socket(self) -> Path:
        return self.root / "daemon.sock"

    @property
    def log(self) -> Path:
        return self.root / "daemon.log"

    def model_log(self, n: int) -> Path:
        return self.root / f"model-{n}.log"

    def prune_model_logs(self) -> None:
        logs = sorted(self.root.glob("model-*.log"), key=lambda p: p.stat().st_mtime)
        for p in logs[:-KEEP_MODEL_LOGS]:
            try:
                p.unlink()
            except OSError:
                pass


def files(root: str | os.PathLike | None = None) -> DaemonFiles:
    return DaemonFiles(Path(root if root is not None else envs.daemon_dir()).expanduser())


# ----------------------------------------------------------------------------- owner only


def private_dir(f: DaemonFiles) -> None:
    """Create the daemon directory with mode 0700, or force an existing one of this
    user's to 0700 and its files to 0600. Raises DaemonError when it is not a directory
    or another user owns it (the daemon then does not start there)."""
    try:
        f.root.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        st = os.stat(f.root)
    except OSError as e:
        raise DaemonError(
            f"cannot create the daemon directory {f.root}: {e.strerror}; set "
            "VLLM_X86_DAEMON_DIR to a directory of yours"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise DaemonError(f"{f.root} is not a directory; set VLLM_X86_DAEMON_DIR to one")
    if st.st_uid != os.geteuid():
        raise DaemonError(
            f"the daemon directory {f.root} belongs to uid {st.st_uid}, not to you (uid "
            f"{os.geteuid()}): a daemon there would be reachable by that user; set "
            "VLLM_X86_DAEMON_DIR to a directory of your own"
        )
    if stat.S_IMODE(st.st_mode) != DIR_MODE:
        os.chmod(f.root, DIR_MODE)
    for p in f.root.iterdir():  # files an older version left readable (0644 logs)
        try:
            pst = p.lstat()
            if stat.S_ISREG(pst.st_mode) and pst.st_uid == os.geteuid():
                if stat.S_IMODE(pst.st_mode) != FILE_MODE:
                    os.chmod(p, FILE_MODE)
        except OSError:
            pass


def open_private(path: Path, flags: int) -> int:
    """os.open with mode 0600, also when the file already existed with another mode."""
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def write_private(path: Path, text: str) -> None:
    fd = open_private(path, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    write_private(tmp, json.dumps(data))
    os.replace(tmp, path)


@contextlib.contextmanager
def socket_address(path: Path) -> Iterator[str]:
    """A name for the Unix socket at `path` that fits sun_path: the path itself, or,
    when it is longer (a deep VLLM_X86_DAEMON_DIR, pytest's temporary directories), the
    same file reached through an open descriptor of its directory
    (/proc/self/fd/N/daemon.sock, which bind and connect resolve like any path)."""
    name = str(path)
    if len(os.fsencode(name)) <= SUN_PATH_MAX:
        yield name
        return
    try:
        fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise OSError(e.errno, f"{e.strerror}: {path.parent}") from None
    try:
        short = f"/proc/self/fd/{fd}/{path.name}"
        if not os.path.isdir(f"/proc/self/fd/{fd}"):
            raise DaemonError(
                f"the daemon's socket path {name} is longer than the {SUN_PATH_MAX} bytes "
                "a Unix socket name may have and /proc is not mounted to shorten it; set "
                "VLLM_X86_DAEMON_DIR to a shorter path"
            )
        yield short
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- liveness


def read_pid(f: DaemonFiles) -> int | None:
    try:
        return int(f.pid.read_text().strip())
    except (OSError, ValueError):
        return None


def read_state(f: DaemonFiles) -> dict | None:
    try:
        data = json.loads(f.state.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_daemon_process(pid: int) -> bool:
    """True when `pid` is alive and is a vllm-x86 daemon (not a process that reused a
    dead daemon's pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().split(b"\0")
    except OSError:
        return False
    fields = _stat_fields(pid)
    if fields is None or fields[0] == "Z":
        return False
    return any(DAEMON_MODULE.encode() in arg for arg in cmd)


def _stat_fields(pid: int | str) -> list[str] | None:
    """/proc/PID/stat's fields after the command (state, ppid, pgrp, ...), or None
    where the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def remove_files(f: DaemonFiles) -> None:
    for p in (f.socket, f.state, f.pid):
        try:
            p.unlink()
        except FileNotFoundError:
            pass
        except OSError:  # not ours to remove (another user's directory)
            pass


def group_members(pgid: int) -> list[int]:
    """Pids whose process group is `pgid` and that still run: finished zombies are left
    out, but not a zombie thread-group leader whose other threads are still exiting (its
    main thread ended first): those threads still hold the process's open files, a
    listening socket among them, until the last one is gone."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields is None or int(fields[2]) != pgid:
            continue
        if fields[0] == "Z" and not _threads_left(entry):
            continue
        out.append(int(entry))
    return out


def _threads_left(pid: str) -> bool:
    """Whether a zombie's thread group still has threads besides its ended leader."""
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False
