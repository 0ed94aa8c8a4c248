"""From raw runs to the report: medians, ranges, per-round ratios, table, chart.

Pure functions of the results dictionary the harness writes as JSON, so a report can
be rendered again from a saved JSON file (``render_markdown(json.load(f))``), and of the
summary (``summary(results)``): the same figures without the raw samples, small enough to
keep next to the docs that cite it (docs/bench/). Both render the same table and chart:

    python -m vllm_x86.tools.bench.report out/bench/RUN/results.json            # the table
    python -m vllm_x86.tools.bench.report RUN/results.json --summary docs/bench/NAME.json

Ratios are taken round by round (contender X's value in round r ÷ the baseline's value
in round r), and the median and range of those ratios are reported: the two runs of a
round are neighbours in time, so noise that drifts over the run cancels in their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from vllm_x86.tools.bench.roofline import roofline_tok_s
from vllm_x86.tools.bench.workload import Workload, figures

MB = 1e6
# A run during which other processes used this share of one CPU or more is flagged.
NOISY_PCT = 10
SUMMARY_KIND = "vllm-x86 bench summary"
# Characters of each greedy text a summary keeps (the report shows 60).
TEXT_CHARS = 100
# A run's figures a summary keeps beside the report's (figures()): the other work beside
# the run, and the CPU time its process tree used.
SUMMARY_METRICS = ("other_cpu_pct", "other_cpu_pct_before", "tree_cpu_s", "not_applicable")


def stats(values: list[float]) -> dict:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "values": values,
    }


def bandwidth_gb_s(results: dict) -> tuple[float, float]:
    """(1 thread, all threads) GB/s: the best of the probes run before and after."""
    probes = results.get("bandwidth", {}).get("probes", [])
    if not probes:
        return float("nan"), float("nan")
    return (
        max(p["gb_s_1_thread"] for p in probes),
        max(p["gb_s_all_threads"] for p in probes),
    )


def add_roofline(results: dict) -> None:
    """Fill results["roofline"] and each run's roofline_pct from the bandwidth probes."""
    bw1, bw_all = bandwidth_gb_s(results)
    roof = results.setdefault("roofline", {})
    for info in roof.get("weights", {}).values():
        info["roofline_tok_s_1_thread"] = roofline_tok_s(info["bytes_per_token"], bw1)
        info["roofline_tok_s_all_threads"] = roofline_tok_s(info["bytes_per_token"], bw_all)
    for run in results.get("runs", []):
        w = roof.get("weights", {}).get(run["contender"])
        d1 = run["metrics"].get("decode_1_tok_s")
        if w and d1:
            run["metrics"]["roofline_pct"] = 100.0 * d1 / w["roofline_tok_s_all_threads"]


def summarize(results: dict) -> None:
    """Fill results["summary"], results["ratios"] and results["greedy_text"]."""
    w = Workload(
        **{**results["workload"], "concurrency": tuple(results["workload"]["concurrency"])}
    )
    names = [c["name"] for c in results["contenders"]]
    runs = results["runs"]
    summary: dict = {}
    for n in names:
        mine = [r for r in runs if r["contender"] == n]
        s: dict = {}
        for f in figures(w):
            vals = [r["metrics"][f.key] for r in mine if r["metrics"].get(f.key) is not None]
            na = next((r["metrics"].get("not_applicable", {}).get(f.key) for r in mine), None)
            if vals:
                s[f.key] = stats(vals)
            elif na:
                s[f.key] = {"not_applicable": na}
            else:
                s[f.key] = {"missing": True}
        summary[n] = s
    results["summary"] = summary

    base = results["baseline"]
    ratios: dict = {}
    by_round = {(r["round"], r["contender"]): r for r in runs}
    rounds = sorted({r["round"] for r in runs})
    for n in names:
        if n == base:
            continue
        rs: dict = {}
        for f in figures(w):
            per_round = []
            for k in rounds:
                a, b = by_round.get((k, base)), by_round.get((k, n))
                if a is None or b is None:
                    continue
                va, vb = a["metrics"].get(f.key), b["metrics"].get(f.key)
                if va and vb:
                    per_round.append(vb / va)
            if per_round:
                rs[f.key] = {**stats(per_round), "per_round": per_round}
        ratios[f"{n}/{base}"] = rs
    results["ratios"] = ratios

    texts = {n: [r["metrics"].get("text") for r in runs if r["contender"] == n] for n in names}
    same_as_base = {
        n: bool(texts[n]) and bool(texts.get(base)) and set(texts[n]) == set(texts[base])
        for n in names
    }
    results["greedy_text"] = {
        "request": "decode at 1 request (prompt 0), all new tokens",
        "by_contender": texts,
        "same_in_every_round": {n: len(set(t)) == 1 for n, t in texts.items() if t},
        "same_as_baseline": same_as_base,
        # characters the first round's text shares with the baseline's before they part
        "common_prefix_chars": {
            n: _common_prefix(texts[n][0], texts[base][0])
            for n in names
            if texts.get(n) and texts.get(base) and texts[n][0] is not None
        },
    }


def _common_prefix(a: str, b: str | None) -> int:
    n = 0
    for x, y in zip(a, b or ""):
        if x != y:
            break
        n += 1
    return n


def summary(results: dict, raw: str | dict | None = None) -> dict:
    """The results without the raw samples: what the report's tables and chart are made
    from (``render_markdown`` and ``plot`` take it as they take the results, and give the
    same table), with the machine, the settings, the command and the dates: 5-40 kB where
    the full results take 0.2-1.2 MB.

    Kept: every figure's median, min, max and n per contender and per ratio to the
    baseline, each run's figures (SUMMARY_METRICS: round by round, with the other work
    beside it), the bandwidth probes' best readings, the roofline, the contenders, the
    greedy-text checks. Dropped: each run's raw samples (every request's send /
    first-token / last-token times), its command line, log path and monitoring counts,
    the prompts' token ids, the bandwidth probes' single readings; greedy texts are cut to
    TEXT_CHARS characters. ``raw`` says where the full results are (their path, or
    {"commit", "path"} for results kept in git history). The summary of a summary is
    itself.
    """
    if results.get("kind") == SUMMARY_KIND:
        return results if raw is None else {**results, "raw": raw}
    if "summary" not in results:  # a run that stopped early: summarize what it measured
        results = json.loads(json.dumps(results))
        add_roofline(results)
        summarize(results)
    w = Workload(
        **{**results["workload"], "concurrency": tuple(results["workload"]["concurrency"])}
    )
    keep = {f.key for f in figures(w)} | set(SUMMARY_METRICS)
    runs = [
        {"round": r["round"], "contender": r["contender"],
         "metrics": {k: v for k, v in r["metrics"].items() if k in keep}}
        for r in results["runs"]
    ]  # fmt: skip
    probes = [
        {k: v for k, v in p.items() if k != "by_threads"}
        for p in results.get("bandwidth", {}).get("probes", [])
    ]
    g = results.get("greedy_text", {})
    return {
        "kind": SUMMARY_KIND,
        "schema": 1,
        "raw": raw,
        **{
            k: results[k]
            for k in ("command", "started", "finished", "machine", "settings", "workload")
            if k in results
        },
        "contenders": results["contenders"],
        "baseline": results["baseline"],
        "bandwidth": {"probes": probes},
        "roofline": results.get("roofline", {}),
        "summary": _stats_only(results["summary"]),
        "ratios": _stats_only(results["ratios"]),
        "greedy_text": {
            **g,
            "by_contender": {
                n: [t[:TEXT_CHARS] if isinstance(t, str) else t for t in ts]
                for n, ts in g.get("by_contender", {}).items()
            },
        },
        "runs": runs,
    }


def _stats_only(table: dict) -> dict:
    """Median, min, max, n (or why there is none) of every figure: no single values (each
    run's are in the summary's runs)."""
    return {
        name: {f: {k: v for k, v in s.items() if k not in ("values", "per_round")}
               for f, s in figs.items()}
        for name, figs in table.items()
    }  # fmt: skip


def dumps(obj, level: int = 0) -> str:
    """JSON with one line per innermost object or list (a run's figures, a statistic):
    readable, and a third of ``indent=1``'s lines."""
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else ()
    if not any(isinstance(v, (dict, list)) for v in values):
        return json.dumps(obj, ensure_ascii=False)
    pad = " " * (level + 1)
    if isinstance(obj, dict):
        items = [f"{pad}{json.dumps(k)}: {dumps(v, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * level + "}"
    items = [pad + dumps(v, level + 1) for v in obj]
    return "[\n" + ",\n".join(items) + "\n" + " " * level + "]"


def write_summary(s: dict, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(s) + "\n")
    return path


def _fmt(v: float, digits: int) -> str:
    return f"{v:.{digits}f}"


_SUP = "¹²³⁴⁵⁶⁷⁸⁹"


def _cell(s: dict, digits: int) -> str:
    if "not_applicable" in s:
        return "n/a¹"
    if "median" not in s:
        return "-"
    if s["n"] == 1:
        return _fmt(s["median"], digits)
    return f"{_fmt(s['median'], digits)} ({_fmt(s['min'], digits)}–{_fmt(s['max'], digits)})"


def _ratio_cell(s: dict | None) -> str:
    if not s:
        return "-"
    if s["n"] == 1:
        return f"{s['median']:.2f}x"
    return f"{s['median']:.2f}x ({s['min']:.2f}–{s['max']:.2f})"


def render_markdown(results: dict) -> str:
    w = Workload(
        **{**results["workload"], "concurrency": tuple(results["workload"]["concurrency"])}
    )
    st = results["settings"]
    names = [c["name"] for c in results["contenders"]]
    base = results["baseline"]
    others = [n for n in names if n != base]
    m = results["machine"]
    lines = [
        f"## vllm-x86 bench: {st['model']}",
        "",
        f"{results['started'][:10]}; {m['cpu']} ({m['cpus']} CPUs, {m['isa']}), "
        f"{m['memory_gib']:.0f} GiB; vllm {m['versions'].get('vllm')}, torch "
        f"{m['versions'].get('torch')}"
        + (
            f", llama-cpp-python {m['versions']['llama-cpp-python']}"
            if m["versions"].get("llama-cpp-python") and "llamacpp" in names
            else ""
        ),
        "",
        f"{st['model_description']}; {st['dtype']}, {st['mode']}; {st['rounds']} round(s), "
        f"contenders alternating ({' '.join(names)}, ...), each run a fresh process; "
        f"{w.new_tokens} new tokens per request, greedy, ignore_eos.",
        "",
        "Contenders:",
    ]
    for c in results["contenders"]:
        lines.append(f"- **{c['name']}**: {c['description']}")
    head = ["figure: median (min–max)", *names, *[f"{n}/{base}" for n in others]]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes: dict[tuple[str, str], int] = {}  # (contender, why) -> footnote number
    for f in figures(w):
        per = {n: results["summary"][n].get(f.key, {"missing": True}) for n in names}
        if all("missing" in v for v in per.values()):
            continue  # a figure no contender has (a summary older than the figure)
        cells = [f.label + ("" if f.higher_is_better else ", lower is better")]
        for n in names:
            s = per[n]
            if "not_applicable" in s:
                mark = _SUP[notes.setdefault((n, s["not_applicable"]), len(notes))]
                cells.append("n/a" + mark)
                continue
            cells.append(_cell(s, f.digits))
        for n in others:
            cells.append(_ratio_cell(results["ratios"][f"{n}/{base}"].get(f.key)))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"Ratios: {', '.join(f'{n}/{base}' for n in others) or '-'}, median (min–max) of the "
        "per-round ratios."
    )
    for (n, why), i in notes.items():
        lines.append(f"{_SUP[i]} {n}: {why}.")
    lines += _per_round(results, w, names, base, others)

    busy = {
        n: [
            r["metrics"].get("other_cpu_pct") or 0.0 for r in results["runs"] if r["contender"] == n
        ]
        for n in names
    }
    if any(busy.values()):
        lines += [
            "",
            "Other processes' CPU use during the runs, % of one CPU (median / max): "
            + ", ".join(
                f"{n} {statistics.median(v):.0f} / {max(v):.0f}" for n, v in busy.items() if v
            )
            + ".",
        ]
        noisy = [
            f"round {r['round']} {r['contender']} ({r['metrics']['other_cpu_pct']:.0f}%)"
            for r in results["runs"]
            if (r["metrics"].get("other_cpu_pct") or 0.0) >= NOISY_PCT
        ]
        if noisy:
            lines.append(
                f"**Not a quiet machine**: other work used ≥ {NOISY_PCT}% of a CPU in "
                + ", ".join(noisy)
                + "; those figures are slower than the contender is."
            )

    bw = results.get("bandwidth", {})
    bw1, bw_all = bandwidth_gb_s(results)
    if bw.get("probes"):
        p0 = bw["probes"][0]
        lines += [
            "",
            f"Memory bandwidth (streaming read of a {p0['buffer_bytes'] / 2**20:.0f} MiB "
            f"buffer, best of sum/gemv × {p0['repeats']}, probed before and after): "
            f"**{bw1:.1f} GB/s** with 1 thread, **{bw_all:.1f} GB/s** with "
            f"{p0['all_threads']} threads.",
        ]
    roof = results.get("roofline", {}).get("weights", {})
    if roof:
        lines += ["", "Decode roofline for one request (weight bytes per token ÷ bandwidth):"]
        groups: dict[tuple, list[str]] = {}
        for n, info in roof.items():
            key = (info["bytes_per_token"], info["what"])
            groups.setdefault(key, []).append(n)
        for (nbytes, what), ns in groups.items():
            info = roof[ns[0]]
            lines.append(
                f"- {', '.join(ns)}: {nbytes / MB:.0f} MB per token ({what}) → "
                f"{info['roofline_tok_s_all_threads']:.1f} tok/s with all threads "
                f"({info['roofline_tok_s_1_thread']:.1f} tok/s with 1)"
            )
    g = results.get("greedy_text", {})
    if g:
        lines += ["", f"Greedy text ({g['request']}; first 60 characters):"]
        for n in names:
            ts = g["by_contender"].get(n) or []
            uniq = sorted(set(ts))
            # from the full texts (a summary keeps their first TEXT_CHARS characters)
            once = g.get("same_in_every_round", {}).get(n, len(uniq) == 1)
            same = "same in every round" if once else "DIFFERS between rounds"
            lines.append(f"- {n} ({same}): " + " | ".join(repr(t[:60]) for t in uniq))
        for n in others:
            if g["same_as_baseline"].get(n):
                lines.append(f"- {n} gave the same text as {base}")
            else:
                k = g.get("common_prefix_chars", {}).get(n)
                where = f" (they part after {k} characters)" if k is not None else ""
                lines.append(f"- {n} gave a DIFFERENT text from {base}{where}")
    if st["rounds"] < 3:
        lines += ["", f"Note: {st['rounds']} round(s); the method asks for at least 3."]
    lines += ["", f"Command: `{results['command']}`"]
    return "\n".join(lines) + "\n"


def _per_round(results: dict, w: Workload, names: list[str], base: str, others: list[str]):
    """Decode ratios round by round, beside the other work each run had (a noisy run
    shows here as an outlier next to its CPU figure)."""
    runs = {(r["round"], r["contender"]): r for r in results["runs"]}
    rounds = sorted({r["round"] for r in results["runs"]})
    if len(rounds) < 2 or not others:
        return []
    cols = [
        (n, c)
        for n in others
        for c in w.concurrency
        if any((runs.get((k, n)) or {}).get("metrics", {}).get(f"decode_{c}_tok_s") for k in rounds)
    ]
    head = ["round", *[f"{n}: other CPU %" for n in names], *[f"{n}/{base} @{c}" for n, c in cols]]
    out = ["", "Decode ratios round by round, and other processes' CPU use during each run:", ""]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in rounds:
        cells = [str(k)]
        for n in names:
            v = (runs.get((k, n)) or {}).get("metrics", {}).get("other_cpu_pct")
            cells.append("-" if v is None else f"{v:.0f}")
        for n, c in cols:
            a = (runs.get((k, base)) or {}).get("metrics", {}).get(f"decode_{c}_tok_s")
            b = (runs.get((k, n)) or {}).get("metrics", {}).get(f"decode_{c}_tok_s")
            cells.append(f"{b / a:.2f}x" if a and b else "-")
        out.append("| " + " | ".join(cells) + " |")
    return out


def plot(results: dict, path: Path) -> Path | None:
    """PNG of decode tokens/s against concurrent requests, one line per contender."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    conc = results["workload"]["concurrency"]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for c in results["contenders"]:
        n = c["name"]
        xs, ys, lo, hi = [], [], [], []
        for k in conc:
            s = results["summary"][n].get(f"decode_{k}_tok_s", {})
            if "median" in s:
                xs.append(k)
                ys.append(s["median"])
                lo.append(s["median"] - s["min"])
                hi.append(s["max"] - s["median"])
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=4, label=n)
    roof = results.get("roofline", {}).get("weights", {})
    if roof:
        first = next(iter(roof.values()))
        # the roofline is for one request: a mark at 1, not a line across batch sizes
        ax.plot(
            [1],
            [first["roofline_tok_s_all_threads"]],
            marker="_",
            markersize=30,
            color="grey",
            linestyle="none",
            label=f"roofline, 1 request ({first['what']})",
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(conc)
    ax.set_xticklabels([str(k) for k in conc])
    ax.set_yscale("log")
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("decode tokens/s (all requests together)")
    st = results["settings"]
    ax.set_title(
        f"{st['model']}, {st['dtype']}, {st['mode']}: median, min–max of {st['rounds']} round(s)",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m vllm_x86.tools.bench.report",
        description="Print the report of a `vllm-x86 bench` run from its results.json (or "
        "from a summary of it); write the summary (the figures without the raw samples) "
        "and the chart where asked.",
    )
    p.add_argument("results", type=Path, help="a run's results.json, or a summary JSON")
    p.add_argument("--summary", type=Path, help="write the summary JSON here")
    p.add_argument("--chart", type=Path, help="draw the chart here (PNG)")
    a = p.parse_args(argv)
    try:
        data = json.loads(a.results.read_text())
    except (OSError, ValueError) as e:
        print(f"{p.prog}: error: cannot read {a.results}: {e}", file=sys.stderr)
        return 1
    if not isinstance(data, dict) or not {"runs", "contenders", "baseline"} <= data.keys():
        print(
            f"{p.prog}: error: {a.results} is not the results of `vllm-x86 bench` "
            "(it has no runs, contenders and baseline)",
            file=sys.stderr,
        )
        return 1
    s = summary(data, raw=None if data.get("kind") == SUMMARY_KIND else str(a.results))
    if a.summary:
        write_summary(s, a.summary)
    if a.chart and plot(s, a.chart) is None:
        print(f"{p.prog}: no chart: matplotlib is not installed", file=sys.stderr)
    print(render_markdown(s), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
