"""Two simulated hosts on this machine, for tests/e2e/test_multihost.py and the
replicas benchmark (bench/replicas.py).

Two network namespaces joined by a veth pair on a private link that exists only inside
this machine (10.29.N.1/24 and 10.29.N.2/24, N from the pid): each namespace has its own
loopback and the one veth end, no route anywhere else, so what runs in a namespace can
reach the other "host" and nothing outside the machine. Made with iproute2 (``ip netns``,
``ip link``), which needs root (CAP_NET_ADMIN); :func:`missing_capability` names what
is missing so a test can skip with it. Always torn down: :meth:`TwoHosts.close` deletes
both namespaces (the veth pair goes with them) and is idempotent, and :func:`two_hosts`
closes in a ``finally``.

A process runs on a host with :meth:`Host.popen` (``ip netns exec NS ...``); a thread of
this process moves into a host's namespace with :func:`enter_netns` (setns(2) acts on
the calling thread only), so a test's client threads can talk to the hosts without a
subprocess. Written here rather than taken from a library: it is a dozen iproute2
commands and one libc call; pyroute2 would be a new dependency for the same thing.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import shutil
import subprocess
from dataclasses import dataclass

CLONE_NEWNET = 0x40000000


def missing_capability() -> str | None:
    """Why two hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN); run as root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` command is not installed (apt-get install iproute2)"
    return None


def _ip(*args: str) -> None:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {res.stderr.strip()}")


@dataclass
class Host:
    netns: str
    address: str  # the host's address on the private link

    def popen(self, argv: list[str], **kw) -> subprocess.Popen:
        """`argv` run inside this host's namespace."""
        return subprocess.Popen(["ip", "netns", "exec", self.netns, *argv], **kw)


_made = itertools.count()


class TwoHosts:
    def __init__(self, tag: str | None = None):
        tag = tag or f"{os.getpid()}{next(_made)}"  # unique: one process may make several
        subnet = 1 + int(tag) % 250 if tag.isdigit() else 29
        self.names = (f"vx86a-{tag}", f"vx86b-{tag}")
        self.veth = (f"vx{tag[-8:]}a", f"vx{tag[-8:]}b")  # interface names: 15 chars max
        self.hosts = (
            Host(self.names[0], f"10.29.{subnet}.1"),
            Host(self.names[1], f"10.29.{subnet}.2"),
        )
        try:
            for name in self.names:
                _ip("netns", "add", name)
                _ip("-n", name, "link", "set", "lo", "up")
            _ip("link", "add", self.veth[0], "netns", self.names[0],
                "type", "veth", "peer", "name", self.veth[1], "netns", self.names[1])  # fmt: skip
            for host, dev in zip(self.hosts, self.veth):
                _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", dev)
                _ip("-n", host.netns, "link", "set", dev, "up")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Delete both namespaces (and so the veth pair). Processes still running in one
        keep it alive until they exit: stop them first."""
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


@contextlib.contextmanager
def two_hosts(tag: str | None = None):
    hosts = TwoHosts(tag)
    try:
        yield hosts
    finally:
        hosts.close()


def enter_netns(netns: str) -> None:
    """Move the calling thread into network namespace `netns` (for a ThreadPoolExecutor
    initializer: sockets the thread opens afterwards live in that namespace)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({netns}): {os.strerror(err)}")
    finally:
        os.close(fd)
