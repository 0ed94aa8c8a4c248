"""`vllm-x86 check MODEL_DIR`: can this checkpoint run on the plugin, correctly?

The same check the conformance suite runs on every architecture of the support matrix,
on a user's checkpoint, with a verdict per stage:

1. architecture: config.json names an architecture vLLM implements (natively or through
   its transformers backend), and transformers has it (the reference); the support
   matrix's status for it, if it is there.
2. ops: the model loads in vLLM on this CPU and every op it uses has an implementation
   here: the plugin's kernel, vLLM's CPU kernel, or PyTorch; listed per op.
3. parity: greedy tokens and log-probabilities against transformers on the same prompt
   token ids (fp32, then bf16; eager, and compiled with --compiled), with the suite's
   tolerances (vllm_x86/tools/conformance/conformance.py).
4. speed: decode tokens/s of one request (bf16 eager).

With weights up to --max-real-gib (default 1 GiB) the real weights are used; beyond
that, or with --tiny, a tiny random-weight copy of the config (the suite's shrink,
vllm_x86/tools/conformance/tiny.py): that checks the code paths, not the weights, and its speed
says nothing about the real model's.

Each run records its verdict (``verdict.json`` in the model's check directory, beside the
transformers references; ``read_verdict``) with the weights' size and newest change time,
so a tool (the playground's model list) can say whether this checkpoint, as it is on disk
now, has passed; a verdict on other weights reads as none.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

STAGES = ("architecture", "ops", "parity", "speed")


class CheckError(Exception):
    pass


def _say(msg: str = "") -> None:
    print(msg, flush=True)


def read_config(model_dir: Path) -> dict:
    cfg = model_dir / "config.json"
    if not cfg.is_file():
        raise CheckError(f"{model_dir} has no config.json: not a Hugging Face model directory")
    return json.loads(cfg.read_text())


def weights_bytes(model_dir: Path) -> int:
    return sum(p.stat().st_size for p in model_dir.glob("*.safetensors")) + sum(
        p.stat().st_size for p in model_dir.glob("*.bin")
    )


def stage_architecture(cfg: dict) -> tuple[bool, list[str], str]:
    """(ok, lines, arch)."""
    archs = cfg.get("architectures") or []
    if not archs:
        return False, ["config.json lists no architectures"], ""
    arch = archs[0]
    lines = []
    from vllm.model_executor.models.registry import (
        _TEXT_GENERATION_MODELS,
        _TRANSFORMERS_SUPPORTED_MODELS,
        ModelRegistry,
    )

    ok = True
    if arch in _TEXT_GENERATION_MODELS:
        lines.append(f"{arch}: vLLM text-generation model ({_TEXT_GENERATION_MODELS[arch][0]}.py)")
    elif arch in _TRANSFORMERS_SUPPORTED_MODELS:
        lines.append(f"{arch}: runs through vLLM's transformers backend (no native vLLM model)")
    elif arch in ModelRegistry.get_supported_archs():
        lines.append(f"{arch}: registered in vLLM (not a plain text-generation model)")
    else:
        ok = False
        lines.append(
            f"{arch}: vLLM does not know this architecture. Register an implementation "
            "(ModelRegistry.register_model, see docs/porting.md) or use a supported one."
        )
    import transformers

    if hasattr(transformers, arch):
        lines.append(f"transformers has {arch}: it is the reference for the parity stage")
    else:
        lines.append(f"transformers has no {arch}: the parity stage cannot run")
    status = matrix_status(arch)
    if status is None:
        lines.append(
            "support matrix: not found (docs/supported_models.json, which a built wheel "
            "carries as vllm_x86/tools/conformance/supported_models.json)"
        )
    elif status:
        lines.append("support matrix: " + ", ".join(f"{m} {s}" for m, s in status.items()))
    else:
        lines.append(
            "support matrix: not in the suite's table (vllm_x86/tools/conformance/archs.py)"
        )
    return ok, lines, arch


def matrix_path() -> Path | None:
    """The support matrix: the copy a built wheel carries (setup.py puts it there), else
    the checkout's docs/supported_models.json; None when neither is there."""
    here = Path(__file__).resolve()
    for path in (
        here.parent / "supported_models.json",
        here.parents[3] / "docs" / "supported_models.json",
    ):
        if path.is_file():
            return path
    return None


def matrix_status(arch: str) -> dict[str, str] | None:
    """{mode: status} of `arch` in the support matrix ({} if it is not there), or None
    when the matrix cannot be read."""
    path = matrix_path()
    try:
        data = json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError):
        data = None
    if data is None:
        return None
    row = data.get("archs", {}).get(arch)
    return {m: e["status"] for m, e in (row or {}).get("modes", {}).items()}


def tiny_copy(model_dir: Path, arch: str):
    """The suite's shrink applied to the user's config; returns (config, gain)."""
    import transformers
    from transformers import AutoConfig

    from vllm_x86.tools.conformance import tiny
    from vllm_x86.tools.conformance.archs import BY_NAME

    if not hasattr(transformers, arch):
        raise CheckError(f"transformers has no {arch}: cannot build a reference copy")
    user = AutoConfig.from_pretrained(str(model_dir))
    row = BY_NAME.get(arch)
    text = user.get_text_config() if hasattr(user, "get_text_config") else user
    d = text.to_dict()
    n_layers = d.get("num_hidden_layers")
    # per-layer lists are rebuilt by the config class for the new depth
    keep = {
        k: v
        for k, v in d.items()
        if not (isinstance(v, list) and n_layers and len(v) == n_layers)
        and k not in ("architectures", "transformers_version", "model_type", "dtype", "torch_dtype")
        and not k.startswith("_")
    }
    for k in ("quantization_config", "auto_map"):
        keep.pop(k, None)
    kwargs = {**keep, **tiny.shrink_kwargs(d, row.extra if row else None)}
    cfg = type(text)(**kwargs)
    cfg.architectures = [arch]
    return cfg, (row.gain if row else tiny.LAYER_GAIN)


def run_check(
    model_dir: Path,
    use_tiny: bool | None = None,
    compiled: bool = False,
    max_real_gib: float = 1.0,
    speed_tokens: int = 64,
) -> int:
    from vllm_x86.tools.conformance import conformance as conf
    from vllm_x86.tools.conformance import tiny

    model_dir = Path(model_dir).expanduser().resolve()
    if not model_dir.is_dir():
        raise CheckError(f"{model_dir} is not a directory")
    cfg = read_config(model_dir)
    verdicts: dict[str, str] = {}

    _say(f"== 1. architecture ({model_dir})")
    ok, lines, arch = stage_architecture(cfg)
    for ln in lines:
        _say("   " + ln)
    verdicts["architecture"] = "ok" if ok else "FAIL"
    if not ok:
        return _summary(verdicts, model_dir)

    size = weights_bytes(model_dir)
    if use_tiny is None:
        use_tiny = size == 0 or size > max_real_gib * 2**30
    if use_tiny:
        _say(
            f"   weights: {size / 2**30:.2f} GiB: checking a tiny random-weight copy of the "
            "config (code paths, not these weights)"
        )
        tcfg, gain = tiny_copy(model_dir, arch)
        from vllm_x86.tools.conformance.archs import BY_NAME as _rows

        hub_format = _rows[arch].hub_format if arch in _rows else ""
        run_dir = tiny.build(arch, tcfg, gain=gain, hub_format=hub_format)
        vocab = tiny.text_config(tcfg).vocab_size
        ref_cache = None
    else:
        _say(f"   weights: {size / 2**30:.2f} GiB: checking the real weights")
        run_dir = model_dir
        text = cfg.get("text_config", cfg)
        vocab = int(text.get("vocab_size") or cfg.get("vocab_size"))
        ref_cache = reference_cache(model_dir)
    prompt = tiny.prompt_ids(vocab)
    prep = conf.Prepared(arch, str(run_dir), prompt)
    conf.fill_references(prep, ref_cache)
    for why in prep.ref_errors.values():
        _say("   " + why)

    modes = ["fp32-eager", "bf16-eager"] + (["fp32-compiled", "bf16-compiled"] if compiled else [])
    jobs = parity_jobs(prep, modes)
    jobs[0]["inventory"] = True
    speed_job = next(j for j in jobs if j["id"].endswith("bf16-eager"))
    speed_job["speed_tokens"] = speed_tokens
    _say(f"   running vLLM: {', '.join(modes)} (one worker process, one run at a time)")
    results = conf.run_jobs(jobs)

    _say("== 2. ops")
    first = results.get(jobs[0]["id"], {})
    if first.get("ok"):
        for row in sorted(first.get("ops", []), key=lambda r: (r["path"], r["op"])):
            n = f" x{row['count']}" if row["count"] else ""
            _say(f"   {row['op']:<28} {row['class']:<34} {row['path']}{n}")
        verdicts["ops"] = "ok"
    else:
        _say(f"   the model did not load or run in vLLM: {first.get('error', 'no result')}")
        tb = first.get("traceback", "")
        if tb:
            _say("   " + "\n   ".join(tb.strip().splitlines()[-8:]))
        verdicts["ops"] = "FAIL"

    _say("== 3. parity with transformers")
    all_ok = True
    for job in jobs:
        mode = job["id"].split(":", 1)[1]
        res = results.get(job["id"], {"ok": False, "error": "no result"})
        v = conf.judge(prep, mode, res)
        all_ok &= v.ok
        m = v.metrics
        detail = ", ".join(
            f"{k} {m[k]:.3g}" if isinstance(m.get(k), float) else f"{k} {m[k]}"
            for k in ("tokens_equal", "prompt_lp_err", "lp_tol")
            if k in m
        )
        _say(
            f"   {mode:<14} {'ok' if v.ok else 'FAIL'}  {detail}{'  ' + v.reason if v.reason else ''}"
        )
    verdicts["parity"] = "ok" if all_ok else "FAIL"

    _say("== 4. speed (bf16 eager, one request)")
    sp = results.get(speed_job["id"], {}).get("speed")
    if sp:
        note = " (tiny random copy: not the real model's speed)" if use_tiny else ""
        _say(
            f"   {sp['decode_tok_s']} tokens/s decode, {sp['prefill_s'] * 1000:.0f} ms for a "
            f"{len(prompt)}-token prompt{note}"
        )
        verdicts["speed"] = "ok"
    else:
        _say("   no speed run (the bf16 eager run failed)")
        verdicts["speed"] = "FAIL"
    return _summary(verdicts, model_dir, tiny=use_tiny, compiled=compiled)


def reference_cache(model_dir: Path) -> Path:
    """Where the transformers references of a real checkpoint are kept (not inside the
    user's model directory)."""
    from vllm_x86.tools.conformance import tiny

    key = hashlib.sha256(str(Path(model_dir).resolve()).encode()).hexdigest()[:12]
    return Path(tiny.tiny_root()).parent / "check" / key


def parity_jobs(prep, modes, new_tokens: int | None = None, max_model_len: int | None = None):
    """The vLLM jobs of the parity stage: one per mode, with the architecture's engine
    arguments from the suite's table (vllm_x86/tools/conformance/archs.py)."""
    from vllm_x86.tools.conformance import conformance as conf
    from vllm_x86.tools.conformance.archs import BY_NAME

    row = BY_NAME.get(prep.arch)
    engine = dict(row.engine) if row else {}
    if max_model_len:
        engine["max_model_len"] = max_model_len
    jobs = [conf.make_job(prep, m, engine) for m in modes]
    for job in jobs:
        job["max_tokens"] = new_tokens or job["max_tokens"]
    return jobs


def parity_on_weights(
    model_dir: Path,
    prompt: list[int],
    modes=("fp32-eager", "bf16-eager"),
    new_tokens: int | None = None,
    ref_cache: Path | None = None,
):
    """The parity stage alone, on a checkpoint's own weights and the given prompt ids.

    Returns (prepared, vLLM results by job id, verdicts by mode); the verdicts are the
    conformance suite's (`conformance.judge`, its tolerances unchanged)."""
    from vllm_x86.tools.conformance import conformance as conf

    model_dir = Path(model_dir)
    arch = read_config(model_dir)["architectures"][0]
    n = new_tokens or conf.NEW_TOKENS
    prep = conf.Prepared(arch, str(model_dir), list(prompt))
    conf.fill_references(prep, ref_cache or reference_cache(model_dir), new_tokens=n)
    # room for the prompt and the new tokens (the suite's MAX_MODEL_LEN fits its own)
    max_len = max(conf.MAX_MODEL_LEN, len(prompt) + n)
    jobs = parity_jobs(prep, list(modes), n, max_len)
    results = conf.run_jobs(jobs)
    verdicts = {
        j["id"].split(":", 1)[1]: conf.judge(
            prep, j["id"].split(":", 1)[1], results.get(j["id"], {"ok": False})
        )
        for j in jobs
    }
    return prep, results, verdicts


def _weights_stamp(model_dir: Path) -> dict:
    """Size and newest change time of the checkpoint's files (what a verdict is about)."""
    size, newest = 0, 0.0
    for f in Path(model_dir).iterdir():
        if f.is_file():
            st = f.stat()
            size += st.st_size
            newest = max(newest, st.st_mtime)
    return {"bytes": size, "mtime": newest}


def verdict_path(model_dir: Path) -> Path:
    return reference_cache(model_dir) / "verdict.json"


def record_verdict(
    model_dir: Path, verdicts: dict[str, str], tiny: bool | None = None, compiled: bool = False
) -> None:
    """Write the run's verdict for `read_verdict` (best effort: a check that cannot write
    its record still prints its verdict)."""
    from vllm_x86 import __version__
    from vllm_x86.runtime.diskfaults import write_atomic

    record = {
        "model": str(Path(model_dir).resolve()),
        "passed": all(verdicts.get(s) == "ok" for s in STAGES),
        "stages": {s: verdicts.get(s, "not run") for s in STAGES},
        "tiny": tiny,
        "compiled": compiled,
        "time": time.time(),
        "version": __version__,
        "weights": _weights_stamp(model_dir),
    }
    path = verdict_path(model_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(record, indent=1))
    except OSError as e:
        _say(f"   (the verdict was not recorded in {path}: {e.strerror or e})")


def read_verdict(model_dir: Path) -> dict | None:
    """The last `vllm-x86 check` verdict on this checkpoint as it is on disk now: the
    record (``passed``, ``stages``, ``tiny``, ``time``), or None when it was never
    checked, the record is unreadable, or the weights changed since."""
    try:
        record = json.loads(verdict_path(model_dir).read_text())
        if record.get("weights") != _weights_stamp(model_dir):
            return None
        return record if isinstance(record.get("passed"), bool) else None
    except (OSError, ValueError, AttributeError):
        return None


def _summary(verdicts: dict[str, str], model_dir: Path | None = None, **how) -> int:
    _say("== verdict")
    for s in STAGES:
        _say(f"   {s:<13} {verdicts.get(s, 'not run')}")
    if model_dir is not None:
        record_verdict(model_dir, verdicts, **how)
    return 0 if all(verdicts.get(s) == "ok" for s in STAGES) else 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_dir", help="a Hugging Face model directory (config.json + weights)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--tiny", action="store_true", help="always use a tiny random copy")
    g.add_argument("--real", action="store_true", help="always use the real weights")
    p.add_argument("--compiled", action="store_true", help="also check compiled mode (slower)")
    p.add_argument(
        "--max-real-gib",
        type=float,
        default=1.0,
        help="largest weights checked as they are (default %(default)s GiB)",
    )


def main_ns(ns: argparse.Namespace) -> int:
    use_tiny = True if ns.tiny else False if ns.real else None
    try:
        return run_check(Path(ns.model_dir), use_tiny, ns.compiled, ns.max_real_gib)
    except CheckError as e:
        print(f"vllm-x86 check: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="vllm-x86 check")
    add_arguments(ap)
    sys.exit(main_ns(ap.parse_args()))
