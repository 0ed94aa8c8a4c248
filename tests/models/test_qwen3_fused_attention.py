"""Qwen3 attention with the fused split_norm_rope_neox kernel, in a real vLLM engine.

A tiny random-weight Qwen3 checkpoint (built here from transformers' Qwen3Config)
runs through vLLM with the plugin. In eager mode the attention modules switch to the
fused kernel; with vLLM's rotary CustomOp switched off they keep vLLM's own sequence
(split, two RMSNorms, rotary). The fused kernel is bit-identical to that sequence, so
the greedy tokens must be identical, in bf16 as in fp32; and in fp32 both must equal
transformers' greedy tokens.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import HELPERS, PYTHON, clean_env

pytestmark = pytest.mark.slow

NEW_TOKENS = 16


@pytest.fixture(scope="module")
def tiny_qwen3(default_model, tmp_path_factory):
    import shutil

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = tmp_path_factory.mktemp("tiny-qwen3")
    cfg = Qwen3Config(
        vocab_size=49152,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model / f, out / f)
    return out


def run(model_dir, dtype, eager=True, custom_ops=None):
    ids = [[1, 504, 3575, 282, 4649, 314], [1, 9690, 198, 2683, 359]]
    cmd = [
        PYTHON,
        str(HELPERS / "run_llm.py"),
        "--model",
        str(model_dir),
        "--dtype",
        dtype,
        "--prompt-ids",
        json.dumps(ids),
        "--max-tokens",
        str(NEW_TOKENS),
    ]
    if eager:
        cmd.append("--eager")
    if custom_ops:
        cmd += ["--custom-ops", custom_ops]
    p = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=900)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:]) | {"log": p.stdout + p.stderr}, ids
    raise AssertionError(f"vLLM run failed ({p.returncode}):\n{p.stderr[-4000:]}")


def transformers_greedy(model_dir, ids):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    outs = []
    with torch.no_grad():
        for prompt in ids:
            x = torch.tensor([prompt])
            for _ in range(NEW_TOKENS):
                nxt = model(x).logits[0, -1].argmax()
                x = torch.cat([x, nxt.view(1, 1)], dim=1)
            outs.append(x[0, len(prompt) :].tolist())
    return outs


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_fused_attention_equals_vllm_sequence(tiny_qwen3, dtype):
    fused, ids = run(tiny_qwen3, dtype)
    assert "2 Qwen3Attention modules use the fused kernel" in fused["log"]
    unfused, _ = run(tiny_qwen3, dtype, custom_ops="all,-rotary_embedding")
    assert "Qwen3Attention keeps vLLM's code" in unfused["log"]
    assert fused["token_ids"] == unfused["token_ids"]
    if dtype == "float32":
        assert fused["token_ids"] == transformers_greedy(tiny_qwen3, ids)
