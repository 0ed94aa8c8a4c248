"""The files of one daemon directory (``VLLM_X86_DAEMON_DIR``) and whether a daemon lives.

daemon.pid     the daemon's pid (written first, removed last)
daemon.json    {"pid", "port", "version", "started_at"} once the control port listens
daemon.log     the daemon's own output
model-N.log    the output of the N-th model server the daemon started (last few kept)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from vllm_x86.runtime import envs

# What a daemon's command line contains (checked so a reused pid is not taken for one).
DAEMON_MODULE = "vllm_x86.tools.daemon"
KEEP_MODEL_LOGS = 5


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


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def is_daemon_process(pid: int) -> bool:
    """True when `pid` is alive and is a vllm-x86 daemon (not a process that reused a
    dead daemon's pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().split(b"\0")
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    if state == "Z":
        return False
    return any(DAEMON_MODULE.encode() in arg for arg in cmd)


def remove_files(f: DaemonFiles) -> None:
    for p in (f.state, f.pid):
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def group_members(pgid: int) -> list[int]:
    """Pids (zombies excluded) whose process group is `pgid`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # after the command: state, ppid, pgrp, ...
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry))
    return out
