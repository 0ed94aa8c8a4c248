"""Where the playground's model runs, and how it is loaded, switched and unloaded.

* :class:`DaemonBackend` (`vllm-x86 playground`): the standby daemon of this user
  (VLLM_X86_DAEMON_DIR), reached only through its owner-only Unix socket with the
  daemon client; the playground starts one when none runs (and stops it on exit). A load
  asks the daemon to serve the model on a loopback port chosen at start; the daemon's
  states (starting, ready, failed with the error from the model server's log) are the
  page's.
* :class:`AttachedBackend` (`vllm-x86 serve --playground`): the page lives inside the
  OpenAI server it talks to, which serves one model; load and unload answer 409.

The daemon client is blocking (http.client on a Unix socket): the app calls these
methods in a worker thread.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from vllm_x86.tools.cli.common import _flag_value
from vllm_x86.tools.playground.models import (
    PRECISION_OF,
    LoadPlan,
    PlaygroundError,
    group_rss,
)


@dataclass
class Upstream:
    """A model server that answers: its base URL (no /v1), the model name it serves, and
    the key it needs (or None)."""

    base: str
    model: str
    key: str | None
    max_model_len: int | None = None


def _precision_of(srv: dict) -> str:
    args = srv.get("args") or []
    q = _flag_value(args, "--quantization")
    if q in PRECISION_OF:
        return PRECISION_OF[q]
    try:
        import json

        cfg = json.loads((Path(srv["model"]) / "config.json").read_text())
        method = (cfg.get("quantization_config") or {}).get("quant_method")
        if method in PRECISION_OF:
            return PRECISION_OF[method]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return "bf16"


def _max_len(srv: dict) -> int | None:
    v = _flag_value(srv.get("args") or [], "--max-model-len")
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


class DaemonBackend:
    mode = "daemon"

    def __init__(self, daemon_dir: str | None = None, key: str | None = None,
                 start_daemon: bool = True, eager: bool = True):  # fmt: skip
        from vllm_x86.tools.daemon.paths import files
        from vllm_x86.tools.ports import free_port

        self.files = files(daemon_dir)
        self.key = key
        self.start_daemon = start_daemon
        self.eager = eager
        self.port = free_port()  # the model server's loopback port, the same for every load
        self.lock = threading.Lock()
        self.daemon_state = "starting"  # starting | ready | failed
        self.daemon_error: str | None = None
        self.started_daemon = False
        # a load the daemon has not accepted yet, or that it refused
        self.pending: dict | None = None
        self.dismissed: int | None = None  # an unloaded model server's seq: shown as idle
        self._ready = threading.Event()

    # ------------------------------------------------------------------ the daemon

    def connect(self) -> None:
        """Find the running daemon or start one (blocking: minutes on a small machine)."""
        from vllm_x86.tools.daemon.client import DaemonError, running, start

        try:
            st = running(self.files)
            if st is None:
                if not self.start_daemon:
                    raise DaemonError(
                        "no standby daemon runs in "
                        f"{self.files.root}; start one with `vllm-x86 daemon start`"
                    )
                self.started_daemon = True  # from here on, ours to stop on exit
                start(f=self.files)
            self.daemon_state = "ready"
        except (DaemonError, OSError) as e:
            self.daemon_state = "failed"
            self.daemon_error = f"the standby daemon is not available: {e}"
        finally:
            self._ready.set()

    def close(self) -> None:
        """Stop the daemon if the playground started it (its model server with it)."""
        if self.started_daemon:
            from vllm_x86.tools.daemon.client import stop

            try:
                stop(self.files)
            except OSError:
                pass

    def _wait_daemon(self, timeout: float = 600.0) -> None:
        self._ready.wait(timeout)
        if self.daemon_state != "ready":
            raise PlaygroundError(503, self.daemon_error or "the standby daemon is still starting")

    def _daemon_status(self) -> dict | None:
        from vllm_x86.tools.daemon.client import request

        if self.daemon_state != "ready":
            return None
        try:
            code, st = request(self.files, "GET", "/status", timeout=10.0)
        except OSError as e:
            self.daemon_error = f"the standby daemon stopped answering: {e}"
            return None
        return st if code == 200 else None

    # ------------------------------------------------------------------ status

    def status(self) -> dict:
        p = self.pending
        # while the daemon handles the load (stopping the previous model takes up to
        # STOP_GRACE_S), it answers nothing else: the load's own record says where it is
        busy = p is not None and p["state"] == "starting" and self.daemon_state == "ready"
        st = None if busy else self._daemon_status()
        srv = (st or {}).get("server")
        daemon = None
        if st is not None:
            daemon = {k: st.get(k) for k in ("pid", "socket", "dir", "warm_s", "platform")}
            daemon["started_by_playground"] = self.started_daemon
        out = {
            "state": "idle",
            "model": None,
            "served_name": None,
            "precision": None,
            "max_model_len": None,
            "error": None,
            "elapsed_s": None,
            "ready_s": None,
            "mode": self.mode,
            "daemon": daemon,
            "serving": None,
            "base_url": None,
        }
        if srv is not None and srv.get("state") in ("starting", "ready"):
            out["serving"] = srv.get("served_name") or srv.get("model")
        if self.daemon_state == "starting":
            out["state"] = "starting"
            out["error"] = None
            out["message"] = "starting the standby daemon (importing torch, vLLM and the plugin)"
            return out
        if not busy and (self.daemon_state == "failed" or st is None):
            out["state"] = "failed"
            out["error"] = self.daemon_error or "the standby daemon does not answer"
            return out
        if p is not None:
            out.update(
                state=p["state"], model=p["id"], precision=p["precision"],
                max_model_len=p["max_model_len"], error=p.get("error"),
                elapsed_s=round(time.monotonic() - p["t0"], 1),
            )  # fmt: skip
            if p["state"] == "starting":
                out["message"] = "handing the model to the standby daemon"
            return out
        if srv is None or srv.get("seq") == self.dismissed:
            return out
        from vllm_x86.tools.daemon.client import server_failed

        name = srv.get("served_name") or srv.get("model")
        state = {"starting": "starting", "ready": "ready", "failed": "failed",
                 "exited": "failed", "stopped": "idle"}.get(srv.get("state"), "idle")  # fmt: skip
        if state == "idle":
            return out
        host = srv.get("host") or "127.0.0.1"
        out.update(
            state=state, model=name, served_name=name, precision=_precision_of(srv),
            base_url=f"http://{host if ':' not in host else f'[{host}]'}:{srv.get('port')}",
            max_model_len=_max_len(srv), ready_s=srv.get("ready_s"),
            elapsed_s=round(time.time() - srv["started_at"], 1) if srv.get("started_at") else None,
        )  # fmt: skip
        if state == "failed":
            out["error"] = server_failed(srv, name)
        return out

    def upstream(self) -> Upstream | None:
        st = self._daemon_status()
        srv = (st or {}).get("server")
        if not srv or srv.get("state") != "ready":
            return None
        host = srv["host"] if srv["host"] not in ("", "0.0.0.0", "::") else "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return Upstream(
            f"http://{host}:{srv['port']}",
            srv.get("served_name") or srv["model"],
            self.key,
            _max_len(srv),
        )

    # ------------------------------------------------------------------ load

    def current_rss(self) -> int:
        st = self._daemon_status()
        srv = (st or {}).get("server")
        if not srv or srv.get("state") not in ("starting", "ready"):
            return 0
        return group_rss(srv.get("pid"))

    def load(self, plan: LoadPlan) -> dict:
        """Hand `plan` to the daemon in the background; the answer for the page."""
        if self.daemon_state == "failed":
            raise PlaygroundError(503, self.daemon_error or "the standby daemon is not available")
        with self.lock:
            if self.pending is not None and self.pending["state"] == "starting":
                raise PlaygroundError(
                    409, f"{self.pending['id']} is being loaded; wait until it is ready or failed"
                )
            self.dismissed = None
            self.pending = {
                "id": plan.id, "precision": plan.precision,
                "max_model_len": plan.max_model_len, "state": "starting", "error": None,
                "t0": time.monotonic(),
            }  # fmt: skip
        threading.Thread(target=self._hand_over, args=(plan,), daemon=True).start()
        return {"state": "starting", "model": plan.id, "precision": plan.precision}

    def _serve_args(self, plan: LoadPlan) -> list[str]:
        args = ["--host", "127.0.0.1", "--port", str(self.port), *plan.flags()]
        if self.eager:
            args.append("--enforce-eager")
        return args

    def _hand_over(self, plan: LoadPlan) -> None:
        from vllm_x86.tools.daemon import access
        from vllm_x86.tools.daemon.client import STOP_MODEL_TIMEOUT_S, request

        p = self.pending
        try:
            self._wait_daemon()
            env, _ = access.split_env(os.environ)
            if self.key:  # the model server on loopback needs the playground's key too
                env["VLLM_API_KEY"] = self.key
            code, out = request(
                self.files, "POST", "/serve",
                {"model": plan.model, "args": self._serve_args(plan), "env": env},
                timeout=STOP_MODEL_TIMEOUT_S,
            )  # fmt: skip
        except PlaygroundError as e:
            code, out = 503, {"error": e.message}
        except OSError as e:
            code, out = 503, {"error": f"the standby daemon stopped answering: {e}"}
        with self.lock:
            if self.pending is not p:
                return
            if code >= 400:
                msg = out.get("error") or f"the standby daemon answered {code}"
                still = self._daemon_status()
                srv = (still or {}).get("server") or {}
                if srv.get("state") in ("starting", "ready"):
                    msg += f" The previous model ({srv.get('served_name') or srv.get('model')}) is still serving."
                p.update(state="failed", error=f"{plan.id} was not loaded: {msg}")
            else:
                self.pending = None  # the daemon's record says the rest

    def unload(self) -> dict:
        from vllm_x86.tools.daemon.client import STOP_MODEL_TIMEOUT_S, request

        self._wait_daemon()
        with self.lock:
            if self.pending is not None and self.pending["state"] == "starting":
                raise PlaygroundError(
                    409, f"{self.pending['id']} is being loaded; unload it once it is ready"
                )
            self.pending = None
        try:
            st = self._daemon_status()
            srv = (st or {}).get("server")
            code, out = request(self.files, "POST", "/stop-model", {}, timeout=STOP_MODEL_TIMEOUT_S)
        except OSError as e:
            raise PlaygroundError(503, f"the standby daemon stopped answering: {e}") from None
        if code != 200:
            raise PlaygroundError(502, out.get("error") or f"the standby daemon answered {code}")
        if srv is not None:
            self.dismissed = srv.get("seq")
        return {"state": "idle"}


class AttachedBackend:
    """The OpenAI server the playground is mounted in (or any one server at `base`)."""

    mode = "attached"

    def __init__(self, base: str, key: str | None = None):
        self.base = base.rstrip("/")
        self.key = key
        self._model: tuple[str, str, int | None] | None = None
        self.t0 = time.time()

    def _get(self, path: str, timeout: float = 5.0):
        import httpx

        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        return httpx.get(self.base + path, headers=headers, timeout=timeout)

    def _served(self) -> tuple[str, str, int | None] | None:
        if self._model is None:
            try:
                data = self._get("/v1/models").json()["data"][0]
            except Exception:
                return None
            self._model = (data["id"], data.get("root") or data["id"], data.get("max_model_len"))
        return self._model

    def status(self) -> dict:
        try:
            ok = self._get("/health").status_code == 200
        except Exception:
            ok = False
        served = self._served() if ok else None
        return {
            "state": "ready" if served else "starting",
            "model": served[0] if served else None,
            "served_name": served[0] if served else None,
            "precision": None,
            "max_model_len": served[2] if served else None,
            "error": None,
            "elapsed_s": None,
            "ready_s": None,
            "mode": self.mode,
            "daemon": None,
            "serving": served[0] if served else None,
            "base_url": self.base,
        }

    def upstream(self) -> Upstream | None:
        served = self._served()
        if served is None:
            return None
        return Upstream(self.base, served[0], self.key, served[2])

    def current_rss(self) -> int:
        return 0

    def _one_model(self) -> PlaygroundError:
        served = self._served()
        what = f" of {served[0]}" if served else ""
        return PlaygroundError(
            409, f"this playground is part of the running `vllm-x86 serve`{what}, which serves "
            "one model: to load, switch or unload models, run `vllm-x86 playground`.",
        )  # fmt: skip

    def load(self, plan: LoadPlan) -> dict:
        raise self._one_model()

    def unload(self) -> dict:
        raise self._one_model()

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------- pulls


class PullJobs:
    """`vllm-x86 pull NAME` in a child process per catalog model, with its last line of
    progress and the bytes written so far in the model's partial folder."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict] = {}
        self.lock = threading.Lock()

    def start(self, name: str) -> dict:
        from vllm_x86.tools.models.catalog import lookup
        from vllm_x86.tools.models.pull import unknown_model_message

        m = lookup(name) if isinstance(name, str) else None
        if m is None:
            raise PlaygroundError(400, unknown_model_message(str(name)))
        with self.lock:
            job = self.jobs.get(m.name)
            if job is not None and job["state"] == "running":
                return job
            job = {"name": m.name, "state": "running", "message": "starting the download",
                   "bytes": None, "total": None, "error": None, "proc": None}  # fmt: skip
            self.jobs[m.name] = job
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_x86.tools.cli", "pull", m.name],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )  # fmt: skip
        job["proc"] = proc
        threading.Thread(target=self._follow, args=(job, proc), daemon=True).start()
        return job

    def _follow(self, job: dict, proc: subprocess.Popen) -> None:
        last = ""
        for line in proc.stderr:  # type: ignore[union-attr]
            line = line.strip()
            if line:
                last = line
                job["message"] = line.removeprefix("[vllm-x86 pull] ")
        code = proc.wait()
        job["state"] = "done" if code == 0 else "failed"
        if code != 0:
            job["error"] = last.removeprefix("vllm-x86: error: ") or f"the pull exited with {code}"

    def get(self, name: str) -> dict:
        from vllm_x86.tools.models.catalog import lookup
        from vllm_x86.tools.models.pull import cached_path, models_dir

        m = lookup(name)
        if m is None:
            from vllm_x86.tools.models.pull import unknown_model_message

            raise PlaygroundError(404, unknown_model_message(name))
        job = self.jobs.get(m.name)
        if job is None:
            done = cached_path(m.name) is not None
            return {"name": m.name, "state": "done" if done else "idle",
                    "message": "in the cache" if done else "not downloaded",
                    "bytes": None, "total": None, "error": None}  # fmt: skip
        if job["state"] == "running":
            total = 0
            for d in models_dir().glob(f".{m.name}.partial-*"):
                from vllm_x86.tools.playground.models import size_on_disk

                total += size_on_disk(d)
            job["bytes"] = total or None
        return {k: v for k, v in job.items() if k != "proc"}

    def close(self) -> None:
        import signal

        for job in self.jobs.values():
            proc = job.get("proc")
            if proc is not None and proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
