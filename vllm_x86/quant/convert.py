"""`vllm-x86 quantize MODEL OUT --bits 8|4`: write a prepacked checkpoint.

The output is a model directory vLLM serves directly (`vllm-x86 serve OUT`): the
decoder's Linear weights quantized and packed in the kernels' layout, everything else
(norms, embeddings, LM head, biases, MoE experts and routers) copied as it is (with `--lm-head`
the config asks for an INT8 LM head, made from the bf16 one while loading), tokenizer and other
files copied, config.json with a `quantization_config` (format.py), and x86_quant.json
with the size of every weight file.

Each Linear weight is quantized and packed on its own, under its checkpoint name
(q_proj, k_proj, v_proj, ...): vLLM's loaders then fuse them as they do bf16 weights
(methods.py, `_packed_param`). What is quantized is what `--quantization` quantizes on
the fly (scope.py): 2-D `.weight` tensors of the decoder's Linear layers whose shape
the kernels take. Routed MoE expert weights are written as they are and quantized while
the checkpoint loads (moe.py; round to nearest, also with --method gptq: the
converter says so), MoE routers stay as they are.

INT4 codes are chosen by GPTQ by default (``--method gptq``, gptq.py): the converter
first runs the checkpoint through transformers on a calibration text, one decoder layer
at a time, and quantizes each layer with its inputs in view. ``--method rtn`` rounds each weight
to the nearest code, as quantizing on the fly does (no calibration, seconds).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from vllm_x86.quant import format as qformat
from vllm_x86.quant import scope

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


class ConvertError(Exception):
    """The conversion cannot run as asked; the message is meant for the user."""


def is_quantizable(name: str, shape: tuple[int, ...]) -> bool:
    """A Linear weight the converter packs: scope.py's "linear" kind (not the routed
    experts, which are stored in bf16 and quantized while loading, nor the router)."""
    return scope.kind_of(name) == "linear" and name.endswith(".weight") and len(shape) == 2


def _say(progress, msg: str) -> None:
    if progress:
        progress(msg)


def quantize_checkpoint(
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    bits: int,
    group_size: int = 128,
    zero_point: bool = True,
    force: bool = False,
    lm_head: bool = False,
    method: str = "rtn",
    calib_windows: int = 32,
    progress=print,
) -> dict:
    """Convert; returns the manifest. Raises ConvertError with a sentence for the user."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from vllm_x86 import __version__
    from vllm_x86.quant import methods as m

    src, out = Path(model_dir).expanduser(), Path(out_dir).expanduser()
    name = {8: "x86_int8", 4: "x86_int4"}.get(bits)
    if name is None:
        raise ConvertError(f"--bits must be 8 or 4, not {bits}")
    if bits == 4 and group_size not in (32, 64, 128):
        raise ConvertError(f"--group-size must be 32, 64 or 128, not {group_size}")
    if method not in ("rtn", "gptq"):
        raise ConvertError(f"--method must be gptq or rtn, not {method}")
    if method == "gptq" and (bits != 4 or not zero_point):
        raise ConvertError(
            "--method gptq is for INT4 with zero points (--bits 4 without --symmetric); "
            "use --method rtn"
        )
    if not (src / "config.json").is_file():
        raise ConvertError(
            f"'{model_dir}' is not a model directory (no config.json); give the directory "
            "of a bf16 or fp16 Hugging Face checkpoint"
        )
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise ConvertError(
            f"'{model_dir}' has no *.safetensors weights; the converter reads safetensors "
            "checkpoints"
        )
    config = json.loads((src / "config.json").read_text())
    if config.get("quantization_config"):
        method = config["quantization_config"].get("quant_method", "?")
        raise ConvertError(
            f"'{model_dir}' is already quantized ({method}); give the bf16/fp16 checkpoint"
        )
    if out.resolve() == src.resolve():
        raise ConvertError("the output directory must differ from the model directory")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise ConvertError(f"'{out_dir}' exists and is not empty (--force replaces it)")
        shutil.rmtree(out)
    if not m.amx_available():
        raise ConvertError(
            "the prepacked format is laid out for the AMX kernels and this CPU has no AMX "
            f"(or VLLM_X86_QUANT_KERNEL=torch is set); serve the bf16 model with "
            f"--quantization {name} instead"
        )
    layout = qformat.expected_layout(name, group_size)
    kernel = "w8a16" if bits == 8 else m.int4_layout_kernel(layout)
    if kernel != "vllm":
        try:
            m.check_plugin_amx()  # packed for the plugin's kernel
        except RuntimeError as e:
            raise ConvertError(str(e)) from None

    t0 = time.monotonic()
    codes = _calibrate(src, calib_windows, group_size, kernel, progress) if method == "gptq" else {}
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    quantized: list[str] = []
    kept: list[str] = []
    moe = {"experts": 0, "router": 0}  # MoE weights stored as they are
    weight_map: dict[str, str] = {}
    in_bytes = 0
    for i, f in enumerate(files, 1):
        in_bytes += f.stat().st_size
        tensors: dict[str, torch.Tensor] = {}
        with safe_open(str(f), framework="pt") as sf:
            keys = list(sf.keys())
            metadata = sf.metadata()
            for j, key in enumerate(keys, 1):
                if j % 100 == 0:
                    _say(progress, f"  {f.name}: {j}/{len(keys)} tensors")
                t = sf.get_tensor(key)
                module = key[: -len(".weight")]
                if not (is_quantizable(key, tuple(t.shape)) and t.is_floating_point()):
                    kind = scope.kind_of(key)
                    if kind in ("experts", "router") and key.endswith(".weight"):
                        moe[kind] += 1
                    tensors[key] = t
                    continue
                n, k = t.shape
                problem = (
                    m.int8_shape_problem(n, k, kernel)
                    if bits == 8
                    else m.int4_shape_problem(n, k, group_size, kernel)
                )
                if problem:
                    kept.append(module)
                    _say(progress, f"  {key} stays {t.dtype}: {problem}")
                    tensors[key] = t
                    continue
                if bits == 8:
                    q, scale = m.quantize_int8(t)
                    tensors[key] = m.pack_int8_w8a16(q)
                    tensors[module + ".weight_scale"] = scale
                else:
                    g = m.effective_group_size(k, group_size)
                    if method == "gptq":
                        c = codes.pop(module, None)
                        if c is None:
                            shutil.rmtree(tmp)
                            raise ConvertError(
                                f"GPTQ: calibration saw no inputs of {module} (a layer "
                                "transformers names differently); use --method rtn"
                            )
                        r = c.unpack()
                    else:
                        r = m.quantize_int4(t, g, zero_point)
                    if kernel == "w4a16":
                        bw, bs, bz = m.pack_int4_w4a16(*r)
                    else:
                        bw, bz, bs = m.pack_int4(*r)
                    tensors[key] = bw
                    tensors[module + ".weight_zp"] = bz
                    tensors[module + ".weight_scale"] = bs
                quantized.append(module)
        tensors = {k: v.contiguous() for k, v in tensors.items()}
        save_file(tensors, str(tmp / f.name), metadata=metadata)
        weight_map.update({k: f.name for k in tensors})
        _say(progress, f"[{i}/{len(files)}] {f.name}: {len(tensors)} tensors written")
    if moe["experts"] or moe["router"]:
        _say(
            progress,
            f"MoE: {moe['experts']} routed-expert weight tensors are written in "
            f"{src_dtype(files)} and quantized to INT{bits} while the checkpoint loads "
            f"(round to nearest{', not GPTQ' if method == 'gptq' else ''}); "
            f"{moe['router']} router weights stay as they are (routing as in bf16)",
        )
    if not quantized:
        shutil.rmtree(tmp)
        raise ConvertError(
            f"no Linear layer of '{model_dir}' has a shape the {name} kernels take; "
            "nothing to quantize"
        )

    for item in src.iterdir():
        if (
            item.name == "config.json"
            or item.name.startswith(".")
            or item.name.endswith(WEIGHT_SUFFIXES)
        ):
            continue
        if item.name.endswith(".safetensors.index.json"):
            index = json.loads(item.read_text())
            index["weight_map"] = weight_map
            index.setdefault("metadata", {}).pop("total_size", None)
            (tmp / item.name).write_text(json.dumps(index, indent=2) + "\n")
        elif item.is_file():
            shutil.copy2(item, tmp / item.name)
        elif item.is_dir():
            shutil.copytree(item, tmp / item.name)
    config["quantization_config"] = {
        "quant_method": name,
        "bits": bits,
        "group_size": group_size if bits == 4 else None,
        "zero_point": bool(zero_point) if bits == 4 else False,
        "method": method,
        "prepacked": True,
        "layout": layout,
        "format_version": qformat.FORMAT_VERSION,
        "quantized_layers": quantized,
        # the LM head is stored in bf16 and quantized to INT8 while loading (lm_head.py)
        "lm_head": bool(lm_head),
        # routed MoE experts: stored as they were, quantized while loading (moe.py)
        **({"moe_experts": "quantized while loading"} if moe["experts"] else {}),
    }
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    manifest = qformat.write_manifest(
        str(tmp),
        {
            "quant_method": name,
            "written_by": f"vllm-x86 {__version__}",
            "source": str(src),
            "method": method,
            **(
                {"calibration": f"{calib_windows} x 512 tokens of data/calib_text.txt"}
                if method == "gptq"
                else {}
            ),
            "quantized_layers": len(quantized),
            "kept_layers": kept,
        },
    )
    tmp.rename(out)
    out_bytes = sum(v["bytes"] for v in manifest["files"].values())
    _say(
        progress,
        f"{name}: {len(quantized)} layers quantized, {len(kept)} kept; weights "
        f"{in_bytes / 2**20:.0f} MiB -> {out_bytes / 2**20:.0f} MiB in "
        f"{time.monotonic() - t0:.1f} s; serve it with: vllm-x86 serve {out}",
    )
    return manifest


def src_dtype(files) -> str:
    """The dtype of the first floating-point tensor of a checkpoint (for messages)."""
    from safetensors import safe_open

    with safe_open(str(files[0]), framework="pt") as sf:
        for key in sf.keys():
            t = sf.get_slice(key)
            if t.get_dtype() in ("BF16", "F16", "F32"):
                return {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}[t.get_dtype()]
    return "their dtype"


def _calibrate(src: Path, windows: int, group_size: int, kernel: str, progress) -> dict:
    """GPTQ codes of every quantizable Linear layer whose shape the kernel takes
    (gptq.sequential_gptq), running the checkpoint through transformers on the
    calibration text one decoder layer at a time."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vllm_x86.quant import gptq
    from vllm_x86.quant import methods as m

    _say(progress, f"GPTQ: loading {src.name} with transformers for calibration")
    try:
        # the checkpoint's own dtype (bf16: as much memory as the weights); the hooks
        # accumulate X^T X in float32
        model = AutoModelForCausalLM.from_pretrained(str(src), dtype="auto").eval()
    except Exception as e:  # a checkpoint transformers cannot run
        raise ConvertError(
            f"GPTQ needs to run the model with transformers and could not load it "
            f"({type(e).__name__}: {e}); use --method rtn"
        ) from None

    def group_size_of(name: str, linear) -> int | None:
        n, k = linear.weight.shape
        if not is_quantizable(name + ".weight", (n, k)):
            return None
        if m.int4_shape_problem(n, k, group_size, kernel):
            return None  # stays in the model's dtype, as the converter keeps it
        return m.effective_group_size(k, group_size)

    try:
        need = gptq.calibration_bytes(
            model, lambda name: is_quantizable(name + ".weight", (0, 0)), windows, 512
        )
    except ValueError as e:  # no decoder layers where GPTQ looks for them
        raise ConvertError(f"GPTQ: {e}; use --method rtn") from None
    free = _available_memory()
    if need > 0.8 * free:
        raise ConvertError(
            f"GPTQ keeps X^T X of one decoder layer's inputs, the calibration's hidden "
            f"states and the codes: {need / 2**30:.1f} GiB for this model, and "
            f"{free / 2**30:.1f} GiB of memory is available; use --method rtn"
        )
    try:
        tok = AutoTokenizer.from_pretrained(str(src))
    except Exception as e:
        raise ConvertError(
            f"GPTQ needs the model's tokenizer for its calibration text and could not load "
            f"it ({type(e).__name__}: {e}); use --method rtn"
        ) from None
    ids = gptq.calibration_ids(tok, windows, 512)
    _say(progress, f"GPTQ: calibrating on {ids.numel()} tokens, one decoder layer at a time")
    try:
        codes = gptq.sequential_gptq(
            model, ids, group_size_of, lambda msg: _say(progress, "  GPTQ: " + msg)
        )
    except ValueError as e:  # a forward pass GPTQ cannot follow layer by layer
        raise ConvertError(f"GPTQ: {e}; use --method rtn") from None
    del model
    return codes


def _available_memory() -> int:
    import psutil

    return psutil.virtual_memory().available
