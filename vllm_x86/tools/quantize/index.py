"""The prepacked checkpoints `vllm-x86 quantize` wrote, by the model they came from, so
that `vllm-x86 serve MODEL --quantization x86_int8|x86_int4` (and the playground's
INT8/INT4 switch, which goes through the same command line) serves one of them instead
of quantizing the same weights again while loading, and says so.

A JSON file in the source model's directory (``.vllm-x86-prepacked.json``, beside the
compile-ahead record ``.vllm-x86-compiled.json``): one entry per output directory, with
a fingerprint of the source's weight files (name, size, modification time). A source
directory the user cannot write (a read-only model store) gets no record, and quantize
says so. A prepacked directory is used only when

- it still exists, passes the format's own check (quant/format.py) and its source still
  has the fingerprint it had (the same weights);
- it was written with the settings the server would quantize with: the bits, INT4's
  group size and zero points (VLLM_X86_QUANT_GROUP_SIZE, VLLM_X86_QUANT_ZERO_POINT) and
  the LM head's precision (VLLM_X86_QUANT_LM_HEAD);
- it is at least as good as quantizing again: GPTQ (calibrated), or INT4 rounded the
  way the server would round it (VLLM_X86_QUANT_INT4_ROUNDING; INT8 has one rounding);
  with VLLM_X86_QUANT_INT4_GRID on, written under it too (quantization_config's
  int4_grid: "all", every Linear layer kept on the 4-bit grid it had, or "none", no
  layer had one), since a checkpoint rounded again would lose what the server keeps.

Among several, GPTQ first, then the newest. VLLM_X86_USE_PREPACKED=0 turns it off.
A small file of our own because nothing in vLLM or the Hugging Face cache records
derived checkpoints of a local model.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

INDEX_NAME = ".vllm-x86-prepacked.json"


def index_path(model_dir) -> Path:
    return Path(model_dir).resolve() / INDEX_NAME


def fingerprint(model_dir: str | os.PathLike) -> str:
    """The weight files (and config.json) of a model directory: names, sizes, mtimes."""
    root = Path(model_dir)
    h = hashlib.sha256()
    for f in sorted(root.iterdir()):
        if f.is_file() and (f.suffix in (".safetensors", ".bin") or f.name == "config.json"):
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()[:32]


def _load(path: Path) -> list[dict]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    entries = data.get("entries") if isinstance(data, dict) else None
    return [e for e in entries or [] if isinstance(e, dict)]


def record(model_dir, out_dir) -> str | None:
    """Note in `model_dir` that `out_dir` is a prepacked checkpoint of it (after a
    quantize). None, or why it could not be noted."""
    path = index_path(model_dir)
    src, out = str(Path(model_dir).resolve()), str(Path(out_dir).resolve())
    entries = [e for e in _load(path) if e.get("out") != out and Path(e.get("out", "")).is_dir()]
    entries.append({"fingerprint": fingerprint(src), "out": out, "written": time.time()})
    try:
        fd, tmp = tempfile.mkstemp(prefix=".vllm-x86-prepacked-", dir=src)
        with os.fdopen(fd, "w") as f:
            json.dump({"entries": entries}, f, indent=1)
        os.replace(tmp, path)
    except OSError as e:
        return f"{src} cannot be written ({e.strerror or e})"
    return None


def wanted(bits: int) -> dict:
    """The settings `--quantization x86_int{bits}` would quantize with while loading
    (scope.options and methods.int4_rounding read them as the server does)."""
    from vllm_x86.runtime import envs
    from vllm_x86.runtime.quant import methods, scope

    group_size, zero_point, head = scope.options(bits)
    out = {"bits": bits, "lm_head": head}
    if bits == 4:
        out.update(
            group_size=group_size,
            zero_point=zero_point,
            rounding=methods.int4_rounding(),
            grid=envs.get_bool("VLLM_X86_QUANT_INT4_GRID"),
        )
    return out


def _matches(qc: dict, want: dict) -> bool:
    if qc.get("prepacked") is not True or qc.get("bits") != want["bits"]:
        return False
    if int(qc.get("lm_head") or 0) != want["lm_head"]:
        return False
    if want["bits"] == 8:
        return True
    if (
        qc.get("group_size") != want["group_size"]
        or bool(qc.get("zero_point")) != (want["zero_point"])
    ):
        return False
    # the 4-bit grid rule as the server would apply it (convert.grid_scan): a checkpoint
    # written before it ("int4_grid" missing) or with the other setting rounds otherwise
    grid = qc.get("int4_grid")
    if want["grid"] and want["zero_point"]:
        if grid == "all":
            return True  # every Linear layer on its own grid: the rounding is moot
        if grid != "none":
            return False
    elif grid not in ("off", "none", "partial"):
        return False
    method = qc.get("method")
    return method == "gptq" or (method == "rtn" and qc.get("rounding") == want["rounding"])


def find(model_dir, bits: int) -> dict | None:
    """The best usable prepacked checkpoint of `model_dir` for `--quantization
    x86_int{bits}`: {"out", "method", "written"}; None if there is none (also when a
    quantization setting is invalid: the server then says which)."""
    from vllm_x86.runtime import envs
    from vllm_x86.runtime.quant.format import FormatError, check_prepacked

    if not envs.get_bool("VLLM_X86_USE_PREPACKED"):
        return None
    src = str(Path(model_dir).resolve())
    entries = _load(index_path(src))
    if not entries:
        return None
    fp = fingerprint(src)
    try:
        want = wanted(bits)
    except ValueError:
        return None
    found = []
    for e in entries:
        out = Path(e.get("out", ""))
        if e.get("fingerprint") != fp or not (out / "config.json").is_file():
            continue
        try:
            qc = json.loads((out / "config.json").read_text()).get("quantization_config") or {}
            if not _matches(qc, want):
                continue
            check_prepacked(str(out))
        except (OSError, ValueError, FormatError):
            continue
        found.append({"out": str(out), "method": qc.get("method"), "written": e.get("written", 0)})
    found.sort(key=lambda x: (x["method"] == "gptq", x["written"]), reverse=True)
    return found[0] if found else None
