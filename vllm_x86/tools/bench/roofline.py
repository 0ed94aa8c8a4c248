"""The decode roofline: how fast one request could decode if reading weights were all.

Decoding one token of one request reads every weight matrix once: all layers, the
final norm and the LM head. The input embedding is only looked up (one row), so it
counts only when it is also the LM head (tied embeddings). ``weight bytes per token ÷
memory bandwidth`` is then the shortest time a token can take, and its inverse the
roofline in tokens/s. KV-cache reads and activations are left out: with short contexts
they are small next to the weights, so the roofline is an upper bound, slightly high.

Bytes are counted in the dtype the contender computes with (a bf16 checkpoint run in
float32 reads 4 bytes per weight), from the tensor headers only (no weights are read).
"""

from __future__ import annotations

import json
from pathlib import Path

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
EMBED_NAMES = ("model.embed_tokens.weight", "transformer.wte.weight")
LM_HEAD_NAMES = ("lm_head.weight",)


# Bytes per weight of a Linear layer quantized by the plugin, in its kernels' packed
# layouts (vllm_x86/runtime/quant/methods.py): INT8 adds a float32 scale per output channel;
# INT4 (group g) packs two weights per byte and adds, per group of each output channel,
# a float32 scale and a uint8 zero point (4 + 1 bytes per g weights).
def quant_bytes_per_weight(quant: str, k: int, group: int = 128) -> float:
    if quant == "x86_int8":
        return 1.0 + 4.0 / k
    if quant == "x86_int4":
        return 0.5 + 5.0 / group
    raise ValueError(f"unknown quantization '{quant}'")


FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")  # safetensors' names of float dtypes


def _safetensors_tensors(model_dir: Path) -> dict[str, tuple[str, list[int], int]]:
    """name -> (stored dtype, shape, stored bytes): the plan's header reader."""
    from vllm_x86.runtime.parallel_plan import safetensors_tensors

    tensors = safetensors_tensors(model_dir)
    if not tensors:
        raise FileNotFoundError(f"no readable *.safetensors in {model_dir}")
    return tensors


def _safetensors_shapes(model_dir: Path) -> dict[str, list[int]]:
    return {n: shape for n, (_, shape, _) in _safetensors_tensors(model_dir).items()}


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _is_quantized_linear(name: str, shape: list[int]) -> bool:
    """Linear weights of the decoder layers: what x86_int8/x86_int4 quantize (the LM
    head and embeddings stay in the compute dtype)."""
    return ".layers." in name and name.endswith(".weight") and len(shape) == 2


def _grid_layers(model_dir: Path, names: list[str], shapes: dict[str, list[int]]) -> set[str]:
    """The weights among `names` that x86_int4 keeps on their own 4-bit grid in groups
    of 32 while loading (methods.grid_ratio, on GRID_ROWS rows from each weight's
    middle, as the converter reads them)."""
    from safetensors import safe_open

    from vllm_x86.tools.quantize.convert import on_grid

    kept: set[str] = set()
    names = [n for n in names if shapes[n][1] % 64 == 0]  # the rule's K
    if not names:
        return kept
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as sf:
            for key in sf.keys():
                if key not in names:
                    continue
                sl = sf.get_slice(key)
                if on_grid(sl, sl.get_shape()[0]):
                    kept.add(key)
    return kept


def hf_weight_bytes_per_token(
    model_dir: str | Path,
    dtype: str,
    quant: str | None = None,
    group: int = 128,
    lm_head_bits: int = 0,
    grid: bool = True,
) -> dict:
    """Bytes of weights one decoded token reads, for a HF directory run in `dtype`
    (and, with `quant`, its decoder Linear layers quantized by the plugin, INT4 in the
    groups each layer gets: `group` or the smaller one its input size takes, or with
    `grid` (VLLM_X86_QUANT_INT4_GRID) groups of 32 where the weights already sit on a
    4-bit grid; with `lm_head_bits` 8 or 4, the LM head in INT8 or INT4 too:
    VLLM_X86_QUANT_LM_HEAD).
    A checkpoint that is quantized already (a `quantization_config` in config.json:
    the plugin's prepacked directories, GPTQ, AWQ) is counted as stored
    (quantized_checkpoint_bytes)."""
    qcfg = _quantization_config(Path(model_dir))
    if qcfg is not None:
        return quantized_checkpoint_bytes(Path(model_dir), dtype, qcfg)
    shapes = _safetensors_shapes(Path(model_dir))
    numels = {n: _numel(s) for n, s in shapes.items()}
    total = sum(numels.values())
    embed = next((numels[n] for n in EMBED_NAMES if n in numels), 0)
    untied = any(n in numels for n in LM_HEAD_NAMES)
    read = total - embed if untied else total
    nbytes = read * DTYPE_BYTES[dtype]
    kept: set[str] = set()
    if quant:
        from vllm_x86.runtime.quant.groups import effective_group_size

        linears = [n for n, s in shapes.items() if _is_quantized_linear(n, s)]
        if quant == "x86_int4" and grid:
            kept = _grid_layers(Path(model_dir), linears, shapes)
        for n in linears:
            k = shapes[n][1]
            g = 32 if n in kept else effective_group_size(k, group) or group
            q = quant_bytes_per_weight(quant, k, g)
            nbytes += round(numels[n] * (q - DTYPE_BYTES[dtype]))
    head_method = {8: "x86_int8", 4: "x86_int4"}.get(lm_head_bits)
    if head_method:
        head = next((n for n in LM_HEAD_NAMES if n in shapes), None) if untied else None
        head = head or next((n for n in EMBED_NAMES if n in shapes), None)
        if head is not None:
            from vllm_x86.runtime.quant.groups import effective_group_size

            k = shapes[head][1]
            q = quant_bytes_per_weight(head_method, k, effective_group_size(k, group) or group)
            nbytes += round(numels[head] * (q - DTYPE_BYTES[dtype]))
    out = {
        "params": total,
        "params_read_per_token": read,
        "tied_embeddings": not untied,
        "dtype": dtype,
        "bytes_per_token": int(nbytes),
    }
    if quant:
        out["quantization"] = quant
    if kept:
        out["grid_layers"] = len(kept)
    if head_method:
        out["lm_head"] = head_method
    return out


def _quantization_config(model_dir: Path) -> dict | None:
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    q = cfg.get("quantization_config")
    return q if isinstance(q, dict) else None


def quantized_checkpoint_bytes(model_dir: Path, dtype: str, qcfg: dict) -> dict:
    """`hf_weight_bytes_per_token` of a checkpoint stored quantized: a layer holding an
    integer tensor (packed codes) is read as stored, its float scales included; the
    other float tensors in `dtype`, as vLLM casts them. The LM head is the embedding
    when tied, or the plugin's own LM-head codes where the directory has them
    (`lm_head_codes`, an INT8/INT4 head: then the embedding is only looked up)."""
    from vllm_x86.runtime.parallel_plan import safetensors_file_tensors

    tensors = _safetensors_tensors(model_dir)
    # a layer with an integer tensor (its packed codes) is read as stored, scales included
    quantized = {n.rsplit(".", 1)[0] for n, (dt, _, _) in tensors.items() if dt not in FLOAT_DTYPES}
    embed = next((n for n in EMBED_NAMES if n in tensors), None)
    untied = any(n in tensors for n in LM_HEAD_NAMES)
    head_codes = qcfg.get("lm_head_codes")
    codes = safetensors_file_tensors([model_dir / head_codes]) if head_codes else None
    head_bytes = sum(size for _, _, size in codes.values()) if codes else 0
    total = read = nbytes = 0
    for n, (_, shape, size) in tensors.items():
        k = _numel(shape)
        total += k
        if n == embed and (untied or head_bytes):
            continue  # looked up, not read whole
        if head_bytes and n in LM_HEAD_NAMES:
            continue  # the plugin's codes are read instead
        read += k
        in_quantized = n.rsplit(".", 1)[0] in quantized
        nbytes += size if in_quantized else k * DTYPE_BYTES[dtype]
    out = {
        "params": total,
        "params_read_per_token": read,
        "tied_embeddings": not untied,
        "dtype": dtype,
        "bytes_per_token": int(nbytes + head_bytes),
        "quantization": str(qcfg.get("quant_method", "?")),
        "stored_quantized": True,
    }
    if head_bytes:
        out["lm_head"] = f"{qcfg.get('quant_method', '?')} codes ({head_codes})"
    return out


def gguf_weight_bytes_per_token(path: str | Path) -> dict:
    """The same for a GGUF file, in its own storage types."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    sizes = {t.name: int(t.n_bytes) for t in r.tensors}
    total = sum(sizes.values())
    untied = "output.weight" in sizes
    read = total - sizes.get("token_embd.weight", 0) if untied else total
    types = sorted({t.tensor_type.name for t in r.tensors})
    return {
        "file_bytes": total,
        "tied_embeddings": not untied,
        "tensor_types": types,
        "bytes_per_token": read,
    }


def roofline_tok_s(bytes_per_token: int, gb_s: float) -> float:
    return gb_s * 1e9 / bytes_per_token
