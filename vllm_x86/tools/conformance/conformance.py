"""Conformance: an architecture's tiny checkpoint through vLLM with the plugin, compared
with transformers on the same prompt token ids.

Pieces, each usable alone:

- ``prepare(arch)``: build (or find) the tiny checkpoint and the transformers references
  in float32 and bfloat16 (``tiny.py``; both are cached on disk).
- ``run_jobs(jobs)``: run vLLM on many (checkpoint, dtype, eager/compiled) jobs. One
  worker process serves them one after another (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
  one ``LLM`` object at a time), so vLLM is imported once; a job that kills its worker
  (a crash in native code) is reported as such and a new worker takes the rest.
- ``judge(prep, mode, result)``: the verdict, with the measured numbers.

What "conformant" means (the tolerances are documented in docs/supported_models.md):

fp32
    All ``NEW_TOKENS`` greedy tokens equal transformers' float32 greedy tokens, and every
    prompt and generated token's log-probability within ``FP32_LOGPROB_TOL`` of
    transformers' float32 value.
bf16
    The greedy tokens equal transformers' bf16 ones, or its float32 ones, or part from
    the float32 ones only where vLLM's token is a near tie in the float32 reference:
    its float32 logit within ``tie_tol`` (the bf16 log-prob tolerance below) of the
    best one (there two correct bf16 implementations legitimately choose differently;
    nothing after that point is compared). Where vLLM follows transformers' bf16 tokens
    further than the float32 ones, the same near-tie rule applies at the step where it
    leaves the bf16 ones, on the bf16 reference's logits. Log-probabilities (against
    float32) no further off than ``BF16_ERR_FACTOR`` times transformers' own bf16 error
    on the same prompt, plus ``BF16_LOGPROB_FLOOR``.
int8, int4
    vLLM in bf16 with ``quantization="x86_int8"`` / ``"x86_int4"`` (default options),
    judged by the bf16 rule against transformers with the same weights quantized and
    dequantized by the plugin's own functions (quant/fake.py): its float32 and bf16
    runs take the places of the plain float32 and bf16 references. Quantization error
    is thus in the reference too; what is checked is the kernels and which layers are
    quantized.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_x86.tools.conformance import tiny
from vllm_x86.tools.conformance.archs import Arch

NEW_TOKENS = tiny.NEW_TOKENS
FP32_LOGPROB_TOL = 2e-3
BF16_ERR_FACTOR = 4.0
BF16_LOGPROB_FLOOR = 0.1
MAX_MODEL_LEN = 64
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "int8": "bfloat16", "int4": "bfloat16"}
QUANT = {"int8": "x86_int8", "int4": "x86_int4"}  # weight-only methods, bf16 activations


def mode_parts(mode: str) -> tuple[str, bool]:
    """ "bf16-eager" -> ("bfloat16", True); "int4-eager" -> ("bfloat16", True)."""
    dt, _, how = mode.partition("-")
    return DTYPES[dt], how == "eager"


def mode_quant(mode: str) -> str:
    """ "int4-eager" -> "x86_int4"; "" for the unquantized modes."""
    return QUANT.get(mode.partition("-")[0], "")


def ref_key(dtype_name: str, quant: str = "") -> str:
    """The key of a reference in ``Prepared.refs``: "float32", "x86_int8:bfloat16"."""
    return f"{quant}:{dtype_name}" if quant else dtype_name


# ----------------------------------------------------------------------------- prepare


@dataclass
class Prepared:
    arch: str
    model_dir: str
    prompt: list[int]
    refs: dict[str, dict] = field(default_factory=dict)  # ref_key -> reference
    error: str | None = None  # no checkpoint: nothing can run
    ref_errors: dict[str, str] = field(default_factory=dict)  # ref_key -> why no reference
    plans: dict[str, dict] = field(default_factory=dict)  # quant -> quantize_plan()


def prepare(arch: Arch, root: Path | None = None, modes: tuple[str, ...] = ()) -> Prepared:
    """The checkpoint and the plain references, plus the fake-quantized references of
    the quantized ones among `modes`. The plain bf16 reference only where a plain bf16
    mode is among `modes` (or none is named): the fp32 and quantized rules do not read
    it, and it costs a transformers run."""
    try:
        cfg = tiny.tiny_config(arch.name, arch.extra)
        model_dir = tiny.build(
            arch.name, cfg, root=root, gain=arch.gain, hub_format=arch.hub_format
        )
        prompt = tiny.prompt_ids(tiny.text_config(cfg).vocab_size)
    except Exception as e:  # reported as the case's failure, with the reason
        return Prepared(arch.name, "", [], error=f"transformers: {type(e).__name__}: {e}")
    prep = Prepared(arch.name, str(model_dir), prompt)
    quants = tuple(dict.fromkeys(q for q in map(mode_quant, modes) if q))
    bf16 = not modes or any(mode_parts(m)[0] == "bfloat16" and not mode_quant(m) for m in modes)
    fill_references(prep, quants=quants, plain=("float32", "bfloat16") if bf16 else ("float32",))
    return prep


def fill_references(
    prep: Prepared,
    cache_dir: Path | None = None,
    quants: tuple[str, ...] = (),
    new_tokens: int = NEW_TOKENS,
    plain: tuple[str, ...] = ("float32", "bfloat16"),
) -> None:
    """The references of `prep`: the plain ones in the dtypes `plain`, and float32 and
    bf16 ones of each of `quants` (weights fake-quantized)."""
    for quant in quants:
        try:
            prep.plans[quant] = quantize_plan(Path(prep.model_dir), quant)
        except Exception as e:
            msg = str(e).splitlines()[0][:300]
            prep.ref_errors[ref_key("float32", quant)] = (
                f"fake-quantizing the transformers model as {quant} fails: "
                f"{type(e).__name__}: {msg}"
            )
    for quant in ("", *quants):
        for d in ("float32", "bfloat16") if quant else plain:
            key = ref_key(d, quant)
            try:
                prep.refs[key] = tiny.cached_reference(
                    Path(prep.model_dir), d, prep.prompt, new_tokens, cache_dir, quant
                )
            except Exception as e:
                msg = str(e).splitlines()[0][:300]
                what = f"{d}, weights fake-quantized as {quant}" if quant else d
                prep.ref_errors[key] = (
                    f"the transformers {what} reference fails: {type(e).__name__}: {msg}"
                )


def quantize_plan(model_dir: Path, quant: str) -> dict:
    """What the reference's fake quantization quantizes in the checkpoint's transformers
    model: {"weights": quantized weight elements, "tensors": how many tensors}. Run on
    the meta device (the choice depends on names and shapes only)."""
    import torch
    from transformers import AutoConfig

    from vllm_x86.tools.conformance.fake_quant import fake_quantize

    cfg = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        model = tiny.model_class(cfg.architectures[0])._from_config(cfg, dtype=torch.bfloat16)
    report = fake_quantize(model, quant)
    params = dict(model.named_parameters(remove_duplicate=False))
    done = [k for k, v in report.items() if v.startswith("int")]
    return {"weights": sum(params[k].numel() for k in done), "tensors": len(done)}


def quant_inventory(model) -> dict:
    """What vLLM quantized (runs inside the worker): {"weights": elements of the layers
    running INT8/INT4 kernels, "layers": how many}."""
    weights = layers = 0
    for mod in model.modules():
        if getattr(mod, "x86_quantized", False):
            n, k = mod.x86_shape
        elif getattr(mod, "x86_lm_head", False):
            n, k = mod.weight.shape
        elif getattr(mod, "x86_moe_elements", 0):
            weights += mod.x86_moe_elements
            layers += 1
            continue
        else:
            continue
        weights += n * k
        layers += 1
    return {"weights": weights, "layers": layers}


# ----------------------------------------------------------------------------- vLLM worker


def _run_one(job: dict) -> dict:
    """One LLM object, one request; runs inside the worker process."""
    import gc

    from vllm import LLM, SamplingParams

    llm = None
    t0 = time.monotonic()
    try:
        kwargs = dict(job.get("engine_args") or {})
        llm = LLM(
            job["model"],
            dtype=job["dtype"],
            enforce_eager=job["eager"],
            max_model_len=kwargs.pop("max_model_len", MAX_MODEL_LEN),
            skip_tokenizer_init=True,
            enable_prefix_caching=False,
            seed=0,
            **kwargs,
        )
        started = time.monotonic() - t0
        sp = SamplingParams(
            temperature=0,
            max_tokens=job["max_tokens"],
            ignore_eos=True,
            logprobs=1,
            prompt_logprobs=1,
            detokenize=False,
        )
        out = llm.generate([{"prompt_token_ids": job["prompt"]}], sp, use_tqdm=False)[0]
        prompt = job["prompt"]
        plp = [out.prompt_logprobs[i][prompt[i]].logprob for i in range(1, len(prompt))]
        toks = list(out.outputs[0].token_ids)
        glp = [d[t].logprob for d, t in zip(out.outputs[0].logprobs, toks)]
        res = {
            "ok": True,
            "tokens": toks,
            "prompt_logprobs": plp,
            "logprobs": glp,
            "start_s": round(started, 2),
            "seconds": round(time.monotonic() - t0, 2),
        }
        if job.get("inventory"):
            res["ops"] = llm.apply_model(op_inventory)[0]
        if (job.get("engine_args") or {}).get("quantization"):
            res["quantized"] = llm.apply_model(quant_inventory)[0]
        if job.get("speed_tokens"):
            res["speed"] = _speed(llm, job["prompt"], job["speed_tokens"])
        return res
    except BaseException as e:  # noqa: BLE001 - every failure is a result
        tb = traceback.format_exc()
        return {
            "ok": False,
            "error": f"{type(e).__name__}: {e}"[:2000],
            "traceback": tb[-4000:],
            "seconds": round(time.monotonic() - t0, 2),
        }
    finally:
        # Each full garbage collection scans the whole heap of torch, vLLM and
        # transformers (about 0.5 s here), and vLLM runs several per engine start and
        # stop. vLLM's cleanup unfreezes and collects; freezing what survives it leaves
        # the next job's collections only that job's objects to scan.
        del llm
        try:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            cleanup_dist_env_and_memory()  # gc.unfreeze(), then gc.collect()
        except Exception:
            gc.unfreeze()
            gc.collect()
        gc.freeze()


def _speed(llm, prompt: list[int], n: int) -> dict:
    """Decode speed of one request: n greedy tokens after a 1-token warm-up request."""
    from vllm import SamplingParams

    sp1 = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, detokenize=False)
    t0 = time.perf_counter()
    llm.generate([{"prompt_token_ids": prompt}], sp1, use_tqdm=False)
    first = time.perf_counter() - t0
    sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, detokenize=False)
    t0 = time.perf_counter()
    llm.generate([{"prompt_token_ids": prompt}], sp, use_tqdm=False)
    total = time.perf_counter() - t0
    decode = max(total - first, 1e-9)
    return {
        "tokens": n,
        "prefill_s": round(first, 4),
        "total_s": round(total, 4),
        "decode_tok_s": round((n - 1) / decode, 1),
    }


def op_inventory(model) -> list[dict]:
    """What computes each op of a loaded vLLM model: the plugin's kernel, vLLM's CPU
    kernel, or PyTorch (a CustomOp's forward_native). Runs inside the worker."""
    from vllm.model_executor.custom_op import CustomOp

    rows: dict[tuple, dict] = {}

    def plugin_cls(cls) -> bool:
        return any(b.__module__.startswith("vllm_x86") for b in cls.__mro__)

    for mod in model.modules():
        cls = type(mod)
        if isinstance(mod, CustomOp):
            fm = getattr(mod, "_forward_method", None)
            fname = getattr(fm, "__name__", "?")
            if plugin_cls(cls):
                path = "vllm-x86 kernel"
            elif fname == "forward_cpu" and type(mod).forward_cpu is not CustomOp.forward_cpu:
                path = "vLLM CPU kernel (forward_cpu)"
            elif fname == "forward_native" or fname == "forward_cpu":
                path = "PyTorch (forward_native)"
            else:
                path = fname
            name = getattr(cls, "name", None) or cls.__name__
            key = (name, cls.__name__, path)
        elif plugin_cls(cls):
            key = (cls.__name__, cls.__name__, "vllm-x86 module override")
        else:
            backend = getattr(mod, "attn_backend", None)
            if backend is None or not hasattr(backend, "get_name"):
                continue
            key = ("attention", cls.__name__, f"backend {backend.get_name()}")
        row = rows.setdefault(key, {"op": key[0], "class": key[1], "path": key[2], "count": 0})
        row["count"] += 1
    try:
        from vllm_x86.runtime.ops.registry import ir_providers

        ir = ir_providers()
        for row in rows.values():  # a CustomOp whose native code calls a vLLM IR op
            if row["op"] in ir and row["path"] == "PyTorch (forward_native)":
                row["path"] = f"vLLM IR op {row['op']}, providers {ir[row['op']]}"
        for op, prov in ir.items():
            rows[(op, "ir")] = {
                "op": op,
                "class": "vLLM IR op",
                "path": f"providers {prov}",
                "count": 0,
            }
    except Exception:
        pass
    return list(rows.values())


def worker_main() -> None:
    """Read jobs (one JSON per line) on stdin; print ``RESULT {json}`` per job."""
    from vllm_x86.runtime.patches import inspect_models_in_process

    inspect_models_in_process()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        job = json.loads(line)
        print("START " + json.dumps({"id": job["id"]}), flush=True)
        res = _run_one(job)
        res["id"] = job["id"]
        print("RESULT " + json.dumps(res), flush=True)
        if not res["ok"]:
            # a failed engine start can leave vLLM's process state half set up (op
            # registrations, distributed groups): the next job gets a fresh process
            sys.exit(3)


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # The INT8/INT4 modes' reference (quant/fake.py) rounds weights, not activations: the
    # VNNI kernels keep 16-bit activations at every row count here, as the AMX ones do.
    # Their 8-bit ones (from 4 rows by default) have their own reference in the unit
    # tests; VLLM_X86_QUANT_A8_ROWS=4 in the environment runs the suite with them.
    env.setdefault("VLLM_X86_QUANT_A8_ROWS", "0")
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def run_jobs(
    jobs: list[dict],
    job_timeout: float = 900.0,
    log=None,
    env: dict[str, str] | None = None,
) -> dict[str, dict]:
    """Run `jobs` (dicts with id, model, dtype, eager, prompt, max_tokens) through
    worker processes; return results by job id. A job that takes its worker down or
    runs past `job_timeout` gets an error result; the next worker takes the rest."""
    pending = list(jobs)
    results: dict[str, dict] = {}
    while pending:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_x86.tools.conformance.conformance", "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env or worker_env(),
            bufsize=1,
        )
        for job in pending:
            proc.stdin.write(json.dumps(job) + "\n")
        proc.stdin.close()
        current, started, tail = None, time.monotonic(), []
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], 5.0)
            if ready:
                line = proc.stdout.readline()
                if not line:
                    break
                if line.startswith("START "):
                    current, started = json.loads(line[6:])["id"], time.monotonic()
                    tail = []
                elif line.startswith("RESULT "):
                    res = json.loads(line[7:])
                    results[res["id"]] = res
                    if log:
                        log(res["id"], res)
                    current = None
                else:
                    tail = (tail + [line.rstrip()])[-40:]
            if current is not None and time.monotonic() - started > job_timeout:
                proc.kill()
                results[current] = {
                    "ok": False,
                    "error": f"timeout: no result after {job_timeout:.0f} s",
                    "traceback": "\n".join(tail),
                    "seconds": round(time.monotonic() - started, 2),
                }
                if log:
                    log(current, results[current])
                break
        rc = proc.wait()
        if current is not None and current not in results:
            results[current] = {
                "ok": False,
                "error": f"the vLLM worker process died (exit status {rc})",
                "traceback": "\n".join(tail),
                "seconds": round(time.monotonic() - started, 2),
            }
            if log:
                log(current, results[current])
        remaining = [j for j in pending if j["id"] not in results]
        if len(remaining) == len(pending):  # the worker died before starting anything
            for j in remaining:
                results[j["id"]] = {
                    "ok": False,
                    "error": f"the vLLM worker process exited ({rc}) before this job",
                    "traceback": "\n".join(tail),
                }
            break
        pending = remaining
    return results


def run_jobs_parallel(jobs: list[dict], workers: int = 1, log=None, **kw) -> dict[str, dict]:
    """`run_jobs` split over `workers` worker processes, each with an equal share of
    this machine's cores (VLLM_X86_THREADS). For CI machines with cores to spare;
    results are the same, only the wall time changes."""
    if workers <= 1 or len(jobs) <= 1:
        return run_jobs(jobs, log=log, **kw)
    from concurrent.futures import ThreadPoolExecutor

    threads = max(1, (os.cpu_count() or 1) // workers)
    env = worker_env()
    env["VLLM_X86_THREADS"] = str(threads)
    shares = [jobs[i::workers] for i in range(workers)]
    out: dict[str, dict] = {}
    with ThreadPoolExecutor(workers) as ex:
        for part in ex.map(lambda js: run_jobs(js, log=log, env=env, **kw), shares):
            out.update(part)
    return out


def make_job(prep: Prepared, mode: str, engine_args: dict | None = None) -> dict:
    dtype, eager = mode_parts(mode)
    engine_args = dict(engine_args or {})
    if mode_quant(mode):
        engine_args["quantization"] = mode_quant(mode)
    return {
        "id": f"{prep.arch}:{mode}",
        "model": prep.model_dir,
        "dtype": dtype,
        "eager": eager,
        "prompt": prep.prompt,
        "max_tokens": NEW_TOKENS,
        "engine_args": engine_args,
    }


# ----------------------------------------------------------------------------- verdict


@dataclass
class Verdict:
    ok: bool
    reason: str
    metrics: dict[str, Any]


def _max_abs(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _behind(ref: dict, step: int, token: int) -> float | None:
    """How far `token`'s logit is below the reference's best at greedy `step` (None:
    not among the TOP_K it recorded)."""
    ids, vals = ref["top_ids"][step], ref["top_vals"][step]
    return vals[0] - vals[ids.index(token)] if token in ids else None


def _behind_text(behind: float | None, ref: str) -> str:
    if behind is None:
        return f"not among {ref}'s {tiny.TOP_K} best"
    return f"{behind:.3g} below {ref}'s best logit"


def judge(prep: Prepared, mode: str, res: dict) -> Verdict:
    if prep.error:
        return Verdict(False, prep.error, {})
    dtype, _ = mode_parts(mode)
    quant = mode_quant(mode)
    if not res.get("ok"):
        return Verdict(False, f"vLLM: {res.get('error', 'no result')}", {})
    for d in ("float32", dtype):
        if ref_key(d, quant) in prep.ref_errors:
            return Verdict(False, prep.ref_errors[ref_key(d, quant)] + " (vLLM ran)", {})
        if ref_key(d, quant) not in prep.refs:
            return Verdict(False, f"no {ref_key(d, quant)} reference was prepared", {})
    f32 = prep.refs[ref_key("float32", quant)]
    fq = f" fake-{quant}" if quant else ""  # which reference, in the reasons
    got = res["tokens"]
    m: dict[str, Any] = {"seconds": res.get("seconds"), "start_s": res.get("start_s")}
    if dtype == "float32":
        d = first_difference(got, f32["tokens"])
        same = d if d is not None else len(got)
        m["tokens_equal"] = same
        m["prompt_lp_err"] = _max_abs(res["prompt_logprobs"], f32["prompt_logprobs"])
        m["gen_lp_err"] = _max_abs(res["logprobs"][:same], f32["logprobs"][:same])
        if d is not None:
            return Verdict(
                False,
                f"greedy token {d} differs from transformers fp32 ({got[d]} vs "
                f"{f32['tokens'][d]}; fp32 top-2 gap there {f32['gaps'][d]:.3g})",
                m,
            )
        err = max(m["prompt_lp_err"], m["gen_lp_err"])
        if err > FP32_LOGPROB_TOL:
            return Verdict(False, f"logprob error {err:.2e} > {FP32_LOGPROB_TOL:g}", m)
        return Verdict(True, "", m)
    # bf16, and the quantized modes against their fake-quantized references
    if quant:  # first: the same weights quantized on both sides
        plan, got_q = prep.plans.get(quant), res.get("quantized")
        m["quantized_weights"] = got_q and got_q["weights"]
        m["reference_quantized_weights"] = plan and plan["weights"]
        if plan is None or got_q is None:
            return Verdict(False, f"no count of the {quant} weights of vLLM or the reference", m)
        if got_q["weights"] != plan["weights"]:
            return Verdict(
                False,
                f"vLLM runs {got_q['weights']} weights in {got_q['layers']} layers with "
                f"{quant}'s kernels, the reference quantizes {plan['weights']} in "
                f"{plan['tensors']} tensors (quant/scope.py's rule)",
                m,
            )
    b16 = prep.refs[ref_key("bfloat16", quant)]
    hf_err = max(
        _max_abs(b16["prompt_logprobs"], f32["prompt_logprobs"]),
        _max_abs(b16["logprobs"][:1], f32["logprobs"][:1]),
    )
    tol = BF16_ERR_FACTOR * hf_err + BF16_LOGPROB_FLOOR
    m["hf_bf16_lp_err"] = hf_err
    m["prompt_lp_err"] = _max_abs(res["prompt_logprobs"], f32["prompt_logprobs"])
    m["lp_tol"] = tol
    if quant and "float32" in prep.refs:  # how far the plain reference is: what a
        # quantization that missed its layers would be judged by
        m["unquantized_lp_err"] = _max_abs(
            res["prompt_logprobs"], prep.refs["float32"]["prompt_logprobs"]
        )
    tie_tol = tol  # a logit gap below the logprob tolerance is a tie in bf16
    d32 = first_difference(got, f32["tokens"])
    d16 = first_difference(got, b16["tokens"])
    if d32 is None or d16 is None:
        m["tokens_equal"] = len(got)
        m["matches"] = "fp32" if d32 is None else "bf16"
    else:
        m["tokens_equal"] = max(d32, d16)
        m["parted_at"] = d32
        behind = _behind(f32, d32, got[d32])
        m["fp32_behind"] = behind
        tie = behind is not None and behind < tie_tol
        if not tie and d32 < d16 < min(len(got), len(b16["top_ids"])):
            # vLLM went on with transformers' own bf16 tokens (bf16 rounding moved both
            # away from fp32's choice): the same rule on that reference's logits, at the
            # step where vLLM leaves it
            behind16 = _behind(b16, d16, got[d16])
            m["bf16_behind"] = behind16
            tie = behind16 is not None and behind16 < tie_tol
            if tie:
                m["bf16_parted_at"] = d16
        if not tie:
            where = _behind_text(behind, "fp32")
            return Verdict(
                False,
                f"greedy token {d32} differs from transformers{fq} fp32 ({got[d32]} vs "
                f"{f32['tokens'][d32]}): vLLM's token is {where} (bf16 tolerance "
                f"{tie_tol:.3g}); bf16 transformers{fq} parts at {d16}"
                + (
                    ""
                    if "bf16_behind" not in m
                    else f", where vLLM's token is {_behind_text(m['bf16_behind'], 'bf16')}"
                ),
                m,
            )
    if m["prompt_lp_err"] > tol:
        return Verdict(
            False,
            f"prompt logprob error {m['prompt_lp_err']:.3g} > {tol:.3g} "
            f"({BF16_ERR_FACTOR:g} x transformers{fq}' own bf16 error {hf_err:.3g} "
            f"+ {BF16_LOGPROB_FLOOR:g})",
            m,
        )
    return Verdict(True, "", m)


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker_main()
    else:
        print("usage: python -m vllm_x86.tools.conformance.conformance --worker", file=sys.stderr)
        sys.exit(2)
