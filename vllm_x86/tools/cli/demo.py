"""`vllm-x86 demo` (what `make demo` runs): the main job, end to end.

Pull the default model, start `vllm-x86 serve` on a free loopback port, wait until it
is ready (showing progress), ask one question through the OpenAI API, print the
answer and the decode speed, and stop the server, whatever happens.

The server runs as `vllm-x86 serve` runs it: compiled. The demo first compiles the
default model for this CPU if no earlier pull or demo did (tools/models/compile_ahead.py:
a minute or two on a small CPU, once), so the server answers compiled from the first
request and the answer is the one a user of `vllm-x86 serve` gets. `--eager` serves
eagerly instead (`--enforce-eager`: starts in seconds, nothing compiled); where no C++
compiler exists the demo says so and serves eagerly.

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


def run_demo(question: str, port: int = 0, max_tokens: int = 64, eager: bool = False) -> int:
    import openai

    from vllm_x86.tools.cli.common import chat_once
    from vllm_x86.tools.models.compile_ahead import CompileAheadError, can_compile, compile_ahead

    print(f"[demo] 1/4 pull {DEFAULT_MODEL}", file=sys.stderr, flush=True)
    model_dir = pull(DEFAULT_MODEL)
    compiled = not eager
    if compiled and (why_not := can_compile()) is not None:
        print(f"[demo] serving eagerly: {why_not}", file=sys.stderr, flush=True)
        compiled = False
    if compiled:
        try:
            compile_ahead(DEFAULT_MODEL, model_dir)
        except CompileAheadError as e:  # the serve below then compiles before answering
            print(f"[demo] {e}", file=sys.stderr, flush=True)
    port = port or free_port()
    base = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="vllm-x86-demo-", suffix=".log", delete=False)
    mode = "compiled, as `vllm-x86 serve` runs it" if compiled else "eager"
    print(
        f"[demo] 2/4 start the server on {base}, {mode} (log: {log.name})",
        file=sys.stderr,
        flush=True,
    )
    t_start = time.monotonic()
    cmd = [sys.executable, "-m", "vllm_x86.tools.cli", "serve", "--port", str(port)]
    env = dict(os.environ)
    if compiled:  # answer from the compiled model: never from a staged eager start
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
