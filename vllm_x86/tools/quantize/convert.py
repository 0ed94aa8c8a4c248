"""`vllm-x86 quantize MODEL OUT --bits 8|4`: write a prepacked checkpoint.

The output is a model directory vLLM serves directly (`vllm-x86 serve OUT`): the
decoder's Linear weights and the routed MoE experts quantized and packed in the kernels'
layout, everything else (norms, embeddings, LM head, biases, MoE routers) copied as it
is, tokenizer and other files copied, config.json with a `quantization_config`
(format.py), and x86_quant.json with the size of every weight file. With `--lm-head
int8` (or `--lm-head`) the config asks for an INT8 LM head, made from the bf16 one while
loading; with `--lm-head int4` for an INT4 one: with --method gptq its codes are
calibrated like the decoder's (gptq.head_codes) and written to x86/lm_head.safetensors
(format version 3), with --method rtn it is rounded while loading.

Each Linear weight is quantized and packed on its own, under its checkpoint name
(q_proj, k_proj, v_proj, ...): vLLM's loaders then fuse them as they do bf16 weights
(methods.py, `_packed_param`). What is quantized is what `--quantization` quantizes on
the fly (scope.py): 2-D `.weight` tensors of the decoder's Linear layers whose shape
the kernels take. Routed MoE experts stored one tensor per expert and projection
(``...experts.<e>.gate_proj/up_proj/down_proj.weight``, or w1/w3/w2) are quantized and
packed as moe.py packs them while loading (moe.pack_experts: round to nearest, also
with --method gptq; the converter says so), under their own names, and their layers
are listed in ``quantization_config.packed_experts``. A layer whose expert shapes the
kernel does not take (moe.expert_shape_problem, with gate and up stored apart) or whose
experts are stored otherwise is written as it is, and the loader treats it as
``--quantization`` does (quantized while loading, or bf16 with a warning). MoE routers
stay as they are.

The output is written under OUT.partial beside OUT and renamed to OUT when whole (with
--force the old OUT is renamed aside first, then removed), so a failed or interrupted
run never leaves a directory at OUT; a run that fails on a full or unwritable disk
removes OUT.partial and says so in one sentence, and the next run removes what a killed
one left (and says what).

INT4 codes are chosen by GPTQ by default (``--method gptq``, gptq.py): the converter
first runs the checkpoint through transformers on a calibration text, one decoder layer
at a time, and quantizes each layer with its inputs in view. ``--method rtn`` rounds each weight
to the nearest code, as quantizing on the fly does (no calibration, seconds).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

from vllm_x86.runtime import diskfaults, envs
from vllm_x86.runtime.quant import format as qformat
from vllm_x86.runtime.quant import scope

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


class ConvertError(Exception):
    """The conversion cannot run as asked; the message is meant for the user."""


def is_quantizable(name: str, shape: tuple[int, ...], model_type: str | None = None) -> bool:
    """A Linear weight the converter packs: scope.py's "linear" kind (not the routed
    experts, which pack_experts packs, nor the router, nor a Mamba-1 mixer's layers,
    which vLLM builds unquantized)."""
    return (
        scope.checkpoint_kind(name, model_type) == scope.LINEAR
        and name.endswith(".weight")
        and len(shape) == 2
    )


EXPERT_KEY = re.compile(r"^(?P<layer>.+\.experts)\.(?P<e>\d+)\.(?P<proj>[a-z_0-9]+)\.weight$")


def expert_key(key: str) -> tuple[str, int, str] | None:
    """(layer, expert, shard) of a per-expert weight name (shard: vLLM's w1 gate, w3 up,
    w2 down), or None."""
    from vllm_x86.runtime.quant import moe

    mt = EXPERT_KEY.match(key)
    if mt is None or mt["proj"] not in moe.SHARDS:
        return None
    return mt["layer"], int(mt["e"]), moe.SHARDS[mt["proj"]]


def plan_experts(
    files, bits: int, group_size: int, kernel: str
) -> tuple[dict[str, dict[int, dict[str, str]]], dict[str, str]]:
    """From the safetensors headers: the MoE layers whose routed experts the converter
    packs ({layer: {expert: {shard: key}}}) and why the others stay as they are
    ({layer: reason})."""
    from safetensors import safe_open

    from vllm_x86.runtime.quant import moe

    found: dict[str, dict[int, dict[str, tuple[str, list[int], str]]]] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for key in sf.keys():
                ek = expert_key(key)
                if ek is not None:
                    t = sf.get_slice(key)
                    found.setdefault(ek[0], {}).setdefault(ek[1], {})[ek[2]] = (
                        key,
                        list(t.get_shape()),
                        t.get_dtype(),
                    )
    packed: dict[str, dict[int, dict[str, str]]] = {}
    kept: dict[str, str] = {}
    for layer, experts in found.items():
        shapes = {
            (tuple(x["w1"][1]), tuple(x["w3"][1]), tuple(x["w2"][1]))
            for x in experts.values()
            if set(x) == {"w1", "w2", "w3"}
        }
        dtypes = {v[2] for x in experts.values() for v in x.values()}
        if any(set(x) != {"w1", "w2", "w3"} for x in experts.values()):
            kept[layer] = "an expert without all of gate, up and down"
        elif not dtypes <= {"BF16", "F16", "F32"}:
            kept[layer] = f"expert weights of dtype {sorted(dtypes)}"
        elif len(shapes) != 1:
            kept[layer] = "experts of different shapes"
        else:
            ((gate, up, down),) = shapes
            if len(gate) != 2 or gate != up or down != gate[::-1]:
                kept[layer] = f"gate {gate}, up {up}, down {down} are not [I, H], [I, H], [H, I]"
            else:
                i, h = gate
                problem = moe.expert_shape_problem(h, i, bits, group_size, kernel, split=True)
                if problem:
                    kept[layer] = problem
        if layer not in kept:
            packed[layer] = {e: {s: v[0] for s, v in x.items()} for e, x in experts.items()}
    return packed, kept


def on_grid(sl, n: int) -> bool | None:
    """Whether the stored weight behind safetensors slice `sl` ([n, K]) sits on a 4-bit
    grid of groups of 32 (methods.grid_ratio on GRID_ROWS rows from its middle); None
    for a weight that is not floating point."""
    from vllm_x86.runtime.quant import methods as m

    mid = max(0, n // 2 - m.GRID_ROWS // 2)
    rows = sl[mid : mid + m.GRID_ROWS]
    if not rows.is_floating_point():
        return None
    return m.grid_ratio(rows) < m.GRID_RATIO


def grid_scan(files, model_type, group_size: int, zero_point: bool, kernel: str) -> str:
    """Whether the Linear weights of `files` already sit on a 4-bit grid of groups of 32
    (methods.grid_ratio, as quantizing while loading decides layer by layer): "all",
    "none", "partial", or "off" (not asked for: methods.grid_allowed). A checkpoint
    keeps the grid only where every layer has it ("all"): its Linear layers then share
    groups of 32. Reads GRID_ROWS rows from the middle of each weight."""
    from safetensors import safe_open

    from vllm_x86.runtime.quant import methods as m

    if not m.grid_allowed(zero_point, kernel):
        return "off"
    seen = set()
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for key in sf.keys():
                if expert_key(key) is not None:
                    continue
                sl = sf.get_slice(key)
                shape = tuple(sl.get_shape())
                if len(shape) != 2 or not is_quantizable(key, shape, model_type):
                    continue
                n, k = shape
                if m.int4_shape_problem(n, k, group_size, kernel):
                    continue
                kept = on_grid(sl, n)
                if kept is None:
                    continue
                seen.add(kept)
                if len(seen) == 2:
                    return "partial"
    return "all" if seen == {True} else "none"


def _say(progress, msg: str) -> None:
    if progress:
        progress(msg)


def partial_dir(out: Path) -> Path:
    """Where the output is written until it is whole."""
    return out.with_name(out.name + ".partial")


def replaced_dir(out: Path) -> Path:
    """Where --force moves the old output before removing it."""
    return out.with_name(out.name + ".replaced")


def quantize_checkpoint(
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    bits: int,
    group_size: int = 128,
    zero_point: bool = True,
    force: bool = False,
    lm_head: bool | str = False,
    method: str = "rtn",
    calib_windows: int = 32,
    progress=print,
) -> dict:
    """Convert; returns the manifest. Raises ConvertError with a sentence for the user."""
    out = Path(out_dir).expanduser().absolute()
    names, freed = diskfaults.remove([partial_dir(out), replaced_dir(out)])
    if names:
        _say(
            progress,
            diskfaults.leftover_note(
                "what an interrupted `vllm-x86 quantize` left", names, freed, out.parent
            ),
        )
    try:
        return _quantize_checkpoint(
            model_dir,
            out_dir,
            bits,
            group_size,
            zero_point,
            force,
            lm_head,
            method,
            calib_windows,
            progress,
        )
    except BaseException as e:
        partial = partial_dir(out).exists()
        shutil.rmtree(partial_dir(out), ignore_errors=True)
        if isinstance(e, ConvertError) or not isinstance(e, Exception):
            raise
        msg = diskfaults.sentence(
            e, out.parent, _needs(Path(model_dir).expanduser()), "choose another output directory"
        )
        if msg is None:
            raise
        raise ConvertError(msg + ("; the partial output was removed" if partial else "")) from None


def _needs(src: Path) -> str | None:
    """At most what the output takes: the source's weights and the files copied."""
    try:
        n = sum(
            f.stat().st_size
            for f in src.iterdir()
            if f.is_file()
            and not f.name.startswith(".")
            and (f.name.endswith(".safetensors") or not f.name.endswith(WEIGHT_SUFFIXES))
        )
    except OSError:
        return None
    return f"needs up to {diskfaults.mb(n)}" if n else None


def _quantize_checkpoint(
    model_dir,
    out_dir,
    bits,
    group_size,
    zero_point,
    force,
    lm_head,
    method,
    calib_windows,
    progress,
) -> dict:
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from vllm_x86._version import __version__
    from vllm_x86.runtime.quant import methods as m
    from vllm_x86.runtime.quant import moe as moe_m
    from vllm_x86.tools.quantize.gptq import HEAD as GPTQ_HEAD

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
    try:
        head_bits = scope.lm_head_bits(lm_head)
    except ValueError:
        raise ConvertError(f"--lm-head must be int8 or int4, not {lm_head!r}") from None
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
    model_type = config.get("model_type")
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
        out.rename(replaced_dir(out))  # out of the way at once: never half removed
        shutil.rmtree(replaced_dir(out))
    layout = qformat.expected_layout(name, group_size)
    kernel = "w8a16" if bits == 8 else m.int4_layout_kernel(layout)
    try:
        # the layout must run here: the converter packs with the kernels' own packers
        m.check_prepacked_runs(kernel, "the prepacked format is laid out", name)
    except RuntimeError as e:
        raise ConvertError(str(e)) from None

    grid = grid_scan(files, model_type, group_size, zero_point, kernel) if bits == 4 else "off"
    if grid == "all":
        _say(
            progress,
            "the Linear weights already sit on a 4-bit grid (groups of 32, as in a model "
            "dequantized from a 4-bit GGUF): they are kept on it, in groups of 32"
            + ("; no calibration needed (GPTQ skipped)" if method == "gptq" else "")
            + " (VLLM_X86_QUANT_INT4_GRID=0: round them again)",
        )
        method = "rtn"
    elif grid == "partial":
        _say(
            progress,
            "some Linear weights sit on a 4-bit grid of groups of 32 and some do not: all "
            f"are rounded into groups of {group_size} (quantizing while loading keeps the "
            "grid layer by layer instead)",
        )
    head_group = None
    if head_bits == 4 and method == "gptq":
        text = config.get("text_config") or config
        n_vocab, hidden = text.get("vocab_size"), text.get("hidden_size")
        problem = (
            m.lm_head_bf16_reason(n_vocab, hidden, 4, group_size)
            if n_vocab and hidden
            else "config.json has no vocab_size and hidden_size"
        )
        if problem:
            raise ConvertError(f"--lm-head int4: {problem}")
        head_group = m.effective_group_size(hidden, group_size)
    tmp = partial_dir(out)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)  # before calibrating: an unwritable output fails at once
    t0 = time.monotonic()
    codes = (
        _calibrate(src, calib_windows, group_size, kernel, progress, model_type, head_group)
        if method == "gptq"
        else {}
    )
    head = codes.pop(GPTQ_HEAD, None)
    quantized: list[str] = []
    kept: list[str] = []
    moe = {"experts": 0, "router": 0}  # MoE weights stored as they are
    expert_plan, experts_kept = plan_experts(files, bits, group_size, kernel)
    for layer, why in sorted(experts_kept.items()):
        _say(progress, f"  {layer}: experts stay as they are (quantized while loading): {why}")
    where = {key: f for f in files for key in _keys(f)} if expert_plan else {}
    experts_packed: dict[tuple[str, int], dict] = {}  # packed, not yet all written
    n_packed = 0
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
                ek = expert_key(key)
                if ek is not None and ek[0] in expert_plan:
                    layer, e, shard = ek
                    if (layer, e) not in experts_packed:
                        keys3 = expert_plan[layer][e]
                        w = {x: _tensor(where[keys3[x]], keys3[x], sf, f) for x in keys3}
                        experts_packed[(layer, e)] = moe_m.pack_experts(
                            bits, kernel, w["w1"], w["w3"], w["w2"], group_size, zero_point
                        )
                    part = experts_packed[(layer, e)].pop(shard)
                    if not experts_packed[(layer, e)]:
                        del experts_packed[(layer, e)]
                    module = key[: -len(".weight")]
                    for pname, v in part.items():
                        tensors[f"{module}.{pname}"] = v
                    n_packed += 1
                    continue
                t = sf.get_tensor(key)
                module = key[: -len(".weight")]
                if not (is_quantizable(key, tuple(t.shape), model_type) and t.is_floating_point()):
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
                    g = 32 if grid == "all" else m.effective_group_size(k, group_size)
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
                        r = m.quantize_int4(t, g, zero_point, "minmax" if grid == "all" else None)
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
    if head is not None:
        (tmp / qformat.HEAD_CODES).parent.mkdir()
        save_file(
            {"qweight": head.nibbles, "scale": head.scale, "zero": head.zero.to(torch.uint8)},
            str(tmp / qformat.HEAD_CODES),
            metadata={"group_size": str(head_group)},
        )
        _say(
            progress, f"LM head: GPTQ codes (INT4, groups of {head_group}) in {qformat.HEAD_CODES}"
        )
    elif head_bits:
        _say(
            progress,
            f"LM head: written as it is, quantized to INT{head_bits} while loading"
            + (" (round to nearest; --method gptq calibrates it)" if head_bits == 4 else ""),
        )
    if n_packed or moe["experts"] or moe["router"]:
        rtn = f"round to nearest{', not GPTQ' if method == 'gptq' else ''}"
        _say(
            progress,
            f"MoE: {n_packed} routed-expert weight tensors ({len(expert_plan)} layers) are "
            f"packed in INT{bits} ({rtn}, as while loading); "
            + (
                f"{moe['experts']} are written in {src_dtype(files)} and quantized while "
                "the checkpoint loads; "
                if moe["experts"]
                else ""
            )
            + f"{moe['router']} router weights stay as they are (routing as in bf16)",
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
        # INT4 rounded without calibration: how (`serve --quantization` reuses this
        # directory only where it would round the same way: quantize/index.py)
        **(
            {"rounding": envs.get("VLLM_X86_QUANT_INT4_ROUNDING").strip().lower()}
            if bits == 4 and method == "rtn"
            else {}
        ),
        # a 4-bit grid of groups of 32 the Linear weights already had (grid_scan): "all"
        # (kept: every Linear layer in groups of 32, whatever group_size says), "none",
        # "partial" (rounded again into group_size), "off" (not asked for)
        **({"int4_grid": grid} if bits == 4 else {}),
        "prepacked": True,
        "layout": layout,
        "format_version": qformat.HEAD_CODES_VERSION
        if head is not None
        else qformat.FORMAT_VERSION,
        "quantized_layers": quantized,
        # the LM head's bits (0: bf16); stored in bf16 and quantized while loading
        # (lm_head.py), unless its GPTQ codes are in lm_head_codes
        "lm_head": head_bits,
        **({"lm_head_codes": qformat.HEAD_CODES} if head is not None else {}),
        # routed MoE experts: the layers whose experts are packed (moe.pack_experts);
        # experts written as they were are quantized while loading (moe.py)
        **(
            {
                "moe_experts": (
                    "packed"
                    if not moe["experts"]
                    else "quantized while loading"
                    if not n_packed
                    else "packed in packed_experts, the others quantized while loading"
                ),
                "packed_experts": sorted(expert_plan),
            }
            if n_packed or moe["experts"]
            else {}
        ),
    }
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    manifest = qformat.write_manifest(
        str(tmp),
        version=qformat.HEAD_CODES_VERSION if head is not None else qformat.FORMAT_VERSION,
        extra={
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
            "packed_expert_layers": len(expert_plan),
            "kept_expert_layers": experts_kept,
        },
    )
    tmp.rename(out)
    out_bytes = sum(v["bytes"] for v in manifest["files"].values())
    how = (
        "the weights' own 4-bit grid kept, groups of 32"
        if grid == "all"
        else "GPTQ, calibrated"
        if method == "gptq"
        else f"no calibration, groups rounded by {config['quantization_config']['rounding']}"
        if bits == 4
        else "no calibration, rounded to nearest per channel"
    )
    _say(
        progress,
        f"{name} ({how}): {len(quantized)} layers quantized, {len(kept)} kept; weights "
        f"{in_bytes / 2**20:.0f} MiB -> {out_bytes / 2**20:.0f} MiB in "
        f"{time.monotonic() - t0:.1f} s; serve it with: vllm-x86 serve {out}",
    )
    return manifest


def _keys(f) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(f), framework="pt") as sf:
        return list(sf.keys())


def _tensor(f, key: str, current, current_file):
    """A tensor of the checkpoint: from the file being read, or from another shard."""
    from safetensors import safe_open

    if f == current_file:
        return current.get_tensor(key)
    with safe_open(str(f), framework="pt") as sf:
        return sf.get_tensor(key)


def src_dtype(files) -> str:
    """The dtype of the first floating-point tensor of a checkpoint (for messages)."""
    from safetensors import safe_open

    with safe_open(str(files[0]), framework="pt") as sf:
        for key in sf.keys():
            t = sf.get_slice(key)
            if t.get_dtype() in ("BF16", "F16", "F32"):
                return {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}[t.get_dtype()]
    return "their dtype"


def _calibrate(
    src: Path,
    windows: int,
    group_size: int,
    kernel: str,
    progress,
    model_type=None,
    head_group: int | None = None,
) -> dict:
    """GPTQ codes of every quantizable Linear layer whose shape the kernel takes
    (gptq.sequential_gptq), running the checkpoint through transformers on the
    calibration text one decoder layer at a time; with `head_group`, the LM head's
    too (under gptq.HEAD)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vllm_x86.runtime.quant import methods as m
    from vllm_x86.tools.quantize import gptq

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
        if not is_quantizable(name + ".weight", (n, k), model_type):
            return None
        if m.int4_shape_problem(n, k, group_size, kernel):
            return None  # stays in the model's dtype, as the converter keeps it
        return m.effective_group_size(k, group_size)

    try:
        need = gptq.calibration_bytes(
            model, lambda name: is_quantizable(name + ".weight", (0, 0), model_type), windows, 512
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
            model,
            ids,
            group_size_of,
            lambda msg: _say(progress, "  GPTQ: " + msg),
            head_group=head_group,
        )
    except ValueError as e:  # a forward pass GPTQ cannot follow layer by layer
        raise ConvertError(f"GPTQ: {e}; use --method rtn") from None
    del model
    return codes


def _available_memory() -> int:
    import psutil

    return psutil.virtual_memory().available
