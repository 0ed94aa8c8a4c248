"""`vllm-x86 bench startup` without servers: phases from log times, the report, the CLI's
refusals. (The real run is measured by hand and recorded in docs/startup.md.)"""

from __future__ import annotations

import subprocess
import time

from tests.conftest import PYTHON, clean_env
from vllm_x86.tools.bench import startup


def test_phases_are_consecutive_and_skip_missing_lines():
    seen = {"args": 5.0, "engine": 6.0, "worker": 7.0, "weights": 7.5, "engine_ready": 9.0,
            "api": 10.0}  # fmt: skip
    p = startup._phases(seen, ready=10.5, first=10.75)
    assert p["args"] == 5.0 and p["engine"] == 1.0 and p["worker"] == 1.0
    assert p["weights"] == 0.5
    assert p["warmup"] is None  # eager: no warm-up line; its time falls in the next phase
    assert p["engine_ready"] == 1.5 and p["api"] == 1.0
    assert p["ready"] == 0.5 and p["first_token"] == 0.25
    assert abs(sum(v for v in p.values() if v) - 10.75) < 1e-9


def _run(start, total, text="same"):
    return {"start": start, "startup_s": total, "text": text, "load_avg_1min": 1.0, "round": 1,
            "other_cpu_pct_before": 3.0,
            "phases": startup._phases({"args": total / 2}, total - 0.2, total)}  # fmt: skip


def test_report_has_every_start_the_ratio_and_the_text_check():
    res = {"model": "m", "dtype": "bfloat16", "mode": "eager", "max_model_len": 512,
           "rounds": 2, "daemon_warm_s": 5.0,
           "runs": [_run("stock", 20.0), _run("daemon", 3.0), _run("stock", 22.0),
                    _run("daemon", 4.0)]}  # fmt: skip
    text = startup.report(res)
    assert "| phase (s) | stock | daemon |" in text
    assert "**21.0**" in text and "**3.5**" in text
    assert "6.0x" in text  # 21.0 / 3.5
    assert "the same text from every start" in text
    assert "5.0 s to start" in text
    res["runs"][1]["text"] = "other"
    assert "TEXTS DIFFER" in startup.report(res)


def test_summary_has_the_medians_and_every_start_without_commands():
    res = {"model": "m", "dtype": "bfloat16", "mode": "eager", "max_model_len": 512,
           "rounds": 2, "runs": [_run("stock", 20.0), _run("daemon", 3.0),
                                 _run("stock", 22.0), _run("daemon", 4.0)]}  # fmt: skip
    for r in res["runs"]:
        r.update(command=["python", "-m", "vllm_x86.tools.cli", "serve"], markers_s={"args": 1.0})
    s = startup.summary(res)
    assert s["kind"] == startup.SUMMARY_KIND and s["model"] == "m"
    assert s["medians"]["stock"]["startup_s"] == 21.0 and s["medians"]["daemon"]["startup_s"] == 3.5
    assert s["medians"]["daemon"]["phases"]["args"] == 1.75
    assert [r["startup_s"] for r in s["runs"]] == [20.0, 3.0, 22.0, 4.0]
    assert not any("command" in r or "markers_s" in r for r in s["runs"])
    assert startup.report(s) == startup.report(res)


def test_log_watch_times_markers(tmp_path):
    log = tmp_path / "x.log"
    w = startup.LogWatch(log, time.perf_counter())
    w.start()
    time.sleep(0.05)
    log.write_text("(APIServer pid=1) INFO non-default args: {}\n")
    time.sleep(0.1)
    with open(log, "a") as f:
        f.write("(EngineCore pid=2) INFO Initializing a V1 LLM engine (v0.32.0)\npartial")
    time.sleep(0.1)
    seen = w.stop()
    assert set(seen) == {"args", "engine"} and seen["args"] < seen["engine"]


def test_cli_refuses_bad_starts():
    r = subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.cli", "bench", "startup", "--starts", "stock,warp"],
        env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 1 and "unknown start(s) ['warp']" in r.stderr
    for kind in ("warm-cache", "cold-compile"):
        r = subprocess.run(
            [PYTHON, "-m", "vllm_x86.tools.cli", "bench", "startup", "--starts", kind],
            env=clean_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert r.returncode == 1 and f"{kind} is about compiling: use --mode compiled" in r.stderr
    r = subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.cli", "bench", "startup", "--summary", "docs/bench/x.md"],
        env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 1 and "--summary docs/bench/x.md: give a .json file name" in r.stderr
