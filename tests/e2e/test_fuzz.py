"""Schemathesis against `vllm-x86 serve`'s own OpenAPI description (/openapi.json):
generated requests, valid and not, find no 5xx (Schemathesis' ``not_a_server_error``
check), no request that hangs past 60 s, and the server alive and answering after.

`make test` runs the fuzzing phase for ``--fuzz-seconds`` (75 s), from a fixed seed
(``--fuzz-seed``), on the endpoints a client uses: chat and text completions, the model list, tokenize/detokenize and the
probes. `make fuzz` (``--fuzz-seconds 900 --fuzz-wide --fuzz-seed random``) looks for new
problems: a new seed each run, and Schemathesis' examples and
coverage phases (boundary values, wrong types, missing fields for every parameter) and
every endpoint but these:

- ``/scale_elastic_ep`` and ``/is_scaling_elastic_ep``: they reconfigure the engine's
  expert-parallel ranks, so a generated request may shut the engine down or restart it
  by design;
- ``/v1/systemone`` (vLLM's structured-decision API): for a model without that feature
  vLLM answers every request 501 Not Implemented, by design.

Every request stays cheap (tests/e2e/fuzz_hooks.py: at most 8 tokens, 2 sequences). The
run goes through Schemathesis' CLI, whose time budget (``--max-time``), report (each
failure with a curl command that reproduces it, and the seed) and exit status are what
a developer reruns; ``-w 1``: with two workers Hypothesis failed in CPython 3.11's AST
compiler (a thread-safety error in Hypothesis' lambda descriptions, not the server).
What the runs found and what was fixed is in docs/reliability.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

CORE = r"^/(v1/(chat/completions|completions|models)|tokenize|detokenize|health|version|ping)$"
EXCLUDED = r"^/(scale_elastic_ep|is_scaling_elastic_ep|v1/systemone)$"
REQUEST_TIMEOUT_S = 60


def schemathesis_cmd(base: str, seconds: float, wide: bool, seed: str) -> list[str]:
    cmd = [
        str(Path(sys.executable).with_name("schemathesis")), "run", f"{base}/openapi.json",
        "--checks", "not_a_server_error",
        "--max-time", str(int(seconds)),
        "--request-timeout", str(REQUEST_TIMEOUT_S),
        "--workers", "1",
        "--suppress-health-check", "all",
        "--generation-database", "none",
        "--no-color",
    ]  # fmt: skip
    if seed != "random":
        cmd += ["--seed", seed]
    if wide:
        return [*cmd, "--phases", "examples,coverage,fuzzing", "--exclude-path-regex", EXCLUDED]
    return [*cmd, "--phases", "fuzzing", "--include-path-regex", CORE]


def test_fuzzing_finds_no_server_error(openai_server, request, tmp_path):
    srv = openai_server
    seconds = request.config.getoption("--fuzz-seconds")
    wide = request.config.getoption("--fuzz-wide")
    seed = request.config.getoption("--fuzz-seed")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SCHEMATHESIS_HOOKS": "tests.e2e.fuzz_hooks",
        "NO_COLOR": "1",
    }
    run = subprocess.run(
        schemathesis_cmd(srv.base, seconds, wide, seed),
        cwd=tmp_path,  # its files (.schemathesis/) stay out of the tree
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds + 300,
    )
    report = run.stdout + run.stderr
    assert srv.proc.poll() is None, f"the server died under fuzzing:\n{srv.log()[-4000:]}"
    assert run.returncode == 0, f"schemathesis found problems:\n{report[-12000:]}"
    assert " passed" in report and "generated" in report, report[-4000:]
    # alive and answering
    assert httpx.get(f"{srv.base}/health", timeout=10).status_code == 200
    r = httpx.post(
        f"{srv.base}/v1/completions",
        json={"model": srv.model, "prompt": "Hi", "max_tokens": 2},
        timeout=120,
    )
    assert r.status_code == 200, r.text
