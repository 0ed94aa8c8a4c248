"""Structured-output benchmark: JSON that parses and validates, plugin against stock.

    python -m vllm_x86.tools.bench.structured                 # the run in docs/structured_output.md
    python -m vllm_x86.tools.bench.structured --contenders plugin --budgets 32   # a quick look

For each contender (``plugin``: ``vllm-x86 serve MODEL --no-daemon``; ``stock``: vLLM
CPU's own server with VLLM_X86_DISABLE=1; contenders.py, started as load.py starts
them, same model, --max-model-len, --dtype and mode), one server at a time:

1. every schema of structured_schemas.py (>= 40) is sent once per budget in
   ``--budgets`` (``default``: no max_tokens, so the server's default, what
   --max-model-len leaves after the prompt; a number: that max_tokens), as a chat
   completion, greedy (temperature 0), ``--concurrency`` at a time; even-numbered
   schemas through OpenAI's ``response_format: {"type": "json_schema"}``, odd-numbered
   through vLLM's ``structured_outputs: {"json": ...}``. Each answer is classed:
   ``valid`` (200, parses, validates against its schema with ``jsonschema``),
   ``schema_error`` (parses, does not validate), ``not_json`` (200, does not parse: in
   practice cut at max_tokens), ``refused`` (a 400, e.g. the plugin's "max_tokens is
   too small ... at least N"), ``error`` (anything else). Rates are over the answered
   (non-refused) requests; refusals are listed with their message.
2. the cost of the constraint: ``--speed-prompts`` prompts that invite a long answer,
   each sent free (no constraint, ignore_eos) and constrained (a schema with one long
   string), both with max_tokens ``--speed-tokens``, one request at a time; tokens/s is
   the completion tokens over the request's wall time (prompt processing included, the
   same prompts in both).

Files: ``--out`` (out/structured/ by default, outside git) gets RUN/answers.jsonl (every
request and answer), RUN/results.json and the server logs; ``--summary FILE.json`` the
figures only (docs/bench/structured.json), ``--report FILE.md`` the tables that
docs/structured_output.md quotes.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import shlex
import sys
import time
from pathlib import Path

import httpx

from vllm_x86.tools.bench.contenders import BenchError, parse_contenders
from vllm_x86.tools.bench.load import serving
from vllm_x86.tools.bench.server import SERVED_NAME
from vllm_x86.tools.bench.structured_schemas import SCHEMAS

SUMMARY_KIND = "vllm-x86 structured-output summary"
CLASSES = ("valid", "schema_error", "not_json", "refused", "error")
SPEED_PROMPTS = [
    "Write a long story about a lighthouse keeper.",
    "Explain in detail how a steam engine works.",
    "Describe a long journey through the mountains.",
    "Write a detailed history of a small fishing village.",
]
SPEED_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "text": {"type": "string"}},
    "required": ["title", "text"],
}


def _say(msg: str) -> None:
    print(f"[vllm-x86 structured] {msg}", file=sys.stderr, flush=True)


def request_body(i: int, name: str, prompt: str, schema: dict, budget: int | None) -> dict:
    body: dict = {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
    }
    if budget is not None:
        body["max_tokens"] = budget
    if i % 2 == 0:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": name, "schema": schema},
        }
    else:
        body["structured_outputs"] = {"json": schema}
    return body


def classify(status: int, body: dict | None, schema: dict) -> tuple[str, str]:
    """(class, detail) of one answer (module docstring)."""
    import jsonschema

    if status == 400:
        return "refused", str((body or {}).get("error", {}).get("message", body))[:300]
    if status != 200 or not body:
        return "error", f"HTTP {status}: {str(body)[:200]}"
    try:
        text = body["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        return "error", f"no message: {str(body)[:200]}"
    try:
        value = json.loads(text)
    except ValueError as e:
        return "not_json", str(e)[:120]
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as e:
        return "schema_error", e.message[:200]
    return "valid", ""


async def _one(client: httpx.AsyncClient, base: str, body: dict, timeout: float) -> dict:
    t0 = time.monotonic()
    try:
        r = await client.post(f"{base}/v1/chat/completions", json=body, timeout=timeout)
        status = r.status_code
        try:
            out = r.json()
        except ValueError:
            out = {"raw": r.text[:500]}
    except httpx.HTTPError as e:
        status, out = 0, {"error": {"message": repr(e)}}
    return {"status": status, "body": out, "wall_s": time.monotonic() - t0}


async def run_schemas(base: str, budgets: list[int | None], concurrency: int, timeout: float):
    sem = asyncio.Semaphore(concurrency)
    records: list[dict] = []

    async with httpx.AsyncClient() as client:

        async def task(i, name, prompt, schema, budget):
            body = request_body(i, name, prompt, schema, budget)
            async with sem:
                res = await _one(client, base, body, timeout)
            cls, detail = classify(res["status"], res["body"], schema)
            b = res["body"] if isinstance(res["body"], dict) else {}
            choice = (b.get("choices") or [{}])[0]
            records.append(
                {
                    "schema": name,
                    "budget": "default" if budget is None else budget,
                    "api": "response_format" if i % 2 == 0 else "structured_outputs",
                    "status": res["status"],
                    "class": cls,
                    "detail": detail,
                    "finish_reason": choice.get("finish_reason"),
                    "completion_tokens": (b.get("usage") or {}).get("completion_tokens"),
                    "content": (choice.get("message") or {}).get("content"),
                    "wall_s": res["wall_s"],
                }
            )

        await asyncio.gather(
            *(
                task(i, name, prompt, schema, budget)
                for budget in budgets
                for i, (name, prompt, schema) in enumerate(SCHEMAS)
            )
        )
    return records


async def run_speed(base: str, prompts: list[str], tokens: int, timeout: float) -> dict:
    out: dict[str, list] = {"free": [], "constrained": []}
    async with httpx.AsyncClient() as client:
        for prompt in prompts:
            for mode in ("free", "constrained"):
                body: dict = {
                    "model": SERVED_NAME,
                    "messages": [{"role": "user", "content": prompt}],
                    "temperature": 0,
                    "max_tokens": tokens,
                }
                if mode == "free":
                    body["ignore_eos"] = True
                else:
                    body["response_format"] = {
                        "type": "json_schema",
                        "json_schema": {"name": "text", "schema": SPEED_SCHEMA},
                    }
                res = await _one(client, base, body, timeout)
                usage = (res["body"] or {}).get("usage") or {}
                n = usage.get("completion_tokens") or 0
                out[mode].append({"tokens": n, "wall_s": res["wall_s"], "status": res["status"]})
    return {
        mode: {
            "requests": len(rows),
            "tokens": sum(r["tokens"] for r in rows),
            "wall_s": round(sum(r["wall_s"] for r in rows), 3),
            "tokens_per_s": round(
                sum(r["tokens"] for r in rows) / max(1e-9, sum(r["wall_s"] for r in rows)), 2
            ),
        }
        for mode, rows in out.items()
    }


def tally(records: list[dict]) -> dict:
    """Per budget: counts per class, valid-JSON and schema-compliance rates over the
    answered requests, finish reasons, and the refusals' messages."""
    out: dict = {}
    for budget in dict.fromkeys(r["budget"] for r in records):
        rows = [r for r in records if r["budget"] == budget]
        counts = {c: sum(r["class"] == c for r in rows) for c in CLASSES}
        answered = len(rows) - counts["refused"]
        parsed = counts["valid"] + counts["schema_error"]
        finish: dict[str, int] = {}
        for r in rows:
            if r["status"] == 200:
                finish[str(r["finish_reason"])] = finish.get(str(r["finish_reason"]), 0) + 1
        out[str(budget)] = {
            "requests": len(rows),
            "answered": answered,
            **counts,
            "valid_json_pct": round(100 * parsed / answered, 1) if answered else None,
            "schema_valid_pct": round(100 * counts["valid"] / answered, 1) if answered else None,
            "finish_reasons": finish,
            "completion_tokens": sum(r["completion_tokens"] or 0 for r in rows),
            "failures": [
                {"schema": r["schema"], "class": r["class"], "detail": r["detail"]}
                for r in rows
                if r["class"] not in ("valid",)
            ],
        }
    return out


def report(res: dict) -> str:
    lines = [
        f"Run {res['run']} on {res['machine']['cpu']} ({res['machine']['cpus']} CPUs); "
        f"model {res['model']}, --max-model-len {res['max_model_len']}, {res['mode']}, "
        f"{len(SCHEMAS)} schemas per budget, concurrency {res['concurrency']}.",
        "",
        "| contender | max_tokens | requests | refused (400) | valid JSON | schema-valid "
        "| finish reasons | completion tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, c in res["contenders"].items():
        for budget, t in c["budgets"].items():
            fr = ", ".join(f"{k} {v}" for k, v in sorted(t["finish_reasons"].items()))
            lines.append(
                f"| {name} | {budget} | {t['requests']} | {t['refused']} | "
                f"{t['valid_json_pct']} % | {t['schema_valid_pct']} % | {fr} | "
                f"{t['completion_tokens']} |"
            )
    lines += [
        "",
        "| contender | free tokens/s | constrained tokens/s | constrained / free |",
        "|---|---|---|---|",
    ]
    for name, c in res["contenders"].items():
        sp = c.get("speed")
        if sp:
            f, k = sp["free"]["tokens_per_s"], sp["constrained"]["tokens_per_s"]
            lines.append(
                f"| {name} | {f} | {k} | {k / f:.2f} |" if f else f"| {name} | - | {k} | - |"
            )
    lines.append("")
    for name, c in res["contenders"].items():
        for budget, t in c["budgets"].items():
            for fail in t["failures"]:
                lines.append(
                    f"- {name}, max_tokens {budget}, `{fail['schema']}`: {fail['class']}: "
                    f"{fail['detail']}"
                )
    return "\n".join(lines) + "\n"


def _budget(text: str) -> int | None:
    return None if text == "default" else int(text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m vllm_x86.tools.bench.structured",
        description="Structured-output benchmark (see the module docstring).",
    )
    p.add_argument("--model", help="model directory or catalog name (default: the default model)")
    p.add_argument("--contenders", default="plugin,stock", help="(default: %(default)s)")
    p.add_argument(
        "--budgets",
        default="default,32",
        help="comma-separated max_tokens per schema, 'default' for none (default: %(default)s)",
    )
    p.add_argument("--max-model-len", type=int, default=512, help="(default: %(default)s)")
    p.add_argument("--dtype", default="bfloat16", help="(default: %(default)s)")
    p.add_argument("--mode", default="eager", choices=("eager", "compiled"))
    p.add_argument("--concurrency", type=int, default=4, help="(default: %(default)s)")
    p.add_argument("--speed-prompts", type=int, default=3, help="(default: %(default)s)")
    p.add_argument("--speed-tokens", type=int, default=96, help="(default: %(default)s)")
    p.add_argument("--timeout", type=float, default=600.0, help="per request, s")
    p.add_argument("--out", default="out/structured", help="raw results (default: %(default)s)")
    p.add_argument("--summary", metavar="FILE.json", help="also write the summary here")
    p.add_argument("--report", metavar="FILE.md", help="also write the report tables here")
    return p


def run(ns: argparse.Namespace, command: list[str]) -> dict:
    from vllm_x86.tools.bench.harness import machine_info
    from vllm_x86.tools.models.pull import pull

    model_dir = Path(ns.model) if ns.model and Path(ns.model).is_dir() else pull(ns.model)
    budgets = [_budget(b.strip()) for b in ns.budgets.split(",") if b.strip()]
    run_id = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir = Path(ns.out) / run_id
    out_dir.mkdir(parents=True, exist_ok=True)
    res: dict = {
        "kind": SUMMARY_KIND,
        "run": run_id,
        "command": shlex.join(command),
        "machine": machine_info(),
        "model": model_dir.name,
        "max_model_len": ns.max_model_len,
        "mode": ns.mode,
        "concurrency": ns.concurrency,
        "schemas": len(SCHEMAS),
        "budgets": ["default" if b is None else b for b in budgets],
        "contenders": {},
    }
    answers = out_dir / "answers.jsonl"
    for contender in parse_contenders(ns.contenders):
        _say(f"{contender.name}: starting its server")
        log = out_dir / f"{contender.name}.log"
        with serving(contender, model_dir, ns.dtype, ns.mode, ns.max_model_len, log) as srv:
            _say(
                f"{contender.name}: ready in {srv.startup_s:.0f} s; {len(SCHEMAS)} schemas x {len(budgets)} budgets"
            )
            t0 = time.monotonic()
            records = asyncio.run(run_schemas(srv.base, budgets, ns.concurrency, ns.timeout))
            schemas_s = time.monotonic() - t0
            speed = None
            if ns.speed_prompts:
                speed = asyncio.run(
                    run_speed(
                        srv.base, SPEED_PROMPTS[: ns.speed_prompts], ns.speed_tokens, ns.timeout
                    )
                )
        with open(answers, "a") as fh:
            for r in records:
                fh.write(json.dumps({"contender": contender.name, **r}) + "\n")
        res["contenders"][contender.name] = {
            "command": shlex.join(srv.command),
            "schemas_wall_s": round(schemas_s, 1),
            "budgets": tally(records),
            "speed": speed,
        }
        for budget, t in res["contenders"][contender.name]["budgets"].items():
            _say(
                f"{contender.name} max_tokens={budget}: valid JSON {t['valid_json_pct']} %, "
                f"schema-valid {t['schema_valid_pct']} %, refused {t['refused']}"
            )
    (out_dir / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    text = report(res)
    (out_dir / "report.md").write_text(text)
    if ns.summary:
        Path(ns.summary).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.summary).write_text(json.dumps(res, indent=1) + "\n")
    if ns.report:
        Path(ns.report).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.report).write_text(text)
    print(text)
    return res


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = build_parser().parse_args(argv)
    try:
        run(ns, ["python", "-m", "vllm_x86.tools.bench.structured", *argv])
    except BenchError as e:
        print(f"vllm-x86 structured: error: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
