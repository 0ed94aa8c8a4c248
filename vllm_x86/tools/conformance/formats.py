"""Hub checkpoint formats for the tiny builder.

transformers 5 saves some architectures in a format of its own (renamed config fields,
per-layer type lists) where the real checkpoints on the Hub keep the model authors'
original one, and vLLM's model files read the original. A rewrite here turns what
``save_pretrained`` wrote into that original format, for one architecture, so vLLM
reads the tiny checkpoint as it reads the real ones.

Each rewrite keeps what transformers itself reads: config fields are added next to
transformers' own (transformers keeps unknown fields as attributes and ignores them),
and weights are renamed only to names transformers' conversion mapping
(``transformers/conversion_mapping.py``) renames back when it loads. So the same
directory stays the transformers reference.

A rewrite is ``fn(config: dict, weights: dict[str, Tensor], out: Path) -> None`` and
edits ``config`` (config.json) and ``weights`` (model.safetensors) in place; `out` is
the checkpoint directory, for rewrites that add files. Rows of ``archs.py`` name it in
``hub_format``; its source is part of the tiny checkpoint's cache key.

Most rewrites start from what ``save_pretrained`` writes by default (the "original"
format of transformers' conversion mapping). A rewrite named in ``FROM_MODULE_NAMES``
starts instead from the modules' own weight names (``save_original_format=False``),
for checkpoints laid out neither as that mapping writes them nor as the modules name
the weights; transformers still loads the result (its mapping converts what matches
and keeps the rest).
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def mimo_v2_flash(config: dict, weights: dict, out: Path) -> None:
    """MiMo-V2-Flash's original fields (XiaomiMiMo/MiMo-V2-Flash config.json), read by
    vLLM's mimo_v2.py: ``hybrid_layer_pattern`` (1 = sliding-window layer),
    ``moe_layer_freq`` (1 = MoE layer), the sliding layers' own attention shape
    (``swa_*``; transformers doubles their KV heads, as the Hub config does 4 -> 8),
    ``sliding_window_size``, the two rope bases, ``partial_rotary_factor``,
    ``layernorm_epsilon``, and sinks on the sliding layers only."""
    types = config["layer_types"]
    rope = config["rope_parameters"]
    full, swa = rope["full_attention"], rope["sliding_attention"]
    if full.get("partial_rotary_factor") != swa.get("partial_rotary_factor"):
        raise ValueError("MiMo-V2-Flash's original config has one partial_rotary_factor")
    config.update(
        hybrid_layer_pattern=[int(t == "sliding_attention") for t in types],
        moe_layer_freq=[int(t == "sparse") for t in config["mlp_layer_types"]],
        swa_num_attention_heads=config["num_attention_heads"],
        swa_num_key_value_heads=2 * config["num_key_value_heads"],
        swa_head_dim=config["head_dim"],
        swa_v_head_dim=config["v_head_dim"],
        sliding_window_size=config["sliding_window"],
        rope_theta=full["rope_theta"],
        swa_rope_theta=swa["rope_theta"],
        partial_rotary_factor=full["partial_rotary_factor"],
        layernorm_epsilon=config["rms_norm_eps"],
        add_swa_attention_sink_bias=True,
        add_full_attention_sink_bias=False,
    )


def lfm2(config: dict, weights: dict, out: Path) -> None:
    """LFM2's original fields (LiquidAI/LFM2-1.2B config.json), read by vLLM's lfm2.py:
    the widths of the blocks (``block_dim``), of the short convolutions (``conv_dim``,
    ``conv_dim_out``) and of the feed-forward (``block_ff_dim``), and the attention
    layers' indices (``full_attn_idxs``). The weight names are the original ones."""
    hidden = config["hidden_size"]
    config.update(
        block_dim=hidden,
        conv_dim=hidden,
        conv_dim_out=hidden,
        block_ff_dim=config["intermediate_size"],
        full_attn_idxs=[i for i, t in enumerate(config["layer_types"]) if t == "full_attention"],
    )


def hy_v3(config: dict, weights: dict, out: Path) -> None:
    """Hunyuan-V3's original switch for the q/k RMSNorms (``qk_norm``, tencent/Hunyuan-V3
    config.json), read by vLLM's hy_v3.py (absent, it builds the attention without
    them); transformers' HYV3 always has them. The weight names (``mlp.router.gate``,
    ``mlp.expert_bias``, ``mlp.shared_mlp``) are the original ones already."""
    config["qk_norm"] = True


def deepseek_v4(config: dict, weights: dict, out: Path) -> None:
    """DeepSeek-V4's original layout (deepseek-ai/DeepSeek-V4-Flash), read by vLLM's
    deepseek_v4 model and config: per-layer ``compress_ratios`` (0 sliding, 4 CSA, 128
    HCA) and ``num_hash_layers`` instead of transformers' ``layer_types`` and
    ``mlp_layer_types`` (vLLM's DeepseekV4Config is a PreTrainedConfig, whose
    validator rejects 'hash_moe' entries), and weight names without the ``model.``
    prefix (``embed.weight``, ``layers.N...``, ``hc_head_fn``, ``attn.kv_norm``).
    transformers folds both
    back (configuration_deepseek_v4.py legacy kwargs, conversion_mapping.py)."""
    rates = config.get("compress_rates") or {}
    ratio = {
        "sliding_attention": 0,
        "compressed_sparse_attention": rates.get("compressed_sparse_attention", 4),
        "heavily_compressed_attention": rates.get("heavily_compressed_attention", 128),
    }
    mlp = config.pop("mlp_layer_types")
    n_hash = next((i for i, t in enumerate(mlp) if t != "hash_moe"), len(mlp))
    if any(t != "moe" for t in mlp[n_hash:]):
        raise ValueError(f"DeepSeek-V4's hash MoE layers must come first: {mlp}")
    config["num_hash_layers"] = n_hash
    # the routed layers' gate has a score-correction bias (as in the Hub config)
    config["topk_method"] = "noaux_tc"
    config["compress_ratios"] = [ratio[t] for t in config.pop("layer_types")]
    renames = {
        "model.embed_tokens.weight": "embed.weight",
        "model.norm.weight": "norm.weight",
        "model.hc_head.hc_fn": "hc_head_fn",
        "model.hc_head.hc_base": "hc_head_base",
        "model.hc_head.hc_scale": "hc_head_scale",
    }
    for name in list(weights):
        new = renames.get(name)
        if new is None and name.startswith("model.layers."):
            new = name[len("model.") :]
            # transformers' reverse of its `.norm.` -> `.kv_norm.` rename over-reaches:
            # the attention's KV norm is `attn.kv_norm` in the original
            new = new.replace(".attn.norm.", ".attn.kv_norm.")
        if new is not None:
            weights[new] = weights.pop(name)


def olmo_hybrid(config: dict, weights: dict, out: Path) -> None:
    """OLMo-Hybrid's released layout (allenai/Olmo-Hybrid-7B): separate q/k/v depthwise
    convolutions (vLLM maps q_conv1d, k_conv1d, v_conv1d to shards 0/1/2 of its fused
    conv1d, olmo_hybrid.py) under the modules' norm names input_layernorm /
    post_attention_layernorm (vLLM has no mapping for the OLMo-core names
    attention_layer_norm / feedforward_layer_norm that transformers' original format
    writes), hence a start from the module names (FROM_MODULE_NAMES). transformers'
    original format cannot be used: it splits the fused conv1d back into three equal
    parts, wrong whenever the value width differs from the key width (it does by
    default: value head dim = 2 x key head dim)."""
    key_dim = config["linear_num_key_heads"] * config["linear_key_head_dim"]
    value_dim = config["linear_num_value_heads"] * config["linear_value_head_dim"]
    for name in [n for n in weights if n.endswith(".linear_attn.conv1d.weight")]:
        q, k, v = weights.pop(name).split([key_dim, key_dim, value_dim], dim=0)
        stem = name[: -len("conv1d.weight")]
        weights[f"{stem}q_conv1d.weight"] = q
        weights[f"{stem}k_conv1d.weight"] = k
        weights[f"{stem}v_conv1d.weight"] = v


REWRITES: dict[str, Callable[[dict, dict, Path], None]] = {
    "mimo_v2_flash": mimo_v2_flash,
    "lfm2": lfm2,
    "hy_v3": hy_v3,
    "deepseek_v4": deepseek_v4,
    "olmo_hybrid": olmo_hybrid,
}

# rewrites that start from the modules' weight names (save_original_format=False)
FROM_MODULE_NAMES: frozenset[str] = frozenset({"olmo_hybrid"})


def save_original_format(name: str) -> bool:
    """The ``save_original_format`` argument of ``save_pretrained`` the rewrite `name`
    starts from (True: transformers' default; no rewrite: True)."""
    return name not in FROM_MODULE_NAMES


def fingerprint(name: str) -> str:
    """What identifies a rewrite in the cache key: its name, source and starting format."""
    fn = REWRITES[name]
    start = "" if save_original_format(name) else ":module-names"
    return name + start + ":" + hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()[:12]


def rewrite(name: str, out: Path) -> None:
    """Apply the rewrite `name` to the checkpoint saved in `out`."""
    from safetensors.torch import load_file, save_file

    out = Path(out)
    cfg_path = out / "config.json"
    st = out / "model.safetensors"
    if not st.is_file():
        raise FileNotFoundError(f"{st}: rewrites handle single-file checkpoints only")
    config: dict[str, Any] = json.loads(cfg_path.read_text())
    weights = load_file(str(st))
    REWRITES[name](config, weights, out)
    cfg_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file({k: v.contiguous() for k, v in weights.items()}, str(st), metadata={"format": "pt"})
