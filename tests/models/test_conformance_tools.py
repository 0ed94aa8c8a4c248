"""The conformance suite's own parts, without vLLM engines: the architecture table, the
tiny-config shrink, the verdict rules and the matrix rendering. Fast."""

from __future__ import annotations

import json

import pytest

from vllm_x86.tools.conformance import conformance as conf
from vllm_x86.tools.conformance import formats, matrix, tiny
from vllm_x86.tools.conformance.archs import ARCHS, BY_NAME, MODES


def test_table_names_are_unique_and_known_to_vllm_and_transformers():
    import transformers
    from vllm.model_executor.models.registry import _TEXT_GENERATION_MODELS

    names = [a.name for a in ARCHS]
    assert len(names) == len(set(names))
    assert len(names) >= 60
    for a in ARCHS:
        assert a.name in _TEXT_GENERATION_MODELS, a.name
        assert hasattr(transformers, a.name), a.name
        assert a.examples, a.name
        for key in a.known:
            mode, _, cpu = key.partition("@")
            assert mode in (*MODES, "*") and cpu in ("", "amx", "no-amx"), (a.name, key)


def test_table_covers_every_shared_architecture():
    """A new vLLM or transformers release that adds a shared architecture makes this
    fail until the table has a row for it."""
    import transformers
    from vllm.model_executor.models.registry import _TEXT_GENERATION_MODELS

    shared = {n for n in _TEXT_GENERATION_MODELS if hasattr(transformers, n)}
    assert shared - set(BY_NAME) == set()


def test_shrink_keeps_features_and_fits_special_ids():
    defaults = {
        "vocab_size": 151936,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": None,
        "n_shared_experts": 0,
        "num_shared_experts": 2,
        "sliding_window": None,
        "pad_token_id": 151643,
        "eos_token_id": [151643, 151645],
        "layer_types": ["full_attention"] * 32,
    }
    kw = tiny.shrink_kwargs(defaults, {"hidden_size": 256})
    assert kw["vocab_size"] == 512 and kw["hidden_size"] == 256
    assert kw["num_key_value_heads"] == 2  # GQA kept explicit
    assert "n_shared_experts" not in kw  # off stays off
    assert kw["num_shared_experts"] == 1  # on stays on
    assert "sliding_window" not in kw  # no window invented
    assert kw["pad_token_id"] == 0 and kw["eos_token_id"] == [2]
    assert "layer_types" not in kw  # per-layer lists are rebuilt by the config class


def test_prompt_is_fixed_and_inside_the_vocabulary():
    p = tiny.prompt_ids(512)
    assert p == tiny.prompt_ids(512) and len(p) == tiny.PROMPT_LEN
    assert all(3 <= t < 512 for t in p)


def _prep(tokens32, gaps, tokens16=None, lp=-1.0, lp16=-1.0):
    n = len(tokens32)

    def ref(tokens, v):
        return {
            "tokens": tokens,
            "prompt_logprobs": [v] * 5,
            "logprobs": [v] * n,
            "gaps": gaps,
            "top_ids": [[t, 99] for t in tokens],
            "top_vals": [[5.0, 5.0 - g] for g in gaps],
        }

    return conf.Prepared(
        "X",
        "/x",
        [1] * 6,
        {"float32": ref(tokens32, lp), "bfloat16": ref(tokens16 or tokens32, lp16)},
    )


def _res(tokens, lp=-1.0):
    return {
        "ok": True,
        "tokens": tokens,
        "prompt_logprobs": [lp] * 5,
        "logprobs": [lp] * len(tokens),
    }


def test_fp32_verdict_needs_every_token_and_close_logprobs():
    prep = _prep([1, 2, 3, 4], [1.0] * 4)
    assert conf.judge(prep, "fp32-eager", _res([1, 2, 3, 4])).ok
    v = conf.judge(prep, "fp32-eager", _res([1, 2, 9, 4]))
    assert not v.ok and "greedy token 2" in v.reason
    v = conf.judge(prep, "fp32-eager", _res([1, 2, 3, 4], lp=-1.0 + 3 * conf.FP32_LOGPROB_TOL))
    assert not v.ok and "logprob error" in v.reason


def test_bf16_verdict_allows_parting_only_at_a_near_tie():
    # transformers bf16 has no error here, so the tolerance is the floor
    tie = conf.BF16_LOGPROB_FLOOR / 2
    prep = _prep([1, 2, 3, 4], [1.0, 1.0, tie, 1.0])
    assert conf.judge(prep, "bf16-eager", _res([1, 2, 99, 7])).ok  # 99 is the runner-up
    v = conf.judge(prep, "bf16-eager", _res([1, 99, 3, 4]))  # runner-up, but 1.0 behind
    assert not v.ok and "below fp32's best logit" in v.reason
    v = conf.judge(prep, "bf16-eager", _res([1, 2, 7, 4]))  # not among fp32's best at all
    assert not v.ok and "not among" in v.reason
    # equal to transformers' own bf16 answer: fine even where fp32 is decisive
    prep = _prep([1, 2, 3, 4], [1.0] * 4, tokens16=[1, 5, 5, 5])
    assert conf.judge(prep, "bf16-compiled", _res([1, 5, 5, 5])).ok


def test_bf16_verdict_allows_leaving_transformers_bf16_at_its_near_tie():
    """bf16 rounding moved transformers' bf16 and vLLM alike away from fp32's token 1;
    vLLM then leaves the bf16 tokens at step 3: a pass only where that is a near tie of
    the bf16 reference (99 is its runner-up there)."""
    tie = conf.BF16_LOGPROB_FLOOR / 2
    prep = _prep([1, 2, 3, 4], [1.0, 1.0, 1.0, tie], tokens16=[1, 5, 6, 7])
    v = conf.judge(prep, "bf16-compiled", _res([1, 5, 6, 99]))
    assert v.ok and v.metrics["bf16_parted_at"] == 3, v.reason
    prep = _prep([1, 2, 3, 4], [1.0] * 4, tokens16=[1, 5, 6, 7])  # decisive in bf16 too
    v = conf.judge(prep, "bf16-compiled", _res([1, 5, 6, 99]))
    assert not v.ok and "bf16 transformers parts at 3, where vLLM's token is 1 below" in v.reason
    v = conf.judge(prep, "bf16-compiled", _res([1, 5, 6, 8]))  # not among bf16's best
    assert not v.ok and "not among bf16's 8 best" in v.reason


def test_bf16_logprob_tolerance_scales_with_transformers_bf16_error():
    prep = _prep([1, 2], [1.0, 1.0], lp=-1.0, lp16=-1.2)  # transformers bf16 off by 0.2
    tol = conf.BF16_ERR_FACTOR * 0.2 + conf.BF16_LOGPROB_FLOOR
    assert conf.judge(prep, "bf16-eager", _res([1, 2], lp=-1.0 - tol * 0.9)).ok
    assert not conf.judge(prep, "bf16-eager", _res([1, 2], lp=-1.0 - tol * 1.1)).ok


def test_a_failed_run_is_a_failure_with_the_error():
    v = conf.judge(_prep([1], [1.0]), "fp32-eager", {"ok": False, "error": "Boom: no kernel"})
    assert not v.ok and "Boom: no kernel" in v.reason


def test_matrix_renders_counts_and_reasons(tmp_path):
    data = {
        "meta": {"tolerances": {"new_tokens": 16}, "versions": {}, "runs": []},
        "archs": {
            "LlamaForCausalLM": {
                "examples": ["meta-llama/Llama-3.1-8B-Instruct"],
                "features": "GQA",
                "modes": {m: {"status": "pass", "reason": "", "metrics": {}} for m in MODES},
            },
            "ExampleForCausalLM": {
                "examples": ["example/model"],
                "features": "SSM",
                "modes": {
                    "fp32-eager": {"status": "xfail", "reason": "no CPU selective scan"},
                    "bf16-eager": {"status": "pass", "reason": ""},
                },
            },
        },
    }
    md = matrix.render(data)
    assert "**1 of 2 architectures pass in fp32 eager, 2 in bf16 eager.**" in md
    assert "1 of 1 run pass with `--quantization x86_int8`, 1 of 1 with `x86_int4`" in md
    assert "| INT8 eager | INT4 eager |" in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| `LlamaForCausalLM`"))
    assert row.count("| pass ") == len(MODES)
    assert "no CPU selective scan" in md
    assert "`meta-llama/Llama-3.1-8B-Instruct`" in md
    # a failure the table explains shows the table's reason
    data["archs"]["MambaForCausalLM"] = {
        "examples": [],
        "modes": {"fp32-eager": {"status": "fail", "reason": "vLLM: AttributeError: x"}},
    }
    assert "selective scan" in matrix.render(data)
    del data["archs"]["MambaForCausalLM"]
    c = matrix.counts(data)
    assert c["all_modes"] == 1 and c["bf16-eager"] == 2
    (tmp_path / "r.json").write_text(json.dumps(data))
    out = matrix.write(tmp_path / "r.json", docs=tmp_path)
    assert out.read_text() == md
    assert json.loads((tmp_path / "supported_models.json").read_text()) == data


@pytest.mark.parametrize("mode", MODES)
def test_mode_names_parse(mode):
    dtype, eager = conf.mode_parts(mode)
    assert dtype in ("float32", "bfloat16") and eager == mode.endswith("eager")
    quant = conf.mode_quant(mode)
    assert quant == {"int8": "x86_int8", "int4": "x86_int4"}.get(mode.split("-")[0], "")
    assert quant == "" or dtype == "bfloat16"  # weight-only: bf16 activations


def test_quant_job_asks_for_the_method_and_keeps_the_rows_engine_args():
    prep = conf.Prepared("X", "/x", [1, 2])
    job = conf.make_job(prep, "int4-eager", {"block_size": 32})
    assert job["engine_args"] == {"block_size": 32, "quantization": "x86_int4"}
    assert job["dtype"] == "bfloat16" and job["eager"]
    assert "quantization" not in conf.make_job(prep, "bf16-eager", {})["engine_args"]


def test_quant_verdict_is_against_the_fake_quantized_references():
    """int8/int4 judge by the bf16 rule against the fake-quantized references; the plain
    ones only give the unquantized_lp_err metric."""
    plain = _prep([1, 2], [1.0, 1.0], lp=-1.0, lp16=-1.0)
    fq = _prep([1, 2], [1.0, 1.0], lp=-2.0, lp16=-2.0)
    prep = conf.Prepared("X", "/x", [1] * 6, dict(plain.refs))
    prep.refs.update({conf.ref_key(d, "x86_int8"): r for d, r in fq.refs.items()})
    prep.plans["x86_int8"] = {"weights": 1000, "tensors": 4}

    def res(lp, weights=1000):
        return {**_res([1, 2], lp=lp), "quantized": {"weights": weights, "layers": 2}}

    v = conf.judge(prep, "int8-eager", res(-2.0))
    assert v.ok and v.metrics["unquantized_lp_err"] == pytest.approx(1.0)
    v = conf.judge(prep, "int8-eager", res(-1.0))  # unquantized answer
    assert not v.ok and "prompt logprob error 1 >" in v.reason
    assert "fake-x86_int8" in v.reason
    # the same values, but vLLM quantized other weights than the rule says
    v = conf.judge(prep, "int8-eager", res(-2.0, weights=600))
    assert not v.ok and "vLLM runs 600 weights in 2 layers" in v.reason
    assert "the reference quantizes 1000 in 4 tensors" in v.reason
    assert not conf.judge(prep, "int8-eager", _res([1, 2], lp=-2.0)).ok  # no count
    assert not conf.judge(prep, "int4-eager", res(-2.0)).ok  # no int4 reference
    prep.ref_errors[conf.ref_key("bfloat16", "x86_int8")] = "the reference fails: X"
    v = conf.judge(prep, "int8-eager", res(-2.0))
    assert not v.ok and "the reference fails" in v.reason


def test_quantize_plan_counts_what_the_reference_quantizes(tmp_path):
    from transformers import Qwen3Config

    cfg = Qwen3Config(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=512,
    )
    cfg.architectures = ["Qwen3ForCausalLM"]
    cfg.save_pretrained(str(tmp_path))
    per_layer = 128 * 128 + 2 * 64 * 128 + 128 * 128 + 3 * 256 * 128  # q k v o, MLP
    for quant in ("x86_int8", "x86_int4"):
        assert conf.quantize_plan(tmp_path, quant) == {"weights": 2 * per_layer, "tensors": 14}


def test_cpu_specific_known_failure_applies_on_its_cpus_only(monkeypatch):
    from vllm_x86.tools.conformance import archs

    a = archs.Arch("X", ("x/x",), known={"int4-eager@no-amx": "tie here", "fp32-eager": "all"})
    monkeypatch.setattr(archs, "cpu_tag", lambda: "no-amx")
    assert archs.known_failure(a, "int4-eager") == "tie here"
    assert archs.known_failure(a, "fp32-eager") == "all"
    monkeypatch.setattr(archs, "cpu_tag", lambda: "amx")
    assert archs.known_failure(a, "int4-eager") is None
    assert archs.known_failure(a, "fp32-eager") == "all"


def test_quant_modes_of_an_architecture_failing_bf16_are_not_run():
    from vllm_x86.tools.conformance.archs import QUANT_CI_ARCHS, QUANT_MODES, not_run_reason

    for a in ARCHS:
        bf16 = a.known.get("bf16-eager") or a.known.get("*")
        for mode in QUANT_MODES:
            why = not_run_reason(a, mode)
            if a.skip:
                assert why == a.skip
            elif bf16:
                assert why and bf16 in why, a.name
            else:
                assert why is None, a.name
        assert not_run_reason(a, "bf16-eager") == (a.skip or None)
    for name in QUANT_CI_ARCHS:  # the CI's few all run quantized
        assert not_run_reason(BY_NAME[name], "int8-eager") is None


def test_bf16_ci_archs_are_rows_that_pass_bf16():
    """Each of the default run's bf16 rows holds its op path to a verdict: a row of the
    table, run, and not marked failing in bf16 (an xfail would check nothing)."""
    from vllm_x86.tools.conformance.archs import BF16_CI_ARCHS

    assert len(BF16_CI_ARCHS) == len(set(BF16_CI_ARCHS))
    for name in BF16_CI_ARCHS:
        a = BY_NAME[name]
        assert not a.skip, name
        assert not [k for k in a.known if k == "*" or k.startswith("bf16-eager")], name


def _pytest_config(modes: str = "", arch: tuple[str, ...] = ()):
    from types import SimpleNamespace

    opts = {"--modes": modes, "--arch": list(arch)}
    return SimpleNamespace(getoption=opts.__getitem__)


def test_default_run_restricts_bf16_and_quantized_modes_to_the_ci_rows():
    from tests.models.conftest import conformance_mode_archs, conformance_modes
    from vllm_x86.tools.conformance.archs import BF16_CI_ARCHS, QUANT_CI_ARCHS

    only = conformance_mode_archs(_pytest_config())
    assert "fp32-eager" not in only  # every architecture
    assert only["bf16-eager"] == set(BF16_CI_ARCHS)
    assert only["int8-eager"] == only["int4-eager"] == set(QUANT_CI_ARCHS)
    assert set(conformance_modes(_pytest_config())) == {
        "fp32-eager", "bf16-eager", "int8-eager", "int4-eager"
    }  # fmt: skip
    # modes named, or architectures named: no restriction
    assert conformance_mode_archs(_pytest_config(modes="fp32-eager,bf16-eager")) == {}
    assert conformance_mode_archs(_pytest_config(arch=("GemmaForCausalLM",))) == {}


def test_prepare_builds_the_plain_bf16_reference_only_for_a_plain_bf16_mode(monkeypatch):
    asked: list[tuple[str, str]] = []
    monkeypatch.setattr(tiny, "build", lambda *a, **k: "/tiny")
    monkeypatch.setattr(tiny, "prompt_ids", lambda *a, **k: [1, 2, 3])
    monkeypatch.setattr(
        tiny,
        "cached_reference",
        lambda model_dir, dtype, prompt, n, cache_dir=None, quant="": asked.append((quant, dtype))
        or {},
    )
    monkeypatch.setattr(conf, "quantize_plan", lambda *a: {})

    def refs(modes):
        asked.clear()
        prep = conf.prepare(BY_NAME["LlamaForCausalLM"], modes=modes)
        assert prep.error is None and not prep.ref_errors
        return sorted(asked)

    assert refs(("fp32-eager",)) == [("", "float32")]
    assert refs(("fp32-eager", "int8-eager")) == [
        ("", "float32"), ("x86_int8", "bfloat16"), ("x86_int8", "float32")
    ]  # fmt: skip
    assert refs(("fp32-eager", "bf16-eager")) == [("", "bfloat16"), ("", "float32")]
    assert refs(("bf16-compiled",)) == [("", "bfloat16"), ("", "float32")]
    assert refs(()) == [("", "bfloat16"), ("", "float32")]  # callers that name no mode


def test_check_shrinks_a_users_config_and_keeps_its_features(tmp_path):
    from transformers import Qwen3Config

    from vllm_x86.tools.conformance.check import read_config, stage_architecture, tiny_copy

    cfg = Qwen3Config(
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    cfg.architectures = ["Qwen3ForCausalLM"]
    cfg.save_pretrained(tmp_path)
    ok, lines, arch = stage_architecture(read_config(tmp_path))
    assert ok and arch == "Qwen3ForCausalLM"
    small, gain = tiny_copy(tmp_path, arch)
    assert small.hidden_size == 128 and small.num_hidden_layers == 2 and small.vocab_size == 512
    assert small.num_attention_heads // small.num_key_value_heads == 2  # still GQA
    assert small.tie_word_embeddings  # the user's choice survives
    assert small.rope_parameters["rope_theta"] == 1000000.0
    assert gain == tiny.LAYER_GAIN


def test_check_refuses_an_unknown_architecture():
    from vllm_x86.tools.conformance.check import stage_architecture

    ok, lines, _ = stage_architecture({"architectures": ["NoSuchModelForCausalLM"]})
    assert not ok and "does not know" in " ".join(lines)


def test_every_hub_format_names_a_rewrite():
    from vllm_x86.tools.conformance import formats

    for a in ARCHS:
        if a.hub_format:
            assert a.hub_format in formats.REWRITES, a.name


def test_hub_format_is_part_of_the_cache_key_only_where_used():
    cfg = tiny.tiny_config("LlamaForCausalLM")
    plain = tiny.config_hash(cfg)
    assert tiny.config_hash(cfg, tiny.LAYER_GAIN, "") == plain
    assert tiny.config_hash(cfg, tiny.LAYER_GAIN, "lfm2") != plain


def test_module_names_start_is_part_of_the_cache_key(monkeypatch):
    """A rewrite starting from the modules' weight names writes another checkpoint than
    the same code starting from transformers' original format."""
    from vllm_x86.tools.conformance import formats

    cfg = tiny.tiny_config("LlamaForCausalLM")
    assert not formats.save_original_format("olmo_hybrid")
    assert formats.save_original_format("lfm2")
    before = tiny.config_hash(cfg, tiny.LAYER_GAIN, "lfm2")
    monkeypatch.setattr(formats, "FROM_MODULE_NAMES", formats.FROM_MODULE_NAMES | {"lfm2"})
    assert tiny.config_hash(cfg, tiny.LAYER_GAIN, "lfm2") != before


def _rewritten(tmp_path, name: str):
    """The rewrite `name` applied to the tiny config of the row using it (config only)."""
    import torch
    from safetensors.torch import save_file

    from vllm_x86.tools.conformance import formats

    row = next(a for a in ARCHS if a.hub_format == name)
    cfg = tiny.tiny_config(row.name, row.extra)
    cfg.save_pretrained(str(tmp_path))
    save_file({"w": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    formats.rewrite(name, tmp_path)
    return cfg, json.loads((tmp_path / "config.json").read_text())


@pytest.mark.parametrize("name", sorted(formats.REWRITES))
def test_hub_format_keeps_what_transformers_reads(tmp_path, name):
    """transformers reads the rewritten config.json as the config it saved: every field
    the rewrite leaves alone (layer types, widths, rope) reads back the same."""
    import transformers

    cfg, d = _rewritten(tmp_path, name)
    saved = cfg.to_dict()
    again = transformers.AutoConfig.from_pretrained(str(tmp_path)).to_dict()
    skip = {"transformers_version", "dtype", "_name_or_path"}
    skip |= {k for k in d if d[k] != saved.get(k, object())}  # what the rewrite wrote
    assert {k: again[k] for k in saved if k not in skip} == {
        k: v for k, v in saved.items() if k not in skip
    }


def test_mimo_v2_flash_hub_fields(tmp_path):
    cfg, d = _rewritten(tmp_path, "mimo_v2_flash")
    assert d["hybrid_layer_pattern"] == [int(t == "sliding_attention") for t in cfg.layer_types]
    assert d["moe_layer_freq"] == [int(t == "sparse") for t in cfg.mlp_layer_types]
    assert d["swa_num_key_value_heads"] == 2 * cfg.num_key_value_heads  # as transformers
    assert d["swa_v_head_dim"] == cfg.v_head_dim and d["swa_head_dim"] == cfg.head_dim
    assert d["sliding_window_size"] == cfg.sliding_window
    assert d["add_swa_attention_sink_bias"] and not d["add_full_attention_sink_bias"]
    assert d["swa_rope_theta"] == cfg.rope_parameters["sliding_attention"]["rope_theta"]
    assert d["rope_theta"] == cfg.rope_parameters["full_attention"]["rope_theta"]


def test_lfm2_hub_fields(tmp_path):
    cfg, d = _rewritten(tmp_path, "lfm2")
    assert d["block_dim"] == d["conv_dim"] == d["conv_dim_out"] == cfg.hidden_size
    assert d["full_attn_idxs"] == [1]


def test_deepseek_v4_hub_layout(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    from vllm_x86.tools.conformance import formats

    cfg = tiny.tiny_config("DeepseekV4ForCausalLM", BY_NAME["DeepseekV4ForCausalLM"].extra)
    cfg.save_pretrained(str(tmp_path))
    names = [
        "model.embed_tokens.weight",
        "model.norm.weight",
        "model.hc_head.hc_fn",
        "model.layers.0.attn.norm.weight",
        "model.layers.0.attn.compressor.norm.weight",
        "head.weight",
    ]
    save_file({n: torch.zeros(1) for n in names}, str(tmp_path / "model.safetensors"))
    formats.rewrite("deepseek_v4", tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    assert "layer_types" not in d and "mlp_layer_types" not in d
    assert d["num_hash_layers"] == cfg.mlp_layer_types.count("hash_moe")
    rate = {"heavily_compressed_attention": 128, "compressed_sparse_attention": 4}
    assert d["compress_ratios"] == [rate[t] for t in cfg.layer_types]
    assert sorted(load_file(str(tmp_path / "model.safetensors"))) == sorted(
        [
            "embed.weight",
            "norm.weight",
            "hc_head_fn",
            "layers.0.attn.kv_norm.weight",
            "layers.0.attn.compressor.norm.weight",
            "head.weight",
        ]
    )


def test_olmo_hybrid_tiny_checkpoint_has_the_released_layout(tmp_path):
    """q/k/v convolutions split at the key and value widths (not in three equal parts),
    the module's norm names, and transformers loads it back to the same weights."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    arch = BY_NAME["OlmoHybridForCausalLM"]
    cfg = tiny.tiny_config(arch.name, arch.extra)
    key_dim = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    value_dim = cfg.linear_num_value_heads * cfg.linear_value_head_dim
    assert key_dim != value_dim  # the case transformers' own save gets wrong
    assert arch.hub_format == "olmo_hybrid"
    path = tiny.build(arch.name, cfg, root=tmp_path, gain=arch.gain, hub_format=arch.hub_format)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        shapes = {k: f.get_slice(k).get_shape()[0] for k in keys if "layers.0." in k}
    assert shapes["model.layers.0.linear_attn.q_conv1d.weight"] == key_dim
    assert shapes["model.layers.0.linear_attn.k_conv1d.weight"] == key_dim
    assert shapes["model.layers.0.linear_attn.v_conv1d.weight"] == value_dim
    assert "model.layers.0.input_layernorm.weight" in keys
    assert not any(
        "attention_layer_norm" in k or ".conv1d.weight" in k.replace("_conv1d", "") for k in keys
    )
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    ref = tiny.model_class(arch.name)._from_config(cfg, dtype=torch.float32)
    assert set(model.state_dict()) == set(ref.state_dict())
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        q = f.get_tensor("model.layers.0.linear_attn.q_conv1d.weight")
        v = f.get_tensor("model.layers.0.linear_attn.v_conv1d.weight")
    conv = model.state_dict()["model.layers.0.linear_attn.conv1d.weight"]
    assert torch.equal(conv[:key_dim], q) and torch.equal(conv[2 * key_dim :], v)


@pytest.mark.slow  # a fresh interpreter importing vLLM (~10 s here)
def test_prefix_lm_reference_makes_the_prompt_one_bidirectional_block(tmp_path):
    """HRM-Text (config prefix_lm: true): vLLM makes every prompt one bidirectional
    block, transformers does when given token_type_ids; the reference gives them, so
    the prompt sees itself whole and the continuation stays causal."""
    arch = BY_NAME["HrmTextForCausalLM"]
    cfg = tiny.tiny_config(arch.name, arch.extra)
    path = tiny.build(arch.name, cfg, root=tmp_path, gain=arch.gain)
    assert tiny.prompt_is_prefix(path)
    model = tiny._load(path, "float32")
    prompt, cont = tiny.prompt_ids(cfg.vocab_size)[:6], [5, 6, 7]
    ref = tiny.teacher_forced(model, prompt, cont, prefix=True)
    causal = tiny.teacher_forced(model, prompt, cont)
    assert abs(ref["prompt_logprobs"][0] - causal["prompt_logprobs"][0]) > 1e-3
    # a later prompt token changes an earlier one's log-prob (bidirectional) ...
    other = tiny.teacher_forced(model, prompt[:-1] + [prompt[-1] + 1], cont, prefix=True)
    assert abs(other["prompt_logprobs"][0] - ref["prompt_logprobs"][0]) > 1e-6
    # ... a later continuation token does not change an earlier one's (causal)
    later = tiny.teacher_forced(model, prompt, [5, 6, 8], prefix=True)
    assert later["logprobs"][:2] == pytest.approx(ref["logprobs"][:2], abs=1e-6)


def test_other_checkpoints_are_causal_references(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert not tiny.prompt_is_prefix(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"prefix_lm": False}))
    assert not tiny.prompt_is_prefix(tmp_path)


def test_matrix_names_the_architectures_that_quantize_nothing():
    def row(ref_weights):
        e = {
            "status": "pass",
            "reason": "",
            "metrics": {"reference_quantized_weights": ref_weights},
        }
        return {"examples": [], "modes": {"int8-eager": e, "int4-eager": dict(e)}}

    data = {
        "meta": {},
        "archs": {"MambaForCausalLM": row(0), "LlamaForCausalLM": row(1 << 16)},
    }
    assert matrix.unquantized(data) == ["MambaForCausalLM"]
    assert "In `MambaForCausalLM` no weight is quantized on either side" in matrix.render(data)
    data["archs"]["MambaForCausalLM"] = row(4096)
    assert "no weight is quantized on either side" not in matrix.render(data)


def test_check_records_its_verdict_for_these_weights_only(tmp_path, monkeypatch):
    """`vllm-x86 check` writes its verdict beside the references; read_verdict gives it
    back while the checkpoint is unchanged, and None for a changed or unchecked one."""
    from vllm_x86.tools.conformance import check

    monkeypatch.setenv("VLLM_X86_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    assert check.read_verdict(model) is None
    code = check._summary({s: "ok" for s in check.STAGES}, model, tiny=False, compiled=False)
    assert code == 0
    got = check.read_verdict(model)
    assert got["passed"] is True and got["stages"]["parity"] == "ok"
    assert got["model"] == str(model.resolve())
    assert check.verdict_path(model).is_relative_to(tmp_path / "cache")
    # a failed stage is recorded as not passed
    assert check._summary({"architecture": "ok", "ops": "FAIL"}, model) == 1
    got = check.read_verdict(model)
    assert got["passed"] is False and got["stages"]["ops"] == "FAIL"
    assert got["stages"]["speed"] == "not run"
    # other weights: the verdict is not theirs
    (model / "model.safetensors").write_bytes(b"\1" * 65)
    assert check.read_verdict(model) is None
