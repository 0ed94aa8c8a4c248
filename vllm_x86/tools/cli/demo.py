"""`vllm-x86 demo` (what `make demo` runs): the main job, end to end.

Pull the default model, start `vllm-x86 serve` on a free loopback port, wait until it
is ready (showing progress), ask one question through the OpenAI API, print the
answer and the decode speed, and stop the server, whatever happens.

The server runs eagerly (`--enforce-eager`) unless `--compiled` is given: an eager
start takes seconds where a first compiled start compiles the model for over a minute
on a small CPU (docs/startup.md), and the plugin's eager bf16 gives transformers'
greedy answer to the default question on every CPU measured, while compiled bf16 takes
the other side of a near tie on the AMD EPYC (tests/models/test_default_model_parity.py).
With `--compiled` the server compiles before it answers (VLLM_X86_STAGED_WARMUP=0 unless
you set it), so the answer is the compiled model's.

With a standby daemon running, `vllm-x86 serve` hands the model to it and stays attached
(tools/daemon/cli.py): stopping that command at the end stops the model server it
started, and the daemon stays warm. A server that ends before it is ready is an error
message with the end of its log, not a traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from vllm_x86.tools.cli.common import CliError
from vllm_x86.tools.models.catalog import DEFAULT_MODEL
from vllm_x86.tools.models.pull import pull
from vllm_x86.tools.ports import free_port


def wait_ready(base: str, proc: subprocess.Popen, log_path: str, timeout: float = 600.0) -> float:
    """Poll /health until 200; raise with the end of the server log if it dies."""
    t0 = time.monotonic()
    last = 0.0
    while True:
        if proc.poll() is not None:
            with open(log_path, errors="replace") as f:
                tail = f.read()[-3000:]
            raise CliError(
                f"the server exited with code {proc.returncode} before it was ready "
                f"(log: {log_path}):\n{tail}"
            )
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        now = time.monotonic() - t0
        if now > timeout:
            raise CliError(f"the server was not ready after {timeout:.0f} s (log: {log_path})")
        if now - last >= 5:
            print(f"[demo] waiting for the server ... {now:.0f} s", file=sys.stderr, flush=True)
            last = now
        time.sleep(0.5)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=60)  # a daemon's model server gets up to 30 s to stop
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _say_if_daemon() -> None:
    from vllm_x86.tools.daemon.client import DaemonError, running

    try:
        st = running()
    except DaemonError:
        return
    if st is not None and st.get("server"):
        print(
            f"[demo] the standby daemon (pid {st['pid']}) serves it; stopping the demo "
            "stops that model server, the daemon stays warm",
            file=sys.stderr,
            flush=True,
        )


def run_demo(question: str, port: int = 0, max_tokens: int = 64, compiled: bool = False) -> int:
    import openai

    from vllm_x86.tools.cli.common import chat_once

    print(f"[demo] 1/4 pull {DEFAULT_MODEL}", file=sys.stderr, flush=True)
    pull(DEFAULT_MODEL)
    port = port or free_port()
    base = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="vllm-x86-demo-", suffix=".log", delete=False)
    mode = "compiled (the first start compiles the model)" if compiled else "eager"
    print(
        f"[demo] 2/4 start the server on {base}, {mode} (log: {log.name})",
        file=sys.stderr,
        flush=True,
    )
    t_start = time.monotonic()
    cmd = [sys.executable, "-m", "vllm_x86.tools.cli", "serve", "--port", str(port)]
    env = dict(os.environ)
    if compiled:  # answer from the compiled model: compile first, not staged (staged.py)
        env.setdefault("VLLM_X86_STAGED_WARMUP", "0")
    else:
        cmd.append("--enforce-eager")
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        ready = wait_ready(base, proc, log.name)
        print(f"[demo] server ready after {ready:.1f} s", file=sys.stderr, flush=True)
        _say_if_daemon()
        key = os.environ.get("VLLM_API_KEY") or "EMPTY"  # the server requires it when set
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=key)
        model = client.models.list().data[0].id
        print(f"[demo] 3/4 ask {model}: {question}", file=sys.stderr, flush=True)
        print(f"Q: {question}\nA: ", end="", flush=True)
        _, n, secs = chat_once(
            client, model, [{"role": "user", "content": question}], max_tokens, 0.0
        )
        first_answer = time.monotonic() - t_start
        speed = n / secs if secs > 0 and n else float("nan")
        print(
            f"[{n} tokens in {secs:.2f} s: {speed:.1f} tokens/s; "
            f"{first_answer:.1f} s from launch to answer]",
            flush=True,
        )
    finally:
        print("[demo] 4/4 stop the server", file=sys.stderr, flush=True)
        stop(proc)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_demo("What is the capital of France?"))
