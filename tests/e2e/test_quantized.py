"""Quantized models served for real (vLLM's LLM class in a fresh process, eager, bf16).

- A prepacked checkpoint written by `vllm-x86 quantize` gives exactly the tokens of the
  same bf16 model quantized while it loads (`--quantization x86_int8|x86_int4`): same
  quantizer, same packing, same kernels, so any difference is a loading bug.
- A truncated prepacked checkpoint stops the start with a sentence, not garbage.
- Quantized checkpoints stock vLLM CPU serves still serve with the plugin installed:
  an AWQ checkpoint the test writes gives the tokens of its own dequantized weights.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from tests.conftest import HELPERS, PYTHON, clean_env
from tests.helpers import results
from tests.helpers.tiny_family import tiny_family
from vllm_x86.runtime.quant.methods import quant_isa

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        quant_isa() is None,
        reason="the CPU has neither AMX nor AVX-512 VNNI (the x86_int8/int4 kernels)",
    ),
]

PROMPTS = [[1, 504, 3458, 282, 4649, 314, 253, 1024, 2]]  # token ids, tiny-llama's vocabulary
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def tiny(default_model):
    """Random-weight tiny Llama (hidden 256, 4 layers) with the default model's tokenizer."""
    from vllm_x86.tools.bench.synthetic import build

    return build("tiny-llama")


def generate(
    model, *extra, dtype="bfloat16", check=True, env=None, eager=True, prompts=PROMPTS
) -> dict | subprocess.CompletedProcess:
    r = subprocess.run(
        [
            PYTHON,
            str(HELPERS / "run_llm.py"),
            "--model",
            str(model),
            "--dtype",
            dtype,
            *(["--eager"] if eager else []),
            "--prompt-ids",
            json.dumps(prompts),
            "--max-tokens",
            str(NEW_TOKENS),
            *extra,
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(**(env or {})),
    )
    if not check:
        return r
    return results.read(r, with_log=True)


# two requests decoded together (a decode step of two rows), of different lengths
TWO_PROMPTS = PROMPTS + [[1, 2683, 314, 253, 3458, 30]]


MARK = "=== engine "
# Engines one after another in this one fresh process, each engine inside it (no
# engine-core process): one Python + vLLM import and no hand-offs for all of them. Each
# engine sees the environment of the process plus its own settings, nothing left from
# the one before. The prompts go in one generate call, so decode steps have a row per
# prompt; torch's profiler counts the fused calls' runs. A marker line says whose log
# follows.
_ENGINES_RUN = """
import gc, json, os, sys
import torch
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm import LLM, SamplingParams
from vllm.platforms import current_platform
ids, new, mark, engines = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
out = {}
base = dict(os.environ)
for key, model, env, eager, quant, dtype, more in json.loads(engines):
    os.environ.clear()
    os.environ.update({**base, **env})
    print(mark + key, flush=True)
    kw = {"quantization": quant} if quant else {}
    kw.update(more)
    llm = LLM(model, dtype=dtype, enforce_eager=eager, max_model_len=1024, seed=0, **kw)
    sp = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    with torch.profiler.profile() as prof:
        outs = llm.generate([{"prompt_token_ids": x} for x in ids], sp, use_tqdm=False)
    calls = {e.key.split("::")[1]: e.count for e in prof.key_averages()
             if e.key in ("vllm_x86::decode_layer", "vllm_x86::decode_stack")}
    out[key] = {"token_ids": [list(o.outputs[0].token_ids) for o in outs], "calls": calls,
                "platform": type(current_platform).__name__}
    del llm
    gc.collect()
print("RESULT " + json.dumps(out), flush=True)
"""


def run_engines(engines: list, prompts=None) -> dict:
    """{key: {"token_ids", "calls" ({"decode_layer": runs, "decode_stack": runs}), "platform",
    "log"}}
    for engines given as (key, model, settings, eager, quantization: "x86_int4", "x86_int8"
    or None for none or the checkpoint's own[, dtype: bfloat16[, more LLM arguments]]);
    `prompts`: TWO_PROMPTS."""
    specs = [
        [k, str(m), e, eager, q, *(list(d) + ["bfloat16", {}][len(d) :])]
        for k, m, e, eager, q, *d in engines
    ]
    got = results.run(
        [PYTHON, "-c", _ENGINES_RUN, json.dumps(prompts or TWO_PROMPTS), str(NEW_TOKENS), MARK,
         json.dumps(specs)],
        env=clean_env(),
        timeout=900,
        with_log=True,
        merge_output=True,
    )  # fmt: skip
    logs = dict(part.split("\n", 1) for part in got.pop("log").split(MARK)[1:])
    return {k: {**v, "log": logs[k]} for k, v in got.items()}


# INT8 without and INT4 with the LM head quantized: INT4 without it runs the same
# layers as (4, True) but the head, and cost the suite two more engine starts.
@pytest.mark.parametrize("bits,lm_head", [(8, False), (4, True)])
def test_prepacked_equals_quantized_while_loading(tiny, tmp_path, bits, lm_head):
    from vllm_x86.tools.quantize.convert import quantize_checkpoint

    out = tmp_path / f"int{bits}"
    quantize_checkpoint(tiny, out, bits, lm_head=lm_head, progress=None)
    head = {"VLLM_X86_QUANT_LM_HEAD": "1" if lm_head else "0"}
    r = run_engines(
        [("on-the-fly", tiny, head, True, f"x86_int{bits}"), ("prepacked", out, {}, True, None)]
    )
    on_the_fly, prepacked = r["on-the-fly"], r["prepacked"]
    assert prepacked["platform"] == "X86Platform"
    for run in (on_the_fly, prepacked):
        assert ("LM head (49152 x 256) in INT8" in run["log"]) == lm_head
    assert len(prepacked["token_ids"][0]) == NEW_TOKENS
    assert prepacked["token_ids"] == on_the_fly["token_ids"]


def test_input_embedding_read_from_the_file_gives_the_same_tokens(tiny):
    """With its LM head in INT8, nothing computes with the tiny model's (tied) embedding
    table: the engine reads its rows from the checkpoint file (ops/file_embedding.py),
    says so, and gives exactly the tokens of the table held in memory."""
    head = {"VLLM_X86_QUANT_LM_HEAD": "1"}
    r = run_engines(
        [("from-file", tiny, head, True, "x86_int8"),
         ("in-memory", tiny, {**head, "VLLM_X86_FILE_EMBEDDING": "0"}, True, "x86_int8")]
    )  # fmt: skip
    from_file, in_memory = r["from-file"], r["in-memory"]
    assert "model.embed_tokens (49152 x 256, 24 MiB) is read by row from" in from_file["log"]
    assert "is read by row" not in in_memory["log"]
    assert len(from_file["token_ids"][0]) == NEW_TOKENS
    assert from_file["token_ids"] == in_memory["token_ids"]


ON, OFF = {"VLLM_X86_FUSED_DECODE_LAYER": "1"}, {"VLLM_X86_FUSED_DECODE_LAYER": "0"}
Q4 = "x86_int4"


def layer_steps(run: dict, layers: int) -> int:
    """Decode steps of a layer that ran fused: decode_layer's calls, and decode_stack's
    (which runs every layer)."""
    calls = run["calls"]
    return calls.get("decode_layer", 0) + layers * calls.get("decode_stack", 0)


def test_fused_decode_layer_gives_the_same_tokens(tiny):
    """Decode steps of the tiny Llama's INT4 layers in one C++ call each
    (ops/decoder_layer.py): the log says the op table took its 4 layers and the stack,
    every decode step runs them (at least NEW_TOKENS - 1 steps of 4 layers: the first
    token comes from prefill; all 4 in one decode_stack call), and the greedy tokens of two requests decoded together are
    exactly those of the layers' own code, eager. Compiled, prefill runs the same
    compiled graph with the setting on and off (the same first tokens) and decode steps
    run outside it; later tokens of this random model may part where Inductor's rounding
    and the kernels' differ on a near tie, so they are not compared. (INT8 layers: the
    same op with the INT8 GEMM, tests/unit/test_decoder_layer.py.)"""
    r = run_engines(
        [("fused", tiny, ON, True, Q4), ("own", tiny, OFF, True, Q4),
         ("compiled", tiny, ON, False, Q4), ("graph-only", tiny, OFF, False, Q4)]
    )  # fmt: skip
    fused, own, compiled, graph_only = (r[k] for k in ("fused", "own", "compiled", "graph-only"))
    assert "4 LlamaDecoderLayer modules use the fused kernel" in fused["log"]
    assert "1 LlamaModel use the plugin's code" in fused["log"]
    assert "LlamaDecoderLayer keeps vLLM's code: VLLM_X86_FUSED_DECODE_LAYER=0" in own["log"]
    assert "decode steps keep the layer's own code" not in fused["log"]
    assert [len(t) for t in fused["token_ids"]] == [NEW_TOKENS, NEW_TOKENS]
    assert fused["token_ids"] == own["token_ids"]
    # the layers share one KV cache group: each decode step is one decode_stack call
    assert fused["calls"].get("decode_stack", 0) >= NEW_TOKENS - 1, fused["calls"]
    assert layer_steps(fused, 4) >= 4 * (NEW_TOKENS - 1) and not own["calls"]
    assert "1 LlamaModel use the plugin's code" in compiled["log"]
    assert "LlamaModel keeps vLLM's code: VLLM_X86_FUSED_DECODE_LAYER=0" in graph_only["log"]
    assert [len(t) for t in compiled["token_ids"]] == [NEW_TOKENS, NEW_TOKENS]
    assert [t[0] for t in compiled["token_ids"]] == [t[0] for t in graph_only["token_ids"]]
    assert layer_steps(compiled, 4) >= 4 * (NEW_TOKENS - 1) and not graph_only["calls"]


def test_speculative_draft_model_takes_the_fused_decode_call(tiny):
    """A draft model for speculative decoding (vLLM loads it inside its runner's
    load_model) gets the op table's module rows as the model it drafts for: the log says
    so for the draft's 4 layers too, and its one-token draft steps run decode_stack. The
    target's verification steps of 3 tokens a request and the draft's first step of each
    round (4 tokens) run it too (VLLM_X86_FUSED_VERIFICATION): each row attends as a decode step of
    its own, reading the keys and values the rows before it wrote in the same call; with
    the setting 0 only the draft's one-token steps do. The greedy tokens are those of the
    same engine without speculation, either way (the tiny model drafts for itself; one
    request, so the verification's 3 rows keep 16-bit activations like a decode step)."""
    spec = {
        "speculative_config": {
            "method": "draft_model",
            "model": str(tiny),
            "num_speculative_tokens": 2,
            "quantization": Q4,
        }
    }
    no_verify = {**ON, "VLLM_X86_FUSED_VERIFICATION": "0"}
    r = run_engines(
        [("spec", tiny, ON, True, Q4, "bfloat16", spec),
         ("spec-rows-own-code", tiny, no_verify, True, Q4, "bfloat16", spec),
         ("plain", tiny, ON, True, Q4)],
        prompts=PROMPTS,
    )  # fmt: skip
    log = r["spec"]["log"]
    assert "vllm-x86: the speculative draft model (LlamaForCausalLM):" in log, log[-3000:]
    draft_part = log[log.index("the speculative draft model") :]
    assert "4 LlamaDecoderLayer modules use the fused kernel" in draft_part
    assert "4 Attention use the plugin's code" in draft_part
    assert "speculative steps of up to 4 tokens per sequence take the fused decode call" in log
    fused, own = (r[k]["calls"].get("decode_stack", 0) for k in ("spec", "spec-rows-own-code"))
    assert own > 0, r["spec-rows-own-code"]["calls"]
    # every round of 3 tokens adds its verification and the draft's first step (the
    # accepted tokens and the next) to the fused calls
    assert fused >= own + 2 * (NEW_TOKENS // 3 - 1), (fused, own)
    for key in ("spec", "spec-rows-own-code"):
        assert [len(t) for t in r[key]["token_ids"]] == [NEW_TOKENS]
        assert r[key]["token_ids"] == r["plain"]["token_ids"], key


def test_fused_decode_layer_qwen3_and_mistral(default_model, tmp_path):
    """Qwen3's layers (q/k norms: split_norm_rope_neox inside the fused call) and
    Mistral's take the fused decode call too: the op table says so for the layers and the
    stack, every decode step runs it, and two requests decoded together give exactly the
    tokens of the layers' own code (INT4, eager)."""
    families = (("Qwen3ForCausalLM", "Qwen3"), ("MistralForCausalLM", "Mistral"))
    models = {f: tiny_family(arch, tmp_path / arch, default_model) for arch, f in families}
    r = run_engines(
        [
            (f"{f}-{k}", models[f], env, True, Q4)
            for f in models
            for k, env in (("on", ON), ("off", OFF))
        ]
    )
    for f in models:
        on, off = r[f"{f}-on"], r[f"{f}-off"]
        assert f"2 {f}DecoderLayer modules use the fused kernel" in on["log"], on["log"][-3000:]
        assert f"1 {f}Model use the plugin's code" in on["log"]
        assert "decode steps keep the layer's own code" not in on["log"]
        assert f"{f}DecoderLayer keeps vLLM's code: VLLM_X86_FUSED_DECODE_LAYER=0" in off["log"]
        assert [len(t) for t in on["token_ids"]] == [NEW_TOKENS, NEW_TOKENS]
        assert on["token_ids"] == off["token_ids"], f
        assert layer_steps(on, 2) >= 2 * (NEW_TOKENS - 1) and not off["calls"], (on["calls"], f)


def test_bf16_layers_keep_their_own_code(tiny):
    """A bf16 model's layers are not switched (their GEMMs are vLLM's): the op table says
    why."""
    r = generate(tiny, prompts=TWO_PROMPTS)
    assert "LlamaDecoderLayer keeps vLLM's code: self_attn.qkv_proj: bf16" in r["log"]
    assert [len(t) for t in r["token_ids"]] == [NEW_TOKENS, NEW_TOKENS]


def test_kept_4bit_grid_prepacked_equals_quantized_while_loading(tiny, tmp_path):
    """A model already on a 4-bit grid of groups of 32 (a dequantized Q4_1): quantized
    while loading, its Linear layers keep the grid (the log says so once); the
    checkpoint `vllm-x86 quantize` writes of it (int4_grid "all") serves exactly the
    same tokens."""
    from tests.helpers.grid_model import grid_copy
    from vllm_x86.tools.quantize.convert import quantize_checkpoint

    grid = grid_copy(tiny, tmp_path / "grid")
    out = tmp_path / "int4"
    quantize_checkpoint(grid, out, 4, method="rtn", progress=None)
    r = run_engines(
        [("on-the-fly", grid, {}, True, "x86_int4"), ("prepacked", out, {}, True, None)]
    )
    on_the_fly, prepacked = r["on-the-fly"], r["prepacked"]
    assert on_the_fly["log"].count("keeps the 4-bit grid these weights already sit on") == 1
    assert len(prepacked["token_ids"][0]) == NEW_TOKENS
    assert prepacked["token_ids"] == on_the_fly["token_ids"]


def test_cli_int4_default_is_gptq_and_serves(tiny, tmp_path):
    """`vllm-x86 quantize --bits 4` calibrates (GPTQ) by default, says so while it
    works, and its output serves; its codes differ from round-to-nearest ones. With
    `--lm-head int4` the LM head's GPTQ codes go into x86/lm_head.safetensors (format
    version 3, in the manifest), the server packs those (its log says so), and a
    truncated codes file stops the start with a sentence."""
    from safetensors import safe_open

    from vllm_x86.tools.quantize.convert import quantize_checkpoint

    out = tmp_path / "gptq"
    r = subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.cli", "quantize", str(tiny), str(out), "--bits", "4",
         "--lm-head", "int4", "--no-compile"],
        capture_output=True,
        text=True,
        timeout=900,
        # one torch thread: beside the suite's other worker, two threads wait on each
        # other (this run: 66.7 s on two threads, 19.9 s on one, the other core busy)
        env=clean_env(OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "GPTQ: calibrating on" in r.stdout and "serve it with" in r.stdout
    assert "LM head: GPTQ codes (INT4, groups of 128) in x86/lm_head.safetensors" in r.stdout
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg["method"] == "gptq" and cfg["quant_method"] == "x86_int4"
    assert cfg["lm_head"] == 4 and cfg["lm_head_codes"] == "x86/lm_head.safetensors"
    assert cfg["format_version"] == 3
    manifest = json.loads((out / "x86_quant.json").read_text())
    assert "x86/lm_head.safetensors" in manifest["files"] and manifest["format_version"] == 3
    with safe_open(str(out / "x86/lm_head.safetensors"), "pt") as f:
        assert f.get_tensor("qweight").shape == (49152, 128)
    rtn = tmp_path / "rtn"
    quantize_checkpoint(tiny, rtn, 4, method="rtn", progress=None)
    key = "model.layers.0.mlp.down_proj.weight"
    with safe_open(str(out / "model.safetensors"), "pt") as a:
        with safe_open(str(rtn / "model.safetensors"), "pt") as b:
            assert not torch.equal(a.get_tensor(key), b.get_tensor(key))
    served = generate(out)
    assert len(served["token_ids"][0]) == NEW_TOKENS
    assert (
        "LM head (49152 x 256) in INT4 (groups of 128, zero points, the checkpoint's GPTQ "
        "codes)" in served["log"]
    )
    codes = out / "x86/lm_head.safetensors"
    codes.write_bytes(codes.read_bytes()[:-4096])
    r = generate(out, check=False)
    assert r.returncode != 0
    assert "lm_head.safetensors is" in r.stdout + r.stderr and "truncated" in r.stdout + r.stderr


def test_truncated_prepacked_checkpoint_is_refused(tiny, tmp_path):
    from vllm_x86.tools.quantize.convert import quantize_checkpoint

    out = tmp_path / "int8"
    quantize_checkpoint(tiny, out, 8, progress=None)
    f = out / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-4096])
    r = generate(out, check=False)
    assert r.returncode != 0
    assert "truncated" in r.stdout + r.stderr
    assert "RESULT" not in r.stdout


def _write_awq(src, dst, group: int = 128) -> None:
    """An AWQ (GEMM layout, zero points) copy of `src`, and beside it `dst`-dequant: the
    same model with the weights the AWQ codes stand for, in float32."""
    import shutil

    from safetensors.torch import load_file, save_file

    from vllm_x86.runtime.quant import methods as m

    shutil.copytree(src, dst)
    deq_dir = dst.parent / (dst.name + "-dequant")
    shutil.copytree(src, deq_dir)
    w = load_file(str(src / "model.safetensors"))
    awq, deq = {}, {}
    for name, t in w.items():
        if ".layers." in name and name.endswith("_proj.weight"):
            q, scale, zero = m.quantize_int4(t, group, True)
            mod = name[: -len(".weight")]
            awq[mod + ".qweight"] = m._awq_pack(q.t().contiguous())
            awq[mod + ".qzeros"] = m._awq_pack(zero)
            awq[mod + ".scales"] = scale.to(torch.float16)
            deq[name] = m.dequantize_int4(q, scale.to(torch.float16), zero, group)
        else:
            awq[name] = t
            deq[name] = t.float()
    save_file(awq, str(dst / "model.safetensors"))
    save_file(deq, str(deq_dir / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    (deq_dir / "config.json").write_text(json.dumps(cfg))
    cfg["quantization_config"] = {
        "quant_method": "awq",
        "bits": 4,
        "group_size": group,
        "zero_point": True,
        "version": "gemm",
    }
    (dst / "config.json").write_text(json.dumps(cfg))


def test_awq_checkpoint_still_serves(tiny, tmp_path):
    awq = tmp_path / "awq"
    _write_awq(tiny, awq)
    r = run_engines(
        [("awq", awq, {}, True, None, "float16"),
         ("dequantized", tmp_path / "awq-dequant", {}, True, None, "float16")]
    )  # fmt: skip
    got, want = r["awq"], r["dequantized"]
    assert got["platform"] == "X86Platform"
    assert got["token_ids"][0][:8] == want["token_ids"][0][:8]
