"""docs/bench/ holds the reports the docs cite, and no raw samples: every file a doc links
to (or names, as in a command line) exists, every JSON there is small, and every
summary still renders the report the docs show (table; chart beside it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vllm_x86.tools.bench import report
from vllm_x86.tools.quantize import quality

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "docs" / "bench"
# Summaries are a few kB to a few tens of kB; the raw results were up to 1.2 MB.
MAX_JSON_BYTES = 64 * 1024
# a Markdown link from docs/*.md (bench/X) or README.md (docs/bench/X) ...
LINK = re.compile(r"\]\((?:\./)?(?:docs/)?bench/([^)#\s]+)\)")
# ... or a dated report named in the text, e.g. a command's --json docs/bench/DATE-x.json
NAMED = re.compile(r"docs/bench/(\d{4}-\d\d-\d\d-[\w.-]*\w)")


def cited() -> dict[str, list[str]]:
    """docs/bench file name -> where the docs cite it (file:line)."""
    out: dict[str, list[str]] = {}
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for n, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1):
            for m in [*LINK.finditer(line), *NAMED.finditer(line)]:
                out.setdefault(m.group(1), []).append(f"{md.relative_to(ROOT)}:{n}")
    return out


def test_the_docs_cite_reports_in_docs_bench():
    names = cited()
    # the checks below mean something only if the pattern finds the docs' links
    assert len(names) >= 40, sorted(names)
    assert "2026-12-02-smollm2-eager.json" in names and "2026-12-02-smollm2-eager.png" in names


def test_every_cited_file_exists():
    missing = [f"{where[0]}: docs/bench/{n}" for n, where in cited().items()
               if not (BENCH / n).is_file()]  # fmt: skip
    assert not missing, "\n".join(missing)


def test_every_json_is_small_and_valid():
    files = sorted(BENCH.glob("*.json"))
    assert files
    big = [f"{f.name}: {f.stat().st_size} bytes" for f in files
           if f.stat().st_size > MAX_JSON_BYTES]  # fmt: skip
    assert not big, f"over {MAX_JSON_BYTES} bytes (raw samples belong in out/):\n" + "\n".join(big)
    for f in files:
        json.loads(f.read_text())


def _by_kind(kind: str) -> list[Path]:
    return [
        f for f in sorted(BENCH.glob("*.json")) if json.loads(f.read_text()).get("kind") == kind
    ]


@pytest.mark.parametrize("path", _by_kind(report.SUMMARY_KIND), ids=lambda p: p.name)
def test_bench_summary_renders_its_report_and_names_its_raw_data(path):
    s = json.loads(path.read_text())
    md = report.render_markdown(s)
    assert f"## vllm-x86 bench: {s['settings']['model']}" in md
    assert all("raw" not in r and "text" not in r["metrics"] for r in s["runs"])
    assert "prompts" not in s
    raw = s["raw"]
    if isinstance(raw, str):  # written by `vllm-x86 bench --summary`: the results stay out of git
        assert raw.endswith("results.json") and "docs/bench" not in raw, raw
    else:  # converted from a full file that stays in git history: `git show COMMIT:PATH`
        assert raw["path"] == f"docs/bench/{path.name}"
        assert re.fullmatch(r"[0-9a-f]{7,}", raw["commit"])
    chart = path.with_suffix(".png")
    if chart.exists():
        assert chart.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("path", _by_kind(quality.SUMMARY_KIND), ids=lambda p: p.name)
def test_quality_summary_renders_its_table(path):
    s = json.loads(path.read_text())
    table = quality.render(s)
    assert "| bf16 | " in table
    assert all("greedy" not in v for v in s["variants"].values())
    raw = s["raw"]
    if isinstance(raw, str):  # the quality runner's own summary: its results stay out of git
        assert raw.endswith("results.json") and "docs/bench" not in raw, raw
    else:  # older summaries: the raw results were in git at that commit
        assert re.fullmatch(r"[0-9a-f]{7,}", raw["commit"])


def test_every_chart_has_its_summary_beside_it():
    lonely = [p.name for p in BENCH.glob("*.png") if not p.with_suffix(".json").is_file()]
    assert not lonely, lonely
