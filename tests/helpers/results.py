"""The tests' engines that run in a fresh Python process print their result as one line,
``RESULT <json>``; `run` starts such a process and reads that line, and a process that
printed none fails the test with the tail of its output."""

from __future__ import annotations

import json
import subprocess

PREFIX = "RESULT "


def read(proc: subprocess.CompletedProcess, *, with_log: bool = False) -> dict:
    """The JSON of the last RESULT line of a finished process; with `with_log`, also its
    whole output under "log". AssertionError (with the output's tail) when there is none
    or the process failed."""
    out, err = proc.stdout or "", proc.stderr or ""
    lines = [x for x in out.splitlines() if x.startswith(PREFIX)]
    assert proc.returncode == 0 and lines, (
        f"the engine's process failed (exit {proc.returncode}):\n{out[-3000:]}\n{err[-4000:]}"
    )
    result = json.loads(lines[-1][len(PREFIX) :])
    if with_log:
        result = {**result, "log": out + err}
    return result


def run(
    cmd: list[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float,
    with_log: bool = False,
    merge_output: bool = False,
) -> dict:
    """Run `cmd` and read its RESULT line (see read). `merge_output` puts stderr into
    stdout, for logs whose order matters."""
    proc = subprocess.run(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_output else subprocess.PIPE,
        text=True,
        timeout=timeout,
    )
    return read(proc, with_log=with_log)
