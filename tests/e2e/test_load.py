"""The load tool (vllm_x86/tools/bench/load.py), bounded: 40 requests of mixed lengths at
concurrency 8, half streamed, against a real `vllm-x86 serve` of the default model (eager,
1,024-token context) must all end with HTTP 200, a complete body and the requested number
of tokens, and nearly all with text; and
the tool must count what goes wrong (a 5xx, a hang, a dropped connection, a short answer)
when a fake server does it. No speed is asserted; the full run is `make load`
(docs/reliability.md)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from collections import Counter

import pytest

from tests.conftest import PYTHON, ROOT, clean_env

pytestmark = pytest.mark.slow

REQUESTS = 40


@pytest.fixture(scope="module")
def load_run(default_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("load")
    cmd = [
        PYTHON, "-m", "vllm_x86.tools.bench.load",
        "--model", str(default_model),
        "--contenders", "plugin",
        "--mode", "eager",
        "--concurrency", "8",
        "--requests", str(REQUESTS),
        "--prompt-tokens", "10-1000",
        "--output-tokens", "8-16",
        "--max-model-len", "1024",
        "--timeout", "180",
        "--leak-requests", "0",
        "--out", str(out),
    ]  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=600)
    runs = list(out.iterdir())
    return p, runs


def test_every_request_of_a_mixed_load_gets_a_full_answer(load_run):
    p, runs = load_run
    assert p.returncode == 0, p.stderr[-4000:]
    assert len(runs) == 1
    records = [json.loads(x) for x in (runs[0] / "requests.jsonl").read_text().splitlines()]
    assert len(records) == REQUESTS
    assert Counter(r["stream"] for r in records) == {True: REQUESTS // 2, False: REQUESTS // 2}
    for r in records:
        assert r["status"] == 200 and r["outcome"] == "ok", r
        assert r["output_tokens"] == r["max_tokens"] and 8 <= r["max_tokens"] <= 16, r
    # text: an answer of end-of-text tokens only (ignore_eos) decodes to "", rarely
    assert sum(r["text_chars"] > 0 for r in records) >= REQUESTS * 3 // 4
    # mixed prompt lengths, inside the range asked for
    lens = [r["prompt_tokens"] for r in records]
    assert 10 <= min(lens) < 200 and 600 < max(lens) <= 1000, lens
    # streamed answers have a first-token time before their end
    assert all(0 < r["ttft_s"] <= r["latency_s"] for r in records if r["stream"])

    res = json.loads((runs[0] / "results.json").read_text())
    (level,) = res["levels"]
    assert level["status"] == {"200": REQUESTS} and level["outcomes"] == {"ok": REQUESTS}
    assert level["server_alive"] and res["passed"] and res["failed_requests"] == 0
    assert level["ttft_ms_p50"] > 0 and level["latency_ms_p99"] > 0 and level["peak_rss_mib"] > 0
    assert "| plugin | 8 | 40 / 40 |" in p.stdout


# ------------------------------------------------------------------ failures are counted


def _fake_server(port_box: list, stop: threading.Event) -> None:
    """An OpenAI-like /v1/completions whose n-th request (n = 0, 1, ...) answers by n % 5:
    0 a full answer, 1 a 503, 2 never (a hang), 3 a connection closed mid-answer,
    4 a 200 with one token too few."""
    from aiohttp import web

    count = {"n": 0}

    async def completions(request: web.Request):
        body = await request.json()
        n = count["n"]
        count["n"] += 1
        kind = n % 5
        want = body["max_tokens"] - (1 if kind == 4 else 0)
        usage = {"prompt_tokens": 5, "completion_tokens": want, "total_tokens": 5 + want}
        if kind == 1:
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        if kind == 2:
            await asyncio.sleep(30)
        if not body.get("stream"):
            if kind == 3:
                request.transport.close()
                return web.Response()
            return web.json_response({"choices": [{"text": "word " * want}], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(want if kind != 3 else 1):
            await resp.write(b'data: {"choices": [{"text": "word "}]}\n\n')
        if kind == 3:
            request.transport.close()
            return resp
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_box.append(site._server.sockets[0].getsockname()[1])
        while not stop.is_set():
            await asyncio.sleep(0.1)
        await runner.cleanup()

    asyncio.run(main())


def test_the_tool_counts_each_kind_of_failure(default_model):
    from vllm_x86.tools.bench import load

    port: list = []
    stop = threading.Event()
    t = threading.Thread(target=_fake_server, args=(port, stop), daemon=True)
    t.start()
    try:
        while not port:
            t.join(0.05)
        base = f"http://127.0.0.1:{port[0]}"
        lengths = load.Lengths((10, 50), (4, 8))
        got = {}
        for backend, stream in ((load.STREAM_BACKEND, True), (load.JSON_BACKEND, False)):
            args = load.vllm_bench_args(base, str(default_model), backend, 10, 1, lengths, 0)
            _, recs = load.run_pass(args, "fake", timeout_s=2.0)
            assert len(recs) == 10 and all(r["stream"] is stream for r in recs)
            got[stream] = Counter(r["outcome"] for r in recs)
            by = {r["outcome"]: r for r in recs}
            assert by["5xx"]["status"] == 503 and by["timeout"]["status"] is None
            assert by["ok"]["status"] == 200 and by["invalid"]["status"] == 200
        expected = {"ok": 2, "5xx": 2, "timeout": 2, "dropped": 2, "invalid": 2}
        assert got == {True: expected, False: expected}
    finally:
        stop.set()
        t.join(10)
