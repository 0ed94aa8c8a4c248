"""The profiling mode's pieces (docs/overhead.md): which op falls into which category, how
the records of the three processes become a breakdown that adds up, and that the
step-profile patch (runtime/patches/step_profile.py) changes nothing unless it is on."""

from __future__ import annotations

import importlib
import json
import sys
import time
from types import SimpleNamespace

import pytest

from vllm_x86.runtime.patches import step_profile
from vllm_x86.runtime.patches.ledger import MARK
from vllm_x86.tools.bench import overhead


@pytest.mark.parametrize(
    "name, category",
    [
        ("aten::linear", "gemm"),
        ("aten::addmm", "gemm"),
        ("aten::mm", "gemm"),
        ("aten::matmul", "gemm"),
        ("aten::bmm", "gemm"),
        ("_C::weight_packed_linear", "gemm"),
        ("_C::onednn_mm", "gemm"),
        ("_C::int4_scaled_mm_cpu", "gemm"),
        ("_C::int8_scaled_mm_with_quant", "gemm"),
        ("vllm_x86::int4_w4a16_gemm", "gemm"),
        ("vllm_x86::int8_w8a16_gemm", "gemm"),
        ("aten::_weight_int4pack_mm_for_cpu", "gemm"),
        ("mkldnn::_linear_pointwise", "gemm"),
        ("vllm::unified_attention_with_output", "attention"),
        ("vllm::unified_kv_cache_update", "attention"),
        ("_C::cpu_attention_with_kv_cache", "attention"),
        ("_C::cpu_attn_reshape_and_cache", "attention"),
        ("aten::scaled_dot_product_attention", "attention"),
        ("vllm_x86::rms_norm", "other"),
        ("vllm_x86::fused_add_rms_norm", "other"),
        ("vllm_x86::rotary_embedding", "other"),
        ("vllm_x86::silu_and_mul", "other"),
        ("aten::embedding", "other"),
        ("aten::add", "other"),
        ("aten::empty", "other"),
        ("aten::cumsum", "other"),
        ("graph_0_cpp_fused_add_mean_mul_0", "other"),
        ("graph_0_cpp_fused__to_copy_add_embedding_mean_weight_packed_linear_0", "other"),
    ],
)
def test_op_category(name, category):
    assert step_profile.op_category(name) == category


def test_scopes_are_not_ops():
    assert step_profile.is_op("aten::mm") and step_profile.is_op("graph_1_cpp_fused_silu_3")
    for scope in ("Torch-Compiled Region: 0/0", "## Call CompiledFxGraph abc ##", "x"):
        assert not step_profile.is_op(scope)


def _ev(name, total, children=(), self_us=None):
    return SimpleNamespace(
        name=name,
        cpu_time_total=total,
        self_cpu_time_total=total - sum(c.cpu_time_total for c in children)
        if self_us is None
        else self_us,
        cpu_children=list(children),
    )


def test_summary_counts_top_level_ops_of_forwards_through_scopes():
    addmm = _ev("aten::addmm", 30)
    linear = _ev("aten::linear", 40, [_ev("aten::t", 5), addmm])
    attn = _ev("vllm::unified_attention_with_output", 20, [_ev("_C::cpu_attention", 15)])
    kernel = _ev("graph_0_cpp_fused_add_0", 6)
    region = _ev("Torch-Compiled Region: 0/0", 10, [kernel])
    fwd = _ev(step_profile.FORWARD_SCOPE, 100, [linear, attn, region])
    other = _ev("aten::mm", 999)  # outside any forward: not counted
    s = step_profile.summarize_ops([fwd, linear, addmm, attn, other, fwd])
    assert s["forwards"] == 2 and s["forward_us"] == 200
    assert s["ops"]["aten::linear"] == {"us": 80, "self_us": 10, "calls": 2}
    assert "aten::addmm" not in s["ops"]  # inside linear: counted with it
    assert s["ops"]["graph_0_cpp_fused_add_0"]["us"] == 12  # found through the region
    per = overhead.ops_per_step(s)
    assert per["gemm"] == pytest.approx(0.040)
    assert per["attention"] == pytest.approx(0.020)
    assert per["other_ops"] == pytest.approx(0.006)
    assert per["forward_profiled"] == pytest.approx(0.100)


def _synthetic(n=40, period=0.010, wait=0.008, execute=0.006, forward=0.004, lm=0.001):
    """Records of a steady decode: a step every ``period`` s, the client a bit later."""
    t0 = 1000.0
    engine = [{"t": t0 - 0.02, "tokens": 12, "step": 0.03, "worker_wait": 0.03}]  # prefill
    worker = [{"t": t0 - 0.02, "tokens": 12, "execute": 0.02, "forward": 0.015, "sample": 0.001}]
    chunks = []
    for k in range(n):
        t = t0 + k * period
        engine.append(
            {"t": t, "tokens": 1, "step": 0.0095, "worker_wait": wait, "schedule": 0.0003}
        )
        w = {"t": t + 0.0002, "tokens": 1, "execute": execute, "forward": forward}
        worker.append(w | {"lm_head": lm, "sample": 0.001})
        chunks.append(t + 0.0099)
    # steps under the op profiler: slower, and left out
    worker.append({"t": t0 + 5, "tokens": 1, "execute": 1.0, "forward": 1.0, "profiled": True})
    api = [{"t": c - 0.0005, "process_outputs": 0.0002, "from_engine": 0.0004} for c in chunks]
    ops = {
        "forwards": 8,
        "forward_us": 8 * 5000.0,  # profiled forward: 5 ms, 4 of them in ops
        "ops": {
            "aten::linear": {"us": 8 * 2000.0, "self_us": 0, "calls": 8 * 7},
            "vllm::unified_attention_with_output": {"us": 8 * 1000.0, "self_us": 0, "calls": 8},
            "aten::add": {"us": 8 * 1000.0, "self_us": 0, "calls": 8},
        },
    }
    return chunks, engine, worker, api, ops


def test_breakdown_adds_up_to_the_client_latency():
    chunks, engine, worker, api, ops = _synthetic()
    r = overhead.breakdown(chunks, engine, worker, api, ops, {"api": 0.04, "worker": 0.4})
    assert r["itl_ms"] == pytest.approx(10.0)
    assert r["engine_period"] == pytest.approx(10.0)
    assert r["engine_loop"] == pytest.approx(2.0)  # period - worker wait
    assert r["handoffs"] == pytest.approx(1.0)  # wait - execute - sample
    assert r["input_prep"] == pytest.approx(1.0)  # execute - forward - LM head
    assert r["lm_head"] == pytest.approx(1.0) and r["sampling"] == pytest.approx(1.0)
    # the profiled forward's split (2:1:1 of 5 ms, 1 ms outside ops) on the 4 ms forward
    assert r["gemm"] == pytest.approx(1.6)
    assert r["attention"] == pytest.approx(0.8)
    assert r["other_ops"] == pytest.approx(0.8)
    assert r["dispatch"] == pytest.approx(0.8)
    assert r["unaccounted"] == pytest.approx(0.0, abs=1e-9)
    assert r["sum_of_parts"] == pytest.approx(r["itl_ms"])
    assert r["engine_steps"] == 39  # in the client's window: the prefill is out
    assert r["worker_steps"] == 38  # steps with a next one, paired with the worker's
    assert r["process_outputs"] == pytest.approx(0.2)
    assert r["engine_to_api"] == pytest.approx(0.4)
    assert r["cpu_ms_per_token"]["worker"] == pytest.approx(10.0)
    table = overhead.markdown([r | {"label": "m", "mode": "eager", "dtype": "bfloat16"}])
    assert "| m, bfloat16 | eager | 10.00 | 100.0 | 2.00 | 1.00 | 1.00 | 1.60 |" in table


def test_a_slow_api_server_shows_as_unaccounted():
    chunks, engine, worker, api, ops = _synthetic()
    slow = [chunks[0] + 1.5 * (c - chunks[0]) for c in chunks]  # the client gets 15 ms
    r = overhead.breakdown(slow, engine, worker, api, ops)
    assert r["itl_ms"] == pytest.approx(15.0)
    assert r["unaccounted"] > 4.0


def test_breakdown_without_decode_steps_says_so():
    chunks, engine, worker, api, ops = _synthetic()
    with pytest.raises(overhead.BenchError, match="engine core recorded no decode steps"):
        overhead.breakdown(chunks, engine[:1], worker, api, ops)


def test_wrappers_record_one_engine_step(tmp_path, monkeypatch):
    """The engine core's wrappers, on stand-in methods: one record per step, with the
    scheduler's and the worker round trip's times, written to the directory when idle."""
    monkeypatch.setenv(step_profile.SETTING, str(tmp_path))

    class Engine:
        def schedule(self):
            time.sleep(0.002)
            return SimpleNamespace(total_num_scheduled_tokens=1)

        def execute_model(self):
            time.sleep(0.003)

        def sample_tokens(self):
            time.sleep(0.001)

        def step(self):
            self.schedule()
            self.execute_model()
            self.sample_tokens()

    Engine.schedule = step_profile._schedule(Engine.schedule)
    Engine.execute_model = step_profile._execute_start(Engine.execute_model)
    Engine.sample_tokens = step_profile._sample_end(Engine.sample_tokens)
    Engine.step = step_profile._engine_step(Engine.step)
    try:
        Engine().step()
        rec = step_profile.recorder("engine")
        (r,) = rec.records
        assert r["tokens"] == 1
        assert r["step"] >= r["schedule"] + r["worker_wait"] > 0
        assert r["worker_wait"] >= 0.004 and r["schedule"] >= 0.002
        deadline = time.time() + 5
        path = tmp_path / f"engine-{rec.pid}.json"
        while not path.exists() and time.time() < deadline:
            time.sleep(0.05)
        assert json.loads(path.read_text())["records"] == [r]
    finally:
        step_profile._RECORDERS.clear()


def test_setting_off_patches_nothing(monkeypatch):
    """Without VLLM_X86_STEP_PROFILE, apply() imports nothing and replaces nothing."""
    monkeypatch.delenv(step_profile.SETTING, raising=False)
    before = set(sys.modules)
    step_profile.apply()
    assert set(sys.modules) == before
    for module, cls, attr in step_profile.TARGETS:
        original = vars(getattr(importlib.import_module(module), cls))[attr]
        step_profile.apply()
        now = vars(getattr(importlib.import_module(module), cls))[attr]
        assert now is original and not getattr(now, MARK, False), f"{cls}.{attr}"
    assert step_profile.recorder("engine") is None


def test_merged_chunks_count_their_tokens():
    """vLLM merges the tokens of several steps into one SSE chunk when the HTTP side
    falls behind: the latency per token counts tokens, not chunks."""
    chunks, engine, worker, api, ops = _synthetic()
    merged = chunks[::2]  # every chunk carries two tokens
    counts = list(range(1, len(chunks) + 1))[::2]
    r = overhead.breakdown(merged, engine, worker, api, ops, counts=counts)
    assert r["itl_ms"] == pytest.approx(10.0)
    assert r["chunks"] == 20 and r["tokens"] == 39
    wrong = overhead.breakdown(merged, engine, worker, api, ops)
    assert wrong["itl_ms"] == pytest.approx(20.0)  # what counting chunks would say


def test_uneven_steps_still_add_up_step_by_step():
    """On a loaded machine steps vary (here 10 and 30 ms by turns, the last one long):
    each step's parts are taken with its own period, so none goes negative."""
    chunks, engine, worker, api, ops = _synthetic()
    t, shift = engine[1]["t"], 0.0
    for k, (e, w) in enumerate(zip(engine[1:], worker[1:-1])):
        period = 0.010 if k % 2 else 0.030
        e["t"], w["t"] = t + shift, t + shift + 0.0002
        e["worker_wait"] = period - 0.002
        w["execute"], w["forward"] = period - 0.004, period - 0.006
        shift += period
    engine[-1]["worker_wait"] = 0.5  # the last step: no next one, not counted
    chunks = [e["t"] + 0.0099 for e in engine[1:]]
    r = overhead.breakdown(chunks, engine, worker, api, ops)
    assert r["engine_loop"] == pytest.approx(2.0)
    assert r["handoffs"] == pytest.approx(1.0)
    assert r["input_prep"] == pytest.approx(1.0)
    assert r["engine_period"] == pytest.approx(20.0, rel=0.05)
    assert all(r[k] >= 0 for k, _ in overhead.STEP_PARTS if k != "unaccounted")
