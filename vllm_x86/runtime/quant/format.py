"""The prepacked checkpoint format `vllm-x86 quantize` writes, and its checks.

A prepacked directory is a Hugging Face model directory whose safetensors hold the
tensors the plugin's INT8/INT4 methods run with (packed in the kernels' layout, under
vLLM's parameter names, fused projections whole), plus:

- config.json `quantization_config`: quant_method (x86_int8 | x86_int4), bits,
  group_size, zero_point, prepacked: true, layout (the kernels' packing), format_version,
  quantized_layers, and packed_experts (the MoE layers whose routed experts are packed,
  each expert's gate, up and down under its checkpoint names; format version 2);
  int4_grid (INT4: "all" when every Linear layer kept the 4-bit grid of groups of 32
  its weights had, stored in groups of 32 whatever group_size says; "none",
  "partial" or "off" otherwise: convert.grid_scan);
  lm_head (the LM head's bits, 0 for bf16) and lm_head_codes (format version 3: the
  file with its INT4 codes, x86/lm_head.safetensors: qweight [N, K/2] uint8, two codes
  a byte, even columns low; scale [K/g, N] bf16; zero [K/g, N] uint8);
- x86_quant.json: the format version and the size of every weight file, so that a
  truncated or replaced file is caught before anything is loaded.

Anything that does not match gives an error saying what to do, never a model that runs
on the wrong bytes: check_prepacked runs before vLLM starts (`vllm-x86 serve` and its
daemon), and the quantization config runs the same checks (check_config, check_files)
when vLLM itself loads the directory. The format records sizes, not checksums: hashing
every weight at each start would cost seconds a GB.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# Version 2: routed MoE experts packed too (quantization_config.packed_experts), which a
# reader of version 1 would load into bf16 parameters. Version 1 (MoE experts stored in
# bf16, quantized while loading; Linear layers as in version 2) still loads.
FORMAT_VERSION = 2
# Version 3: version 2 plus the LM head's INT4 codes (GPTQ) in quantization_config's
# lm_head_codes file, which a reader of version 2 would not load (it would round the
# bf16 head instead). Written only by checkpoints that have them.
HEAD_CODES_VERSION = 3
READS = (1, 2, 3)
MANIFEST = "x86_quant.json"
# The plugin's own files beside the weights (a subdirectory: vLLM's loader takes every
# *.safetensors at the top for weights), and the LM head's INT4 codes there (version 3).
OWN_DIR = "x86"
HEAD_CODES = f"{OWN_DIR}/lm_head.safetensors"


class FormatError(ValueError):
    """The checkpoint is not in a format this version of the plugin can load."""


QUANT_METHODS = ("x86_int8", "x86_int4")
AGAIN = "quantize the bf16 model again with `vllm-x86 quantize`"


def expected_layout(name: str, group_size: int = 128) -> str:
    """The layout `vllm-x86 quantize` writes (every INT4 group size: the plugin's)."""
    from vllm_x86.runtime.quant.methods import INT4_LAYOUT, INT8_LAYOUT

    return INT4_LAYOUT if name == "x86_int4" else INT8_LAYOUT


def check_config(config: dict[str, Any], name: str) -> None:
    if not config.get("prepacked"):
        return
    version = config.get("format_version")
    if version not in READS:
        raise FormatError(
            f"this {name} checkpoint is in prepacked format version {version!r}; this "
            f"vllm-x86 reads versions {', '.join(map(str, READS))}. Quantize the bf16 model again with "
            "`vllm-x86 quantize`, or serve the bf16 model with --quantization " + name
        )
    layout = config.get("layout")
    expected = expected_layout(name, config.get("group_size") or 128)
    if layout != expected:
        raise FormatError(
            f"this {name} checkpoint is packed as {layout!r}, and this vllm-x86 with this "
            f"vLLM packs as {expected!r}; quantize the bf16 model again"
        )


def check_prepacked(model_dir: str | os.PathLike) -> None:
    """Refuse a prepacked directory whose manifest or files are damaged (FormatError),
    before vLLM starts: config.json and x86_quant.json readable, format versions this
    vllm-x86 reads, every file the manifest lists there with its recorded size and every
    safetensors tensor inside its file. Any other directory passes (vLLM judges it)."""
    model_dir = os.fspath(model_dir)
    cfg_path = os.path.join(model_dir, "config.json")
    try:
        with open(cfg_path) as f:
            config = json.load(f)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as e:
        if os.path.exists(os.path.join(model_dir, MANIFEST)):
            raise FormatError(
                f"{cfg_path} of the prepacked checkpoint cannot be read ({_why(e)}); {AGAIN}"
            ) from None
        return
    qc = config.get("quantization_config") if isinstance(config, dict) else None
    if not isinstance(qc, dict) or qc.get("quant_method") not in QUANT_METHODS:
        return
    if not qc.get("prepacked"):
        return
    if qc.get("format_version") not in READS:
        raise FormatError(
            f"{cfg_path} says prepacked format version {qc.get('format_version')!r}; this "
            f"vllm-x86 reads versions {', '.join(map(str, READS))}: {AGAIN}"
        )
    check_files(model_dir)


def _why(e: BaseException) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"not valid JSON at line {e.lineno}, column {e.colno}: cut short or overwritten"
    return type(e).__name__ if not str(e) else f"{type(e).__name__}: {e}"


def _read_manifest(model_dir: str) -> dict[str, Any]:
    path = os.path.join(model_dir, MANIFEST)
    if not os.path.isfile(path):
        raise FormatError(
            f"{model_dir} says it is prepacked but has no {MANIFEST}; it was not written by "
            f"`vllm-x86 quantize` or is incomplete; {AGAIN}"
        )
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise FormatError(f"{path} is damaged ({_why(e)}); {AGAIN}") from None
    damaged = f"{path} is damaged (no list of files with their sizes); {AGAIN}"
    if not isinstance(manifest, dict):
        raise FormatError(damaged)
    if manifest.get("format_version") not in READS:
        raise FormatError(
            f"{path} is format version {manifest.get('format_version')!r}, this "
            f"vllm-x86 reads {', '.join(map(str, READS))}; {AGAIN}"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("bytes"), int) for v in files.values()
    ):
        raise FormatError(damaged)
    return manifest


def check_files(model_dir: str) -> None:
    """Every file the manifest names exists with the recorded size, and every
    tensor of every safetensors file lies inside that file."""
    manifest = _read_manifest(model_dir)
    for name, info in manifest["files"].items():
        fpath = os.path.join(model_dir, name)
        if not os.path.isfile(fpath):
            raise FormatError(
                f"{fpath} is missing from the prepacked checkpoint ({MANIFEST} lists it); "
                f"copy it again or {AGAIN}"
            )
        size = os.path.getsize(fpath)
        if size != info["bytes"]:
            raise FormatError(
                f"{fpath} is {size} bytes, the checkpoint was written with "
                f"{info['bytes']}: the file is truncated or was replaced; copy it again or "
                f"{AGAIN}"
            )
        if name.endswith(".safetensors"):
            _check_safetensors(fpath, size)


def _check_safetensors(fpath: str, size: int) -> None:
    damaged = f"{fpath} has a damaged safetensors header; copy it again or {AGAIN}"
    with open(fpath, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise FormatError(f"{fpath} is not a safetensors file (too short); {AGAIN}")
        n = int.from_bytes(head, "little")
        if n <= 0 or 8 + n > size:
            raise FormatError(damaged)
        try:
            header = json.loads(f.read(n))
            spans = [
                (key, *t["data_offsets"]) for key, t in header.items() if key != "__metadata__"
            ]
        except (ValueError, TypeError, KeyError, AttributeError):
            raise FormatError(damaged) from None
    end = 8 + n
    for key, lo, hi in spans:
        if end + hi > size or lo > hi:
            raise FormatError(
                f"{fpath}: tensor {key} lies past the end of the file (truncated); {AGAIN}"
            )


def write_manifest(
    out_dir: str, extra: dict[str, Any] | None = None, version: int = FORMAT_VERSION
) -> dict[str, Any]:
    names = [n for n in sorted(os.listdir(out_dir)) if n.endswith(".safetensors")]
    own = os.path.join(out_dir, OWN_DIR)
    if os.path.isdir(own):
        names += [f"{OWN_DIR}/{n}" for n in sorted(os.listdir(own)) if n.endswith(".safetensors")]
    files = {name: {"bytes": os.path.getsize(os.path.join(out_dir, name))} for name in names}
    manifest = {"format_version": version, "files": files, **(extra or {})}
    with open(os.path.join(out_dir, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    return manifest


@dataclass
class Codes:
    """INT4 codes of one weight two to a byte, with their scales and zero points: GPTQ's
    result until the converter packs it, and the LM head's codes file
    (x86/lm_head.safetensors) as written and read."""

    nibbles: torch.Tensor  # [N, K/2] uint8: even columns low, odd columns high
    scale: torch.Tensor  # [K/g, N] bf16
    zero: torch.Tensor  # [K/g, N] int32

    @classmethod
    def of(cls, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> Codes:
        import torch

        return cls((q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8), scale, zero)

    def unpack(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What ``quantize_int4_gptq`` returned: (q [N, K] int32, scale, zero)."""
        import torch

        p = self.nibbles.to(torch.int32)
        q = torch.stack([p & 15, p >> 4], -1).reshape(p.shape[0], -1)
        return q, self.scale, self.zero
