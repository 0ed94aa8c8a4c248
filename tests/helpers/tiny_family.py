"""A random-weight 2-layer checkpoint of a transformers decoder architecture, for tests
that need a family's own layer classes (Qwen3's q/k norms, Mistral's layers) in seconds."""

from __future__ import annotations

import shutil
from pathlib import Path


def tiny_family(arch: str, out: Path, tokenizer_from: Path) -> Path:
    """`arch` (e.g. "Qwen3ForCausalLM", "MistralForCausalLM") with hidden size 256, 4
    query and 2 KV heads of 64, no sliding window, bf16 weights drawn with seed 0 (std
    0.2), saved to `out` with the tokenizer files of `tokenizer_from` (the default
    model's: vocabulary 49152)."""
    import torch
    import transformers

    config = getattr(transformers, arch.replace("ForCausalLM", "Config"))(
        vocab_size=49152, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
        rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
        initializer_range=0.2, sliding_window=None,
    )  # fmt: skip
    torch.manual_seed(0)
    getattr(transformers, arch)(config).to(torch.bfloat16).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tokenizer_from) / f, Path(out) / f)
    return Path(out)
