"""Who can reach a server the project starts: the one rule for addresses and keys.

Every listening surface asks here before it binds:

* ``api``: vLLM's OpenAI server (``vllm-x86 serve``, a model server of the daemon). It
  answers prompts and nothing else, so on a non-loopback address without an API key it
  starts, with a warning naming the risk (as vLLM's own ``vllm serve`` would start).
* ``control``: the standby daemon's TCP control API and the playground. They choose
  which model directory to load, with which vLLM flags, so they can make the server read
  any file the owner can and, with ``--trust-remote-code``, run code in a directory they
  are pointed at: on a non-loopback address they refuse to start without a key.

The key is vLLM's: ``--api-key KEY`` or ``VLLM_API_KEY``; vLLM's server then answers 401
to a ``/v1`` request without ``Authorization: Bearer KEY``, and the daemon and the
playground check the same header on every request (:func:`authorized`). docs/security.md
says what listens where.

Written here rather than taken from a library: the rule is the project's policy (which
surface may start where), and the parts (an address check from ``ipaddress``, a
constant-time compare from ``hmac``) are the standard library's.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# The surfaces and what each does on a non-loopback address without a key.
API = "api"
CONTROL = "control"


class ExposureError(Exception):
    """A surface may not listen where it was asked to; the message says what would work."""


def is_loopback(host: str) -> bool:
    """Whether `host` (a ``--host`` value) accepts connections from this machine only.
    "" and 0.0.0.0 / :: mean every interface; a name other than localhost may resolve
    anywhere, so it counts as the network."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def describe(host: str) -> str:
    """The address in words, for messages."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        return f"{host or '0.0.0.0'} (every network interface)"
    return host


def api_key(args: Sequence[str] = (), environ: Mapping[str, str] | None = None) -> str | None:
    """The key a vLLM server started with these flags would require: ``--api-key``
    (the last one given wins, as in argparse), else ``VLLM_API_KEY``; None for none."""
    key = None
    for i, a in enumerate(args):
        if a == "--api-key" and i + 1 < len(args):
            key = args[i + 1]
        elif a.startswith("--api-key="):
            key = a.split("=", 1)[1]
    if key is None:
        key = (os.environ if environ is None else environ).get("VLLM_API_KEY")
    return key or None


@dataclass(frozen=True)
class Verdict:
    loopback: bool
    keyed: bool
    warning: str | None  # to print before starting, or None


def check(
    host: str, key: str | None, *, surface: str, what: str, port: int | None = None
) -> Verdict:
    """The rule. Raises ExposureError where `surface` may not start; otherwise the
    verdict, with the warning to print (None on loopback or with a key)."""
    if surface not in (API, CONTROL):
        raise ValueError(f"unknown surface {surface!r}")
    loopback = is_loopback(host)
    keyed = bool(key)
    if loopback or keyed:
        return Verdict(loopback, keyed, None)
    where = describe(host) + (f", port {port}" if port is not None else "")
    if surface == CONTROL:
        raise ExposureError(
            f"{what} will not listen on {where} without a key: it chooses which model "
            "directory the server loads, with which flags, so whoever reaches it can make "
            "the server read files on this machine and, with --trust-remote-code, run code. "
            "Keep it on 127.0.0.1, or set a key with --api-key KEY or VLLM_API_KEY "
            "(docs/security.md)."
        )
    return Verdict(
        loopback,
        keyed,
        f"{what} listens on {where} with no API key: anyone who can reach this port can "
        "use the model, read what it is served as and take all its capacity. Pass "
        "--api-key KEY (or set VLLM_API_KEY) so requests need it, or use --host 127.0.0.1 "
        "(docs/security.md).",
    )


def authorized(header: str | None, key: str | None) -> bool:
    """Whether an ``Authorization`` header value carries `key` (``Bearer KEY``, as vLLM's
    server checks it); always True when there is no key. Compared in constant time."""
    if not key:
        return True
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer ") :].encode(), key.encode())
