"""`vllm-x86 bench --quick` for real: the plugin and stock vLLM CPU (and llama.cpp when
llama-cpp-python is installed) on the tiny random-weight model, one round.

Checks that the report has every figure for every contender, the ratios, the bandwidth
probe and roofline, the raw samples, the chart, and that the contenders produced the
same greedy text on the same prompt: a benchmark that compares wrong outputs is
worthless. The smoke run computes in float32, where they must agree: in eager bf16
stock vLLM's rotary kernel rounds differently from the model's reference
(docs/correctness.md), so bf16 texts may part on a near tie. No speed is asserted.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import PYTHON, clean_env
from vllm_x86.tools.bench.contenders import llamacpp_available
from vllm_x86.tools.bench.workload import Workload, figures

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quick(default_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    names = ["stock", "plugin"] + (["llamacpp"] if llamacpp_available() else [])
    p = subprocess.run(
        [
            PYTHON,
            "-m",
            "vllm_x86.tools.cli",
            "bench",
            "--quick",
            "--contenders",
            ",".join(names),
            "--out",
            str(out),
            # the test checks the report, not the speed: no waiting for a quiet machine
            # (another test worker may be busy beside it)
            "--wait-quiet",
            "0",
        ],  # fmt: skip
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-5000:]
    (run_dir,) = out.iterdir()
    results = json.loads((run_dir / "results.json").read_text())
    return {"names": names, "proc": p, "dir": run_dir, "results": results}


KV_FIGURES = ("kv_resident_mib", "peak_pss_less_kv_mib")


def test_every_figure_for_every_contender(quick):
    res = quick["results"]
    w = Workload(**{**res["workload"], "concurrency": tuple(res["workload"]["concurrency"])})
    assert w.concurrency == (1, 8, 32) and w.prompt_tokens == 512
    assert res["settings"]["dtype"] == "float32" and res["settings"]["rounds"] == 1
    for name in quick["names"]:
        for f in figures(w):
            s = res["summary"][name][f.key]
            if name == "llamacpp" and f.key in ("decode_8_tok_s", "decode_32_tok_s"):
                assert "one sequence at a time" in s["not_applicable"]
                continue
            if f.key in KV_FIGURES and name != "plugin":
                # the KV cache apart: only the plugin's worker says where its cache lies
                if name == "llamacpp":
                    assert "not told apart" in s["not_applicable"]
                else:
                    assert s == {"missing": True}, (name, f.key, s)
                continue
            assert s["n"] == 1 and s["median"] > 0, (name, f.key, s)
    kv = res["summary"]["plugin"]
    assert kv["peak_pss_less_kv_mib"]["median"] < kv["peak_pss_mib"]["median"]
    for f in figures(w):
        if f.key not in ("decode_8_tok_s", "decode_32_tok_s", *KV_FIGURES):
            assert len(res["ratios"]["plugin/stock"][f.key]["per_round"]) == 1


def test_raw_samples_are_kept(quick):
    res = quick["results"]
    for run in res["runs"]:
        raw = run["raw"]
        startup = run["metrics"]["startup_s"]
        assert raw["first_request"]["t_first"] == pytest.approx(startup, abs=1e-3)
        assert len(raw["ttft_s"]) == 1
        reqs = raw["decode_1"]["requests"]
        assert len(reqs) == 1 and reqs[0]["tokens"] == 32
        if run["contender"] != "llamacpp":
            for c in (8, 32):
                assert [r["tokens"] for r in raw[f"decode_{c}"]["requests"]] == [32] * c
            assert "--enforce-eager" in run["command"]


def test_bandwidth_and_roofline(quick):
    res = quick["results"]
    assert len(res["bandwidth"]["probes"]) == 2
    for p in res["bandwidth"]["probes"]:
        assert p["gb_s_1_thread"] > 0 and p["gb_s_all_threads"] > 0
    for name in quick["names"]:
        w = res["roofline"]["weights"][name]
        assert w["bytes_per_token"] > 0 and w["roofline_tok_s_all_threads"] > 0


def test_same_greedy_text(quick):
    g = quick["results"]["greedy_text"]
    texts = g["by_contender"]
    assert texts["stock"][0], "empty text"
    for name in quick["names"]:
        assert g["same_as_baseline"][name], texts


def test_outputs_table_json_and_chart(quick):
    out = quick["proc"].stdout
    assert "| figure: median (min–max) | stock | plugin |" in out
    for f in figures(Workload()):
        assert f"| {f.label}" in out
    assert "VLLM_CPU_KVCACHE_SPACE=1" in out  # stock's one change is in the report
    assert (quick["dir"] / "report.md").read_text() in out
    assert (quick["dir"] / "chart.png").read_bytes()[:4] == b"\x89PNG"
