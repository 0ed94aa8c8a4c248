"""The harness's profiling mode for real (docs/overhead.md): `python -m
vllm_x86.tools.bench.overhead` on the tiny 2-layer random model, eager, a few tokens.

Checks that the report has every part of a decode step, each non-negative, and that the
accounting closes: the parts, measured in the engine-core and worker processes, add up
to within a tolerance of the inter-token latency the client saw over HTTP (the engine's
period between steps and the client's time between chunks are two independent clocks
reads in different processes). No speed is asserted.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import PYTHON, clean_env
from vllm_x86.tools.bench.overhead import STEP_PARTS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def profiled(default_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("overhead")
    p = subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.bench.overhead", "--model", "random:tiny-llama-2l",
         "--mode", "eager", "--tokens", "32", "--warmup-tokens", "8", "--ops-steps", "6",
         "--repeats", "2", "--out", str(out), "--timeout", "600"],
        env=clean_env(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads((out / "tiny-llama-2l-eager.json").read_text()), p.stdout


def test_tiny_model_breakdown_closes(profiled):
    r, stdout = profiled
    assert r["tokens"] == 32 and r["engine_steps"] >= 20 and r["worker_steps"] >= 20
    for key, label in STEP_PARTS:
        assert r[key] is not None, key
        assert label in stdout  # the table's header
        if key != "unaccounted":
            assert r[key] >= 0, (key, r[key])
    # the forward's four parts are the forward, the worker's parts its time
    forward = r["gemm"] + r["attention"] + r["other_ops"] + r["dispatch"]
    assert forward == pytest.approx(r["forward"], rel=1e-6)
    assert sum(r[k] for k, _ in STEP_PARTS) == pytest.approx(r["itl_ms"], rel=1e-6)
    # the real check: what the server's processes measured explains what the client saw
    assert abs(r["unaccounted"]) <= 0.25 * r["itl_ms"] + 0.5, r
    assert r["engine_period"] == pytest.approx(r["itl_ms"], rel=0.25, abs=0.5)
    # the reported request: the one the rest of the machine disturbed least among
    # those whose accounting closes (a request whose tokens reached the client in a
    # burst can have the lower engine period and still not close)
    assert len(r["requests"]) == 2
    closing = [q for q in r["requests"] if abs(q["unaccounted"]) <= 0.25 * q["itl_ms"] + 0.5]
    assert closing, r["requests"]
    assert r["engine_period"] == min(q["engine_period"] for q in closing)
    # the op profile saw the model's GEMMs and attention, and the front end was timed
    cats = {op["category"] for op in r["ops"]["top_ops"]}
    assert {"gemm", "attention", "other"} <= cats, r["ops"]["top_ops"]
    assert r["ops"]["forwards"] == 6
    assert r["process_outputs"] > 0 and r["engine_to_api"] > 0
    # the worker is a process of its own unless it runs inside the engine core
    assert set(r["cpu_ms_per_token"]) == set(r["roles"]) >= {"api", "engine"}
    assert all(v > 0 for v in r["cpu_ms_per_token"].values())
    assert f"| tiny-llama-2l, bfloat16 | eager | {r['itl_ms']:.2f} |" in stdout
