"""Who may use a daemon and what a request may carry: the peer's uid on the Unix
socket, the key, the optional TCP listener's rule, and the environment a served model
may be given.

* The Unix socket (``daemon.sock``, in a 0700 directory, itself 0600) is the owner's
  channel; the daemon also reads each connection's uid (SO_PEERCRED) and answers 403 to
  any uid other than its own and root's.
* A key (``vllm-x86 daemon start --api-key KEY``, or ``VLLM_API_KEY`` in the daemon's
  environment) makes every request, on the socket or TCP, carry
  ``Authorization: Bearer KEY`` (401 otherwise); the client sends ``VLLM_API_KEY``.
* TCP (``daemon start --host H --port P``, for containers) only with a key: the daemon
  loads any model directory with any vLLM flags its caller names, so whoever reaches it
  acts as its owner. tools/exposure.py refuses a network address without a key; a
  loopback one without a key is refused here too, since every local user reaches it.
* ``POST /serve``'s ``env`` takes the names in :data:`SERVE_ENV` only. The rest of
  vLLM's ``VLLM_*`` settings stay out: some load code or files (``VLLM_PLUGINS``,
  ``VLLM_LOGGING_CONFIG_PATH``), open development endpoints (``VLLM_SERVER_DEV_MODE``)
  or send data elsewhere (``VLLM_USAGE_STATS_SERVER``).

Standard library only (the client imports it).
"""

from __future__ import annotations

import os
import socket
import struct

from vllm_x86.runtime import envs
from vllm_x86.tools import exposure
from vllm_x86.tools.daemon.paths import DaemonError

# The plugin's settings that mean nothing to a model server (they are the client's,
# the daemon's or the build's).
NOT_FOR_A_MODEL_SERVER = (
    "VLLM_X86_DAEMON_DIR",
    "VLLM_X86_DAEMON_PORT",
    "VLLM_X86_DAEMON_KEEP_ALIVE",
    "VLLM_X86_SKIP_KERNELS",
    "VLLM_X86_CONFORMANCE_COMMAND",
)
# vLLM's own settings a served model may be given: its key, caches, CPU memory and
# threads, logging, timeouts, usage statistics off.
VLLM_SERVE_ENV = (
    "VLLM_API_KEY",
    "VLLM_CACHE_ROOT",
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_CPU_NUM_OF_RESERVED_CPU",
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
    "VLLM_ENGINE_READY_TIMEOUT_S",
    "VLLM_HTTP_TIMEOUT_KEEP_ALIVE",
    "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH",
    "VLLM_LOGGING_LEVEL",
    "VLLM_LOGGING_PREFIX",
    "VLLM_LOGGING_COLOR",
    "VLLM_LOG_STATS_INTERVAL",
    "VLLM_NO_USAGE_STATS",
    "VLLM_DO_NOT_TRACK",
)
# Every name POST /serve's env takes: the plugin's user-facing settings (envs.SETTINGS,
# internal rows excluded) but the four above, and vLLM's list.
SERVE_ENV: frozenset[str] = frozenset(
    [s.name for s in envs.SETTINGS if not s.internal and s.name not in NOT_FOR_A_MODEL_SERVER]
    + list(VLLM_SERVE_ENV)
)


def split_env(environ: dict[str, str] | os._Environ) -> tuple[dict[str, str], list[str]]:
    """(what a client passes to a model server, the caller's other VLLM_* names, which it
    does not pass; the client's own daemon settings are not listed)."""
    passed, left = {}, []
    for k, v in environ.items():
        if k in SERVE_ENV:
            passed[k] = v
        elif k.startswith("VLLM_") and k not in NOT_FOR_A_MODEL_SERVER:
            left.append(k)
    return passed, sorted(left)


def refused_env(env: dict[str, str]) -> str | None:
    """The daemon's 400 message for names outside SERVE_ENV, or None."""
    bad = sorted(k for k in env if k not in SERVE_ENV)
    if not bad:
        return None
    return (
        f"the daemon does not pass {', '.join(bad)} to a model server: 'env' takes the "
        "plugin's VLLM_X86_* settings and " + ", ".join(VLLM_SERVE_ENV) + " only "
        "(docs/startup.md). Start the server without the daemon (--no-daemon) for others"
    )


# ----------------------------------------------------------------------------- who


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED), or None
    where the system does not say."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    return struct.unpack("3i", raw)[1]


def peer_allowed(uid: int | None) -> bool:
    """The daemon's owner and root (who can read its files anyway)."""
    return uid is None or uid in (os.geteuid(), 0)


def forbidden_message(uid: int | None) -> str:
    return (
        f"this standby daemon answers its owner (uid {os.geteuid()}) only, and you are uid "
        f"{uid}; start a daemon of your own with `vllm-x86 daemon start`"
    )


UNAUTHORIZED = (
    "this standby daemon has a key: send it as 'Authorization: Bearer KEY' (the vllm-x86 "
    "CLI sends VLLM_API_KEY; set it to the key the daemon was started with)"
)


def key_header(key: str | None = None) -> dict[str, str]:
    """The header a client sends: the key given, else VLLM_API_KEY, else none."""
    key = key if key is not None else os.environ.get("VLLM_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


# ----------------------------------------------------------------------------- TCP


WHAT = "the standby daemon's control API"


def check_tcp(host: str, port: int, key: str | None) -> None:
    """Raises DaemonError when the daemon may not listen on TCP at host:port."""
    try:
        v = exposure.check(host, key, surface=exposure.CONTROL, what=WHAT, port=port)
    except exposure.ExposureError as e:
        raise DaemonError(str(e)) from None
    if not v.keyed:
        raise DaemonError(
            f"{WHAT} will not listen on TCP {host} without a key: any local user (and any "
            "container sharing this network namespace) could reach it and serve any model "
            "directory with any flags as you. The Unix socket in VLLM_X86_DAEMON_DIR is the "
            "owner-only channel and needs no TCP; for TCP, set a key with --api-key KEY or "
            "VLLM_API_KEY (docs/startup.md)."
        )
