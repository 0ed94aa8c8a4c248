"""Loopback ports for the servers the project starts (demo, benchmarks, tests).

A port chosen by binding to port 0 comes from the kernel's ephemeral range, and once the
probe socket closes the kernel may hand that same number to any outgoing connection on
the machine before our server binds it (the server then dies with "Address already in
use"). `free_port()` therefore picks at random below the ephemeral range, where the
kernel never allocates on its own, and checks that the port is free right now.
`port_free()` is the same check, as a server about to bind would make it.
"""

from __future__ import annotations

import errno
import random
import socket

# Where to pick when the ephemeral range cannot be read, and the lowest port to pick.
DEFAULT_EPHEMERAL = (32768, 60999)
LOWEST = 20000
ATTEMPTS = 200


def ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            lo, hi = (int(x) for x in fh.read().split())
        return lo, hi
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server given `--host host --port port` could bind now (with
    SO_REUSEADDR, as uvicorn does: connections of a closed server in TIME_WAIT do not
    count)."""
    host = bind_host(host)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            # Only "in use" counts: an unresolvable host or a privileged port is the
            # server's own error to report.
            return e.errno != errno.EADDRINUSE
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, outside the kernel's ephemeral range where possible."""
    lo, hi = ephemeral_range()
    # The larger stretch outside [lo, hi] within [LOWEST, 65535].
    below, above = (LOWEST, lo - 1), (hi + 1, 65535)
    a, b = max((below, above), key=lambda r: r[1] - r[0])
    rng = random.SystemRandom()
    if b - a >= 100:
        for _ in range(ATTEMPTS):
            port = rng.randint(a, b)
            if port_free(port, host):
                return port
    with socket.socket() as s:  # no room outside the range: let the kernel choose
        s.bind((host, 0))
        return s.getsockname()[1]


def bind_host(host: str) -> str:
    """The address a server given `--host host` binds ("" and 0.0.0.0: all IPv4)."""
    return "0.0.0.0" if host in ("", "0.0.0.0") else host


def port_taken(host: str, port: int) -> str:
    """What to tell a user whose server's port is taken."""
    return (
        f"port {port} on {bind_host(host)} is in use by another program; "
        "choose another --port or stop that program"
    )
