"""Tensor and pipeline parallel on one machine, with the plugin (docs/distributed.md).

vLLM's own multiprocessing executor runs the ranks; the plugin binds each to its own
cores and runs its ops in each. Greedy output is compared with one rank:

- pipeline parallel: the default model, bf16, eager, PP=2 == PP=1; and a prepacked
  INT8 checkpoint (`vllm-x86 quantize` of the bench's tiny Llama), PP=2 == PP=1;
- tensor parallel of prepacked checkpoints (the same model in INT8, and in INT4 with the
  LM head in INT8): each rank loads its share of the packed tensors, TP=2 == TP=1;
- tensor parallel on the conformance suite's tiny random Llama (4 heads, 2 KV heads:
  they split over 2 ranks): fp32 TP=2 == TP=1 exactly; bf16 TP=2 against transformers
  by the conformance suite's own rule (conformance.judge: near ties allowed);
- the tiny Qwen3-MoE, fp32, TP=2 == TP=1;
- x86_int8 and x86_int4 quantized while loading, TP=2 == TP=1. Groups of 64: the
  Llama's o_proj has K = 128, 64 per rank, which the default groups of 128 would
  straddle (that start is refused: tests/unit/test_parallel_quant.py);
- `vllm-x86 serve --tensor-parallel-size 2` of the bench's tiny Llama, with the serve
  defaults (compiled), answering a completion over HTTP with the one-rank greedy
  tokens, its log naming each rank's CPUs, the communicator and the op table's classes
  in each rank.

All engine runs of the comparisons go through the conformance suite's job runner
(conformance.run_jobs): one worker process, engines one after another, each TP/PP=2
engine with its two worker processes.
"""

from __future__ import annotations

import subprocess

import httpx
import pytest

from tests.conftest import PYTHON, clean_env
from tests.e2e.conftest import ServeProcess
from vllm_x86.tools.conformance import conformance as conf
from vllm_x86.tools.conformance.archs import BY_NAME

pytestmark = pytest.mark.slow

PP_NEW_TOKENS = 24
SERVE_PROMPT = "The capital of France is"
SERVE_TOKENS = 8


@pytest.fixture(scope="module")
def tiny():
    return {
        "llama": conf.prepare(BY_NAME["LlamaForCausalLM"], modes=("bf16-eager",)),
        "moe": conf.prepare(BY_NAME["Qwen3MoeForCausalLM"]),
    }


def _job(prep, mode: str, tp: int = 1) -> dict:
    job = conf.make_job(prep, mode, {"tensor_parallel_size": tp} if tp > 1 else None)
    job["id"] += f":tp{tp}"
    return job


@pytest.fixture(scope="module")
def tiny_llama():
    """The bench's tiny random Llama with the default model's tokenizer (4 heads, 2 KV
    heads), for the server."""
    from vllm_x86.tools.bench.synthetic import build

    return build("tiny-llama")


@pytest.fixture(scope="module")
def serve_prompt(tiny_llama) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_llama))(SERVE_PROMPT)["input_ids"]


@pytest.fixture(scope="module")
def prepacked(tiny_llama, tmp_path_factory):
    """The tiny Llama as `vllm-x86 quantize --bits 8` writes it (prepacked INT8)."""
    out = tmp_path_factory.mktemp("prepacked") / "tiny-llama-int8"
    subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.cli", "quantize", str(tiny_llama), str(out),
         "--bits", "8", "--no-compile"],
        check=True, capture_output=True, text=True, timeout=300,
        env=clean_env(OMP_NUM_THREADS="1"),  # one thread: see test_quantized's GPTQ run
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def prepacked4(tiny_llama, tmp_path_factory):
    """The tiny Llama as `vllm-x86 quantize --bits 4 --method rtn --lm-head int8` writes it
    (prepacked INT4, groups of 128, the LM head quantized to INT8 while loading)."""
    out = tmp_path_factory.mktemp("prepacked") / "tiny-llama-int4"
    subprocess.run(
        [PYTHON, "-m", "vllm_x86.tools.cli", "quantize", str(tiny_llama), str(out),
         "--bits", "4", "--method", "rtn", "--lm-head", "int8", "--no-compile"],
        check=True, capture_output=True, text=True, timeout=300,
        env=clean_env(OMP_NUM_THREADS="1"),  # one thread: see test_quantized's GPTQ run
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def runs(tiny, default_model, tiny_llama, serve_prompt, prepacked, prepacked4):
    from transformers import AutoTokenizer

    for prep in tiny.values():
        assert prep.error is None, prep.error
    prompt = AutoTokenizer.from_pretrained(str(default_model))(
        "The three primary colors are red, blue and", add_special_tokens=False
    )["input_ids"]

    def default(pp: int) -> dict:
        return {
            "id": f"default:pp{pp}",
            "model": str(default_model),
            "dtype": "bfloat16",
            "eager": True,
            "prompt": prompt,
            "max_tokens": PP_NEW_TOKENS,
            "engine_args": {"pipeline_parallel_size": pp} if pp > 1 else {},
        }

    def packed(pp: int = 1, tp: int = 1, bits: int = 8) -> dict:
        args = {"pipeline_parallel_size": pp} if pp > 1 else {}
        args |= {"tensor_parallel_size": tp} if tp > 1 else {}
        return {
            "id": f"prepacked{bits}:pp{pp}:tp{tp}",
            "model": str(prepacked if bits == 8 else prepacked4),
            "dtype": "bfloat16",
            "eager": True,
            "prompt": serve_prompt,
            "max_tokens": SERVE_TOKENS,
            "engine_args": args,
        }

    llama, moe = tiny["llama"], tiny["moe"]
    jobs = [
        # one rank first: the same process then starts engines of two ranks
        default(1),
        {
            "id": "tiny-llama:fp32-eager:tp1",
            "model": str(tiny_llama),
            "dtype": "float32",
            "eager": True,
            "prompt": serve_prompt,
            "max_tokens": SERVE_TOKENS,
            "engine_args": {},
        },
        _job(llama, "fp32-eager"),
        _job(moe, "fp32-eager"),
        _job(llama, "int8-eager"),
        _job(llama, "int4-eager"),
        packed(),
        packed(bits=4),
        default(2),
        packed(pp=2),
        packed(tp=2),
        packed(tp=2, bits=4),
        _job(llama, "fp32-eager", 2),
        _job(llama, "bf16-eager", 2),
        _job(moe, "fp32-eager", 2),
        _job(llama, "int8-eager", 2),
        _job(llama, "int4-eager", 2),
    ]
    env = conf.worker_env()
    env["VLLM_X86_QUANT_GROUP_SIZE"] = "64"  # see the module docstring
    return conf.run_jobs(jobs, env=env, job_timeout=300)


def _tokens(runs, key: str) -> list[int]:
    res = runs[key]
    assert res["ok"], f"{key}: {res.get('error')}\n{res.get('traceback', '')[-3000:]}"
    return res["tokens"]


def test_pipeline_parallel_greedy_equals_one_stage(runs):
    one = _tokens(runs, "default:pp1")
    assert len(one) == PP_NEW_TOKENS
    assert _tokens(runs, "default:pp2") == one


def test_pipeline_parallel_runs_a_prepacked_checkpoint(runs):
    one = _tokens(runs, "prepacked8:pp1:tp1")
    assert len(one) == SERVE_TOKENS
    assert _tokens(runs, "prepacked8:pp2:tp1") == one


@pytest.mark.parametrize("bits", [8, 4])
def test_tensor_parallel_splits_a_prepacked_checkpoint(runs, bits):
    """Each rank loads its share of the packed tensors (a block range of each row for
    the row-parallel layers, tests/unit/test_parallel_quant.py): the tokens of one rank.
    INT4 with the LM head quantized to INT8 while loading, split by vocabulary."""
    one = _tokens(runs, f"prepacked{bits}:pp1:tp1")
    assert len(one) == SERVE_TOKENS
    assert _tokens(runs, f"prepacked{bits}:pp1:tp2") == one


@pytest.mark.parametrize("model", ["llama", "moe"])
def test_tensor_parallel_fp32_greedy_equals_one_rank(runs, tiny, model):
    arch = tiny[model].arch
    one = _tokens(runs, f"{arch}:fp32-eager:tp1")
    assert len(one) == conf.NEW_TOKENS
    assert _tokens(runs, f"{arch}:fp32-eager:tp2") == one


def test_tensor_parallel_bf16_conforms_to_transformers(runs, tiny):
    res = runs["LlamaForCausalLM:bf16-eager:tp2"]
    verdict = conf.judge(tiny["llama"], "bf16-eager", res)
    assert verdict.ok, verdict.reason


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_tensor_parallel_quantized_on_the_fly_equals_one_rank(runs, quant):
    one = runs[f"LlamaForCausalLM:{quant}-eager:tp1"]
    two = runs[f"LlamaForCausalLM:{quant}-eager:tp2"]
    assert _tokens(runs, f"LlamaForCausalLM:{quant}-eager:tp2") == _tokens(
        runs, f"LlamaForCausalLM:{quant}-eager:tp1"
    )
    # the plugin's kernels ran: every attention and MLP layer quantized (rank 0 holds
    # half of each weight at TP=2)
    assert one["quantized"]["layers"] == two["quantized"]["layers"] > 0
    assert two["quantized"]["weights"] * 2 == one["quantized"]["weights"]


@pytest.fixture(scope="module")
def tp_server(tiny_llama, tmp_path_factory):
    """The plugin's serve defaults (compiled, on an empty compile cache: each rank
    compiles before serving; forked processes), with two tensor-parallel ranks."""
    tmp = tmp_path_factory.mktemp("tp_server")
    srv = ServeProcess(
        str(tiny_llama),
        ["--tensor-parallel-size", "2", "--dtype", "float32", "--max-model-len", "256",
         "--served-model-name", "tiny"],
        tmp / "server.log",
        env=clean_env(VLLM_X86_CACHE_DIR=str(tmp / "cache")),
    )  # fmt: skip
    try:
        yield srv
    finally:
        srv.stop()


def test_serve_with_tensor_parallel_answers_a_completion(tp_server, runs, serve_prompt):
    r = httpx.post(
        f"{tp_server.base}/v1/completions",
        timeout=120,
        json={
            "model": "tiny",
            "prompt": SERVE_PROMPT,
            "temperature": 0,
            "max_tokens": SERVE_TOKENS,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["prompt_token_ids"] == serve_prompt
    # the same greedy tokens as the LLM class with one rank, and their text
    assert choice["token_ids"] == _tokens(runs, "tiny-llama:fp32-eager:tp1")
    assert choice["text"] and r.json()["usage"]["completion_tokens"] == SERVE_TOKENS
    log = tp_server.log()
    for rank in (0, 1):
        # each rank: its own CPU, vLLM's shared-memory communicator, the op table's ops
        assert f"rank {rank} of 2: tensor-parallel rank {rank} of 2" in log
        assert f"rank {rank}: the op table's classes in this rank's model:" in log
    assert log.count("tensor parallel communicator: shared memory") == 2
    # the serve defaults made for one worker, off with a reason
    assert "each keeps its own worker process" in log
    assert log.count("staged warm-up is for one worker; 2 workers compile before serving") == 2
