"""A Hugging Face model directory as a GGUF file, so that llama.cpp runs the same weights.

Covers the architectures the harness benchmarks: Llama (``LlamaForCausalLM``: SmolLM2,
Llama 3.x) and Qwen3 (``Qwen3ForCausalLM``), with byte-level BPE tokenizers
(``tokenizer.json``). It does what llama.cpp's own ``convert_hf_to_gguf.py`` does for
these two, with the ``gguf`` package (already a dependency of ``pull``):

- tensor names ``model.layers.N.*`` -> ``blk.N.*``;
- for ``llama`` only, q/k projection rows are permuted back from the Hugging Face
  rotary layout to llama.cpp's (Qwen3 uses the NeoX layout, as Hugging Face does);
- matrices are stored in the dtype the benchmark runs in (BF16 for bfloat16, F32 for
  float32), so llama.cpp reads as many weight bytes per token as vLLM does; norms in F32;
- Llama 3 RoPE scaling becomes the ``rope_freqs`` tensor llama.cpp expects;
- the vocabulary, merges and token types come from ``tokenizer.json``, with
  llama.cpp's pre-tokenizer name for the model family.

The file is cached under ``VLLM_X86_CACHE_DIR/bench/gguf`` by model and dtype.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from vllm_x86.runtime import envs
from vllm_x86.tools.bench.contenders import BenchError

ARCHS = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3"}

LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_MAP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def _say(msg: str) -> None:
    print(f"[vllm-x86 bench] {msg}", file=sys.stderr, flush=True)


def gguf_name(hf_name: str) -> str:
    if hf_name in TOP_MAP:
        return TOP_MAP[hf_name]
    parts = hf_name.split(".")
    if parts[:2] == ["model", "layers"] and len(parts) > 3:
        rest = ".".join(parts[3:])
        if rest in LAYER_MAP:
            return f"blk.{parts[2]}.{LAYER_MAP[rest]}"
    raise BenchError(f"no GGUF name for tensor {hf_name}")


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Hugging Face's rotary row order -> llama.cpp's, as convert_hf_to_gguf.py does."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def llama3_rope_factors(cfg: dict, head_dim: int, base: float) -> np.ndarray | None:
    rs = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rs.get("rope_type") != "llama3":
        return None
    factor = rs.get("factor", 8.0)
    low, high = rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old_ctx = rs.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / (base ** (i / head_dim))
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _rope_theta(cfg: dict) -> float:
    rp = cfg.get("rope_parameters") or {}
    return float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def _pre_tokenizer(arch: str, cfg: dict, tok: dict) -> str:
    if arch == "qwen3":
        return "qwen2"
    if cfg.get("vocab_size", 0) >= 128000:
        return "llama-bpe"  # Llama 3
    if cfg.get("vocab_size") == 49152:
        return "smollm"
    return "gpt2"


def _vocab(model_dir: Path, vocab_size: int):
    import gguf

    tok = json.loads((model_dir / "tokenizer.json").read_text())
    if tok["model"]["type"] != "BPE":
        raise BenchError(f"only BPE tokenizers can be exported, not {tok['model']['type']}")
    by_id: dict[int, tuple[str, int]] = {
        i: (t, gguf.TokenType.NORMAL) for t, i in tok["model"]["vocab"].items()
    }
    for a in tok.get("added_tokens", []):
        kind = gguf.TokenType.CONTROL if a.get("special") else gguf.TokenType.USER_DEFINED
        by_id[a["id"]] = (a["content"], kind)
    tokens, types = [], []
    for i in range(vocab_size):
        t, k = by_id.get(i, (f"[PAD{i}]", gguf.TokenType.UNUSED))
        tokens.append(t)
        types.append(k)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    return tok, tokens, types, merges


def _special_ids(model_dir: Path, cfg: dict) -> dict[str, int | bool | None]:
    tc_path = model_dir / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text()) if tc_path.is_file() else {}
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    ids = {a["content"]: a["id"] for a in tok.get("added_tokens", [])}
    ids.update(tok["model"]["vocab"])

    def tid(v):
        if isinstance(v, dict):
            v = v.get("content")
        return ids.get(v) if isinstance(v, str) else None

    eos = cfg.get("eos_token_id")
    return {
        "bos": tid(tc.get("bos_token")) if tc.get("bos_token") else cfg.get("bos_token_id"),
        "eos": eos[0] if isinstance(eos, list) else eos,
        "pad": tid(tc.get("pad_token")),
        "add_bos": bool(tc.get("add_bos_token", cfg.get("vocab_size", 0) >= 128000)),
    }


def export(model_dir: str | Path, out_path: str | Path, dtype: str = "bfloat16") -> Path:
    """Write `model_dir` as a GGUF file at `out_path` (weights in `dtype`)."""
    import gguf
    import torch
    from safetensors import safe_open

    model_dir, out_path = Path(model_dir), Path(out_path)
    cfg = json.loads((model_dir / "config.json").read_text())
    arch_name = (cfg.get("architectures") or ["?"])[0]
    if arch_name not in ARCHS:
        raise BenchError(
            f"llama.cpp export supports {', '.join(ARCHS)}, not {arch_name}; pass a GGUF "
            "file with --gguf"
        )
    if not (model_dir / "tokenizer.json").is_file():
        raise BenchError(f"{model_dir} has no tokenizer.json to export")
    arch = ARCHS[arch_name]
    if dtype not in ("bfloat16", "float32"):
        raise BenchError(f"GGUF export supports bfloat16 and float32, not {dtype}")
    mat_type = gguf.GGMLQuantizationType.BF16 if dtype == "bfloat16" else None
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    hidden = cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // n_head
    theta = _rope_theta(cfg)

    tmp = out_path.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), arch)
    w.add_name(model_dir.name)
    w.add_context_length(cfg.get("max_position_embeddings", 2048))
    w.add_embedding_length(hidden)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(
        gguf.LlamaFileType.MOSTLY_BF16 if dtype == "bfloat16" else gguf.LlamaFileType.ALL_F32
    )

    tok, tokens, types, merges = _vocab(model_dir, cfg["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(_pre_tokenizer(arch, cfg, tok))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    sp = _special_ids(model_dir, cfg)
    if sp["bos"] is not None:
        w.add_bos_token_id(sp["bos"])
    if sp["eos"] is not None:
        w.add_eos_token_id(sp["eos"])
    if sp["pad"] is not None:
        w.add_pad_token_id(sp["pad"])
    w.add_add_bos_token(bool(sp["add_bos"]))

    factors = llama3_rope_factors(cfg, head_dim, theta)
    if factors is not None:
        w.add_tensor("rope_freqs.weight", factors)

    files = sorted(model_dir.glob("*.safetensors"))
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                if name.endswith("rotary_emb.inv_freq"):
                    continue
                t = st.get_tensor(name)
                if arch == "llama" and name.endswith("self_attn.q_proj.weight"):
                    t = torch.from_numpy(permute_qk(t.float().numpy(), n_head)).to(t.dtype)
                elif arch == "llama" and name.endswith("self_attn.k_proj.weight"):
                    t = torch.from_numpy(permute_qk(t.float().numpy(), n_kv)).to(t.dtype)
                gname = gguf_name(name)
                if t.dim() == 1 or mat_type is None:
                    w.add_tensor(gname, t.float().numpy())
                else:
                    raw = t.to(torch.bfloat16).view(torch.uint16).numpy()
                    w.add_tensor(gname, raw, raw_shape=raw.shape, raw_dtype=mat_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, out_path)
    return out_path


def cached_export(model_dir: str | Path, dtype: str) -> Path:
    """export() into the cache, keyed by the model directory's files and the dtype."""
    model_dir = Path(model_dir).resolve()
    h = hashlib.sha256(str(model_dir).encode())
    for f in sorted(model_dir.iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    out = (
        Path(envs.cache_dir())
        / "bench"
        / "gguf"
        / f"{model_dir.name}-{dtype}-{h.hexdigest()[:12]}.gguf"
    )
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f"{model_dir.name}-{dtype}-*.gguf"):
        stale.unlink()  # an export of an older version of this model directory
    _say(f"exporting {model_dir} to GGUF ({dtype}) for llama.cpp: {out}")
    return export(model_dir, out, dtype)
