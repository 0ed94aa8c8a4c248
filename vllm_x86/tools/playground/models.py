"""What the playground may serve: the catalog, the local cache, prepacked INT8/INT4
directories and folders the user named at start (--models-dir), each with the facts the
page shows (architecture, parameter count, size on disk, dtype, quantization, whether
`vllm-x86 check` passed it), and the checks made before a model is loaded: the path is
inside an allowed folder and is a model directory, vLLM knows its architecture, and its
weights fit in the memory there is, so that a bad choice is refused while the model
that serves keeps serving.

Parameter counts come from the safetensors headers (8 bytes of length, then JSON with
every tensor's shape: read directly, no weights loaded); for a prepacked directory, whose
tensors are packed, from its config (the usual decoder formula).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

GiB = 1 << 30
PRECISIONS = ("bf16", "int8", "int4")
QUANT_OF = {"int8": "x86_int8", "int4": "x86_int4"}
PRECISION_OF = {v: k for k, v in QUANT_OF.items()}
MIN_LEN, MAX_LEN = 16, 131072
# Beyond the weights: the KV cache the plugin reserves (at least 1 GiB) and the server's
# processes (Python, torch, vLLM's engine), measured about 1.5 GiB for the default model.
OVERHEAD_BYTES = int(2.5 * GiB)


class PlaygroundError(Exception):
    """A request the playground refuses: an HTTP status and a sentence for the page."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


# ----------------------------------------------------------------------------- roots


def cache_root() -> Path:
    from vllm_x86.tools.models.pull import models_dir

    return models_dir()


def allowed_roots(extra: list[str] | tuple[str, ...] = ()) -> list[Path]:
    """The folders models may be loaded from: the cache's models folder and `extra`."""
    out: list[Path] = []
    for p in [cache_root(), *map(Path, extra)]:
        r = Path(os.path.realpath(os.path.expanduser(str(p))))
        if r not in out:
            out.append(r)
    return out


def _inside(path: Path, root: Path) -> bool:
    try:
        return os.path.commonpath([str(path), str(root)]) == str(root)
    except ValueError:
        return False


def check_path(raw: str, roots: list[Path]) -> Path:
    """The real directory of `raw` when it is a model directory inside an allowed root;
    PlaygroundError (403 outside the roots, 400 otherwise) with a sentence."""
    if not isinstance(raw, str) or not raw.strip():
        raise PlaygroundError(400, "the model path is empty: give the absolute path of a folder")
    given = os.path.expanduser(raw.strip())
    if not os.path.isabs(given):
        raise PlaygroundError(
            400, f"'{raw}' is not an absolute path: give the full path of a model folder"
        )
    real = Path(os.path.realpath(given))
    if not any(_inside(real, r) for r in roots):
        raise PlaygroundError(
            403,
            f"{given} is outside the folders this playground may load from "
            f"({', '.join(map(str, roots))}); start it with --models-dir DIR to add a folder.",
        )
    if not real.exists():
        raise PlaygroundError(400, f"{given} does not exist.")
    if not real.is_dir():
        raise PlaygroundError(400, f"{given} is a file, not a model folder.")
    if not (real / "config.json").is_file():
        raise PlaygroundError(
            400, f"{given} is not a model folder: it has no config.json (a Hugging Face model "
            "directory has config.json, tokenizer files and safetensors weights).",
        )  # fmt: skip
    return real


# ----------------------------------------------------------------------------- facts


def read_config(path: Path) -> dict:
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def size_on_disk(path: Path) -> int:
    total = 0
    for dirpath, _dirs, names in os.walk(path):
        for n in names:
            try:
                total += os.stat(os.path.join(dirpath, n)).st_size
            except OSError:
                pass
    return total


def weights_bytes(path: Path) -> int:
    total = 0
    for pattern in ("*.safetensors", "*.bin", "*.pt"):
        for p in path.glob(pattern):
            try:
                total += p.stat().st_size
            except OSError:
                pass
    return total


def _safetensors_params(path: Path) -> int | None:
    """Parameters counted from the safetensors headers (the plan per rank's reader)."""
    from math import prod

    from vllm_x86.runtime.parallel_plan import safetensors_tensors

    tensors = safetensors_tensors(path)
    if tensors is None:
        return None
    return sum(prod(shape) for _, shape, _ in tensors.values()) or None


def _config_params(cfg: dict) -> int | None:
    """A decoder's parameter count from its config (attention, MLP, embeddings, norms)."""
    c = cfg.get("text_config", cfg)
    try:
        h = int(c["hidden_size"])
        layers = int(c["num_hidden_layers"])
        inter = int(c["intermediate_size"])
        vocab = int(c["vocab_size"])
        heads = int(c["num_attention_heads"])
    except (KeyError, TypeError, ValueError):
        return None
    kv = int(c.get("num_key_value_heads") or heads)
    hd = int(c.get("head_dim") or h // heads)
    attn = h * heads * hd * 2 + h * kv * hd * 2
    mlp = 3 * h * inter
    emb = vocab * h * (1 if c.get("tie_word_embeddings", cfg.get("tie_word_embeddings")) else 2)
    return layers * (attn + mlp + 2 * h) + emb + h


def _prepacked_method(path: Path, cfg: dict) -> str | None:
    from vllm_x86.runtime.quant.format import MANIFEST, QUANT_METHODS

    qc = cfg.get("quantization_config") or {}
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    if method in QUANT_METHODS and (path / MANIFEST).is_file():
        return method
    return None


def _checked(path: Path) -> bool | None:
    """Whether `vllm-x86 check` passed this directory as it is on disk now (its recorded
    verdict, check.read_verdict); None when it was never checked or changed since."""
    from vllm_x86.tools.conformance.check import read_verdict

    record = read_verdict(path)
    return None if record is None else record["passed"]


def describe(path: Path, source: str, id_: str | None = None, name: str | None = None) -> dict:
    """The page's Model record of a model directory."""
    cfg = read_config(path)
    archs = cfg.get("architectures") or []
    method = _prepacked_method(path, cfg)
    qc = cfg.get("quantization_config")
    quant = method or (qc.get("quant_method") if isinstance(qc, dict) else None)
    params = _config_params(cfg) if method else _safetensors_params(path)
    if params is None:
        params = _config_params(cfg)
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or cfg.get("text_config", {}).get("dtype")
    if method and source in ("cache", "local"):
        source = "prepacked"
    return {
        "id": id_ or str(path),
        "name": name or path.name,
        "source": source,
        "pulled": True,
        "path": str(path),
        "architecture": archs[0] if archs else None,
        "params": params,
        "size_bytes": size_on_disk(path),
        "dtype": str(dtype) if dtype else None,
        "quantization": quant,
        "checked": _checked(path),
        "default": False,
        "description": None,
    }


def _catalog_record(m, default: bool) -> dict:
    from vllm_x86.tools.models.pull import cached_path

    path = cached_path(m.name)
    if path is not None:
        rec = describe(path, "catalog", m.name, m.name)
    else:
        arch = re.match(r"(\w+) architecture", m.about)
        params = re.search(r"(\d+(?:\.\d+)?)([MB]) params", m.about)
        rec = {
            "id": m.name,
            "name": m.name,
            "source": "catalog",
            "pulled": False,
            "path": None,
            "architecture": arch.group(1) if arch else None,
            "params": int(float(params.group(1)) * (1e6 if params.group(2) == "M" else 1e9))
            if params
            else None,
            "size_bytes": None,
            "dtype": "bfloat16",
            "quantization": None,
            "checked": None,
            "default": False,
            "description": None,
        }
    rec["quantization"] = f"gguf {m.quantization.lower()} -> bf16"
    rec["default"] = default
    rec["description"] = m.description
    return rec


def _model_dirs(root: Path) -> list[Path]:
    """`root` itself when it is a model directory, else its model subdirectories."""
    if (root / "config.json").is_file():
        return [root]
    try:
        subs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []
    return [p for p in subs if (p / "config.json").is_file()]


def list_models(extra_roots: list[str] | tuple[str, ...] = ()) -> list[dict]:
    """Every model the playground may serve, the default model first."""
    from vllm_x86.tools.models.catalog import CATALOG, DEFAULT_MODEL
    from vllm_x86.tools.models.pull import cached_path

    names = [DEFAULT_MODEL] + [n for n in CATALOG if n != DEFAULT_MODEL]
    out = [_catalog_record(CATALOG[n], n == DEFAULT_MODEL) for n in names]
    seen = {os.path.realpath(r["path"]) for r in out if r["path"]}
    seen |= {os.path.realpath(p) for n in CATALOG if (p := cached_path(n))}
    roots = allowed_roots(extra_roots)
    for i, root in enumerate(roots):
        for d in _model_dirs(root):
            real = os.path.realpath(d)
            if real in seen:
                continue
            seen.add(real)
            out.append(describe(Path(real), "cache" if i == 0 else "local"))
    return out


# ----------------------------------------------------------------------------- load checks


@dataclass
class LoadPlan:
    """What to ask the daemon for: the model argument and the vLLM flags."""

    id: str  # the page's id (catalog name, or the directory)
    model: str  # what `vllm-x86 serve` takes (catalog name or absolute path)
    path: Path
    precision: str
    max_model_len: int | None
    quantization: str | None  # --quantization for on-the-fly INT8/INT4

    def flags(self) -> list[str]:
        out: list[str] = []
        if self.max_model_len:
            out += ["--max-model-len", str(self.max_model_len)]
        if self.quantization:
            out += ["--quantization", self.quantization]
        return out


def validate_load(body: dict) -> tuple[str, str | None, int | None]:
    """(model, precision or None, max_model_len or None) of a /api/load body."""
    if not isinstance(body, dict):
        raise PlaygroundError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - {"model", "precision", "max_model_len"})
    if unknown:
        raise PlaygroundError(
            400, f"unknown field(s) {', '.join(unknown)}: /api/load takes model, precision "
            "and max_model_len",
        )  # fmt: skip
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise PlaygroundError(400, "choose a model: 'model' is a catalog name or a folder path")
    precision = body.get("precision")
    if precision is not None and precision not in PRECISIONS:
        raise PlaygroundError(400, f"precision must be one of bf16, int8, int4 (got {precision!r})")
    mml = body.get("max_model_len")
    if mml is not None:
        if isinstance(mml, bool) or not isinstance(mml, int):
            raise PlaygroundError(400, f"max context must be a whole number (got {mml!r})")
        if not MIN_LEN <= mml <= MAX_LEN:
            raise PlaygroundError(
                400, f"max context must be between {MIN_LEN} and {MAX_LEN} tokens (got {mml})"
            )
    return model.strip(), precision, mml


def plan_load(body: dict, roots: list[Path]) -> LoadPlan:
    """The checks made before anything is stopped: the model exists and is allowed, and
    its precision fits it. Raises PlaygroundError."""
    from vllm_x86.runtime.quant.format import FormatError, check_prepacked
    from vllm_x86.tools.models.catalog import lookup
    from vllm_x86.tools.models.pull import cached_path

    model, precision, mml = validate_load(body)
    entry = lookup(model)
    if entry is not None:
        path = cached_path(entry.name)
        if path is None:
            raise PlaygroundError(
                409, f"{entry.name} is not downloaded yet: press its download button (or run "
                f"`vllm-x86 pull {entry.name}`), then load it.",
            )  # fmt: skip
        path = Path(os.path.realpath(path))
        id_, arg = entry.name, entry.name
    elif "/" in model and not os.path.isabs(os.path.expanduser(model)):
        raise PlaygroundError(
            400, f"'{model}' is neither a catalog name nor an absolute folder path; the "
            "playground loads catalog models and folders inside its model folders.",
        )  # fmt: skip
    elif os.sep not in model and not model.startswith("~"):
        from vllm_x86.tools.models.pull import unknown_model_message

        raise PlaygroundError(400, unknown_model_message(model))
    else:
        path = check_path(model, roots)
        id_, arg = str(path), str(path)
    cfg = read_config(path)
    method = _prepacked_method(path, cfg)
    quantization = None
    if method:
        packed = PRECISION_OF[method]
        if precision not in (None, packed):
            raise PlaygroundError(
                400, f"{path.name} is a prepacked {packed.upper()} model: it serves in "
                f"{packed.upper()} only (choose precision {packed}, or load its bf16 model "
                f"for {precision}).",
            )  # fmt: skip
        precision = packed
        try:
            check_prepacked(path)
        except FormatError as e:
            raise PlaygroundError(400, str(e)) from None
    else:
        precision = precision or "bf16"
        quantization = QUANT_OF.get(precision)
    return LoadPlan(id_, arg, path, precision, mml, quantization)


_SUPPORTED: frozenset[str] | None = None


def supported_architectures() -> frozenset[str]:
    """vLLM's registered architectures (imports vLLM once, lazily: about 10 s)."""
    global _SUPPORTED
    if _SUPPORTED is None:
        from vllm.model_executor.models.registry import ModelRegistry

        _SUPPORTED = frozenset(ModelRegistry.get_supported_archs())
    return _SUPPORTED


def check_architecture(plan: LoadPlan, supported=supported_architectures) -> None:
    cfg = read_config(plan.path)
    archs = cfg.get("architectures") or []
    if not archs:
        raise PlaygroundError(
            400, f"{plan.path.name}'s config.json names no architecture, so vLLM cannot tell "
            "which model code to run.",
        )  # fmt: skip
    known = supported()
    if not any(a in known for a in archs):
        raise PlaygroundError(
            400, f"{plan.path.name} is a {archs[0]}, an architecture vLLM does not implement; "
            "it cannot be served (docs/porting.md says how to add one).",
        )  # fmt: skip


def mem_available() -> int:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def check_memory(plan: LoadPlan, freed_bytes: int = 0, available: int | None = None) -> None:
    """Refuse weights that cannot fit: their size plus the server's overhead against the
    memory available now plus what stopping the current model frees."""
    need = weights_bytes(plan.path) + OVERHEAD_BYTES
    have = (mem_available() if available is None else available) + freed_bytes
    if need > have:
        raise PlaygroundError(
            400, f"{plan.path.name} is too big for this machine's memory: its weights are "
            f"{weights_bytes(plan.path) / GiB:.1f} GiB and a server needs about "
            f"{need / GiB:.1f} GiB in all, but {have / GiB:.1f} GiB is available. Choose a "
            "smaller model or INT8/INT4 prepacked weights (`vllm-x86 quantize`).",
        )  # fmt: skip


def group_rss(pgid: int | None) -> int:
    """Resident memory of a process group (the model server's processes)."""
    if not pgid:
        return 0
    from vllm_x86.tools.daemon.paths import group_members

    total = 0
    for pid in group_members(pgid):
        try:
            for line in open(f"/proc/{pid}/status"):
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            pass
    return total
