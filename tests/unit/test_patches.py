"""vllm_x86/runtime/patches/: the runtime patches, those that install themselves each in a
fresh interpreter (an import hook must not leak into the other tests' sys.modules). Their
ledger is tests/unit/test_patch_ledger.py's."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap

import pytest


def run(code: str, **env: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env} if env else None,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def torchvision_missing() -> None:
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here: the patch steps aside")


@pytest.mark.slow  # a fresh interpreter importing vLLM (~10 s here)
def test_qwen2_vl_image_processing_served_without_torchvision(torchvision_missing):
    out = run(
        """
        import importlib
        from vllm_x86.runtime import patches
        from vllm_x86.runtime.patches import qwen2_vl_torchvision as hook
        name = hook.QWEN2_VL_TORCHVISION_MODULE
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            print("before:", e.name)
        patches.apply_all()
        patches.apply_all()  # idempotent
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import (
            Qwen2VLImageProcessor, smart_resize,
        )
        pil = importlib.import_module(hook.QWEN2_VL_PIL_MODULE)
        import transformers.models.qwen2_vl as pkg
        print("same smart_resize:", smart_resize is pil.smart_resize)
        print("processor:", Qwen2VLImageProcessor is pil.Qwen2VLImageProcessorPil)
        print("lazy name agrees:", pkg.Qwen2VLImageProcessor is Qwen2VLImageProcessor)
        print("resize:", smart_resize(300, 500))
        import sys
        print("hooks:", sum(type(f).__name__ == "Qwen2VLImageProcessingFinder"
                            for f in sys.meta_path))
        print("torchvision:", "torchvision" in sys.modules)
        """
    )
    assert "before: torchvision" in out
    assert "same smart_resize: True" in out
    assert "processor: True" in out
    assert "lazy name agrees: True" in out
    assert "resize: (308, 504)" in out
    assert "hooks: 1" in out
    assert "torchvision: False" in out


def test_hook_steps_aside_when_torchvision_is_available(monkeypatch):
    from vllm_x86.runtime.patches import qwen2_vl_torchvision as hook

    finder = hook.Qwen2VLImageProcessingFinder()
    monkeypatch.setattr(hook, "_torchvision_available", lambda: True)
    assert finder.find_spec(hook.QWEN2_VL_TORCHVISION_MODULE) is None
    monkeypatch.setattr(hook, "_torchvision_available", lambda: False)
    assert finder.find_spec(hook.QWEN2_VL_TORCHVISION_MODULE) is not None
    assert finder.find_spec("transformers.models.qwen2_vl.modeling_qwen2_vl") is None


@pytest.mark.slow  # a fresh interpreter importing vLLM (~10 s here)
def test_vllm_qwen3_5_model_file_imports(torchvision_missing):
    out = run(
        """
        from vllm_x86.runtime import patches
        patches.apply_all()
        from vllm.model_executor.models.qwen3_5 import (
            Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM,
        )
        print("ok", Qwen3_5ForCausalLM.__name__, Qwen3_5MoeForCausalLM.__name__)
        """
    )
    assert "ok Qwen3_5ForCausalLM Qwen3_5MoeForCausalLM" in out


def test_no_triton_allocator_is_scoped_to_the_block():
    from vllm.triton_utils import HAS_TRITON

    from vllm_x86.runtime import patches

    name = "vllm.model_executor.layers.mamba.gdn.olmo_gdn_linear_attn"
    module = importlib.import_module(name)
    original = module.set_triton_allocator
    with patches.no_triton_allocator(name):
        inside = module.set_triton_allocator
        inside("cpu")  # no Triton needed
    assert module.set_triton_allocator is original
    assert (inside is original) == HAS_TRITON


def test_aot_artifact_gets_finalize_loading_only_if_missing(monkeypatch):
    """torch's AOT artifact class gets a finalize_loading that does nothing; one the class
    has of its own (a later torch) is left alone."""
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as cls

    from vllm_x86.runtime.patches import aot_finalize_loading

    if "finalize_loading" in vars(cls):
        monkeypatch.delattr(cls, "finalize_loading")
    aot_finalize_loading.apply()
    assert cls.finalize_loading is aot_finalize_loading.finalize_loading_done
    assert cls.finalize_loading(object.__new__(cls), vllm_config=None) is None

    def own(self, vllm_config):
        return "torch's own"

    monkeypatch.setattr(cls, "finalize_loading", own)
    aot_finalize_loading.apply()
    assert cls.finalize_loading is own


def test_model_inspection_runs_in_process(monkeypatch):
    from vllm.model_executor.models import registry

    from vllm_x86.runtime.patches import inspect_models_in_process

    monkeypatch.setattr(registry, "_run_in_subprocess", registry._run_in_subprocess)
    pid = []
    inspect_models_in_process()
    assert registry._run_in_subprocess(lambda: pid.append(os.getpid()) or "answer") == "answer"
    assert pid == [os.getpid()]


FRONTEND_CODE = """
    import copy, os, sys, types
    from vllm_x86.runtime import patches
    from vllm_x86.runtime.patches import frontend_warmup as fw
    from vllm.renderers import hf
    from vllm.tokenizers import get_tokenizer

    patches.apply_all()
    patches.apply_all()  # idempotent
    path = sys.argv[1]
    tok = get_tokenizer(path)
    pooled = hf.maybe_make_thread_pool(copy.copy(tok), 2)
    pool, og = fw.tokenizer_pool_of(pooled)
    print("patched:", getattr(hf.maybe_make_thread_pool, fw.MARK, False))
    print("copies at build:", pool.qsize())
    renderer = object.__new__(hf.HfRenderer)
    renderer.tokenizer = pooled
    renderer.model_config = types.SimpleNamespace(
        tokenizer=path, model=path, tokenizer_revision=None, code_revision=None,
        trust_remote_code=False,
    )
    from vllm_x86.runtime import heap
    trims, trim = [], heap.return_freed_memory
    heap.return_freed_memory = lambda when: trims.append((when, trim(when))) or trims[-1][1]
    fw.frontend_work(renderer)
    print("trims:", [(when, type(freed).__name__) for when, freed in trims])
    print("copies after:", pool.qsize())
    print("distinct copies:", len({id(t) for t in list(pool.queue)} | {id(og)}))
    text = "The capital of France is Paris."
    print("same tokens:", pooled.encode(text) == tok.encode(text))
    key = (pooled.name_or_path, None, None, False)
    cached = hf._PROCESSOR_CHAT_TEMPLATES.get(key, "missing")
    hf._PROCESSOR_CHAT_TEMPLATES.clear()
    fresh = hf._try_get_processor_chat_template(
        tok, revision=None, code_revision=None, trust_remote_code=False
    )
    print("template cached as vLLM finds it:", cached == fresh)
"""


def _frontend(default_model, **env) -> str:
    import os

    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FRONTEND_CODE), str(default_model)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**{k: v for k, v in os.environ.items() if k != "VLLM_X86_SERVE_DEFAULTS"}, **env},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow  # a fresh interpreter importing vLLM (~10 s here)
def test_frontend_warmup_makes_the_pool_copies_later_in_serve(default_model):
    """In `vllm-x86 serve` the pool is built without its copies; the background task
    adds exactly the copies vLLM would have made and fills vLLM's template cache."""
    out = _frontend(default_model, VLLM_X86_SERVE_DEFAULTS="1")
    assert "patched: True" in out  # this vLLM's pool has the structure the patch needs
    assert "copies at build: 0" in out
    assert "copies after: 2" in out
    # and the heap pages the copies freed go back to the system, once (heap.py)
    assert "trims: [('after the tokenizer copies', 'int')]" in out
    assert "distinct copies: 3" in out
    assert "same tokens: True" in out
    assert "template cached as vLLM finds it: True" in out


@pytest.mark.slow  # a fresh interpreter importing vLLM (~10 s here)
@pytest.mark.parametrize(
    "env",
    [
        {},
        {"VLLM_X86_SERVE_DEFAULTS": "0"},
        {"VLLM_X86_SERVE_DEFAULTS": "1", "VLLM_X86_FRONTEND_WARMUP": "0"},
    ],
)
def test_frontend_warmup_elsewhere_keeps_vllms_copies_up_front(default_model, env):
    out = _frontend(default_model, **env)
    assert "copies at build: 2" in out
    assert "copies after: 2" in out  # nothing owed, nothing added
    assert "trims: []" in out


@pytest.mark.slow  # a fresh interpreter importing vLLM (~10 s here)
def test_tied_embedding_weight_gets_one_gemm():
    """Two layers sharing a weight Parameter (an input embedding and its tied LM head)
    get one prepared GEMM; an untied layer and remove_weight=True go to vLLM as before."""
    out = run(
        """
        import gc, torch
        from vllm_x86.runtime import patches
        from vllm_x86.runtime.patches import tied_embedding_gemm as tied
        patches.apply_all()
        from vllm.model_executor.layers import utils
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(512, 256, dtype=torch.bfloat16), requires_grad=False)
        embed, head, other = torch.nn.Module(), torch.nn.Module(), torch.nn.Module()
        embed.weight = w
        head.weight = w  # tie_weights
        other.weight = torch.nn.Parameter(w.detach().clone(), requires_grad=False)
        for m in (embed, head, other):
            utils.dispatch_cpu_unquantized_gemm(m, remove_weight=False)
        print("tied share:", head.cpu_linear is embed.cpu_linear)
        print("untied own:", other.cpu_linear is not embed.cpu_linear)
        x = torch.randn(3, 256, dtype=torch.bfloat16)
        ref = torch.nn.functional.linear(x.float(), w.float())
        got = head.cpu_linear(x, head.weight, None).float()
        print("matches linear:", torch.allclose(got, ref, rtol=2e-2, atol=2e-1))
        print("same as untied:", torch.equal(got, other.cpu_linear(x, other.weight, None).float()))
        lin = torch.nn.Module()
        lin.weight = w
        utils.dispatch_cpu_unquantized_gemm(lin, remove_weight=True)
        print("remove_weight prepared anew:", lin.cpu_linear is not embed.cpu_linear)
        n = len(tied._PREPARED_GEMMS)
        del embed, head, lin, w
        gc.collect()
        print("entry dropped with its weight:", len(tied._PREPARED_GEMMS) == n - 1)
        """
    )
    for line in (
        "tied share: True",
        "untied own: True",
        "matches linear: True",
        "same as untied: True",
        "remove_weight prepared anew: True",
        "entry dropped with its weight: True",
    ):
        assert line in out, out


def test_no_processor_possible_follows_autoprocessor(default_model, tmp_path):
    """The files-only rule says True only where AutoProcessor cannot give a processor."""
    import json
    import shutil

    from vllm_x86.runtime.patches.frontend_warmup import no_processor_possible

    assert no_processor_possible(str(default_model), False)
    assert not no_processor_possible(str(default_model), True)  # remote code: ask
    assert not no_processor_possible("HuggingFaceTB/SmolLM2-135M-Instruct", False)

    def variant(name: str, edit) -> str:
        d = tmp_path / name
        shutil.copytree(default_model, d)
        edit(d)
        return str(d)

    with_preprocessor = variant("pre", lambda d: (d / "preprocessor_config.json").write_text("{}"))
    assert not no_processor_possible(with_preprocessor, False)

    def add_processor_class(d):
        p = d / "tokenizer_config.json"
        p.write_text(json.dumps(json.loads(p.read_text()) | {"processor_class": "X"}))

    assert not no_processor_possible(variant("tok", add_processor_class), False)

    def multimodal_config(d):  # a config class AutoProcessor maps to a processor
        (d / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))

    assert not no_processor_possible(variant("vl", multimodal_config), False)


def test_api_key_guards_every_route_but_the_public_ones():
    """With a key, vLLM's middleware (patched) refuses every path but the probes, metrics
    and the API description; without the key vLLM adds no middleware at all."""
    from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

    from vllm_x86.runtime.patches import api_auth

    original = AuthenticationMiddleware.__call__
    api_auth.apply()
    api_auth.apply()  # idempotent
    try:
        _check_guard(AuthenticationMiddleware, api_auth)
    finally:  # the ledger's check reads the installed method in this process
        AuthenticationMiddleware.__call__ = original


def _check_guard(AuthenticationMiddleware, api_auth):  # noqa: N803
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    async def ok(request):
        return PlainTextResponse("served")

    paths = ["/v1/models", "/invocations", "/tokenize", "/detokenize", "/scale_elastic_ep",
             "/health", "/ping", "/version", "/metrics", "/load", "/openapi.json"]  # fmt: skip
    app = Starlette(routes=[Route(p, ok, methods=["GET", "POST"]) for p in paths])
    app.add_middleware(AuthenticationMiddleware, tokens=["s3cret"])
    client = TestClient(app)
    for p in paths:
        r = client.post(p)
        if api_auth.is_public(p):
            assert (r.status_code, r.text) == (200, "served"), p
        else:
            assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}, p
            r = client.post(p, headers={"Authorization": "Bearer s3cret"})
            assert (r.status_code, r.text) == (200, "served"), p
            assert client.post(p, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/health/").status_code != 401  # a trailing slash is still public
    assert client.options("/invocations").status_code != 401  # CORS preflight, as vLLM


@pytest.mark.slow  # imports vLLM in a fresh interpreter
def test_greedy_sample_takes_the_same_tokens():
    """vLLM's sampler takes a greedy token with torch.max on CPU: the indices vLLM CPU's
    _C.greedy_argmax gives, on rows with ties, NaN and infinities, as int64."""
    out = run(
        """
        import torch
        from vllm_x86.runtime import patches
        patches.apply_all()
        from vllm.v1.sample.sampler import Sampler
        from vllm_x86.runtime.patches.ledger import MARK
        print("patched:", getattr(Sampler.greedy_sample, MARK, False))
        g = torch.Generator().manual_seed(0)
        same = 0
        for trial in range(200):
            m = int(torch.randint(1, 9, (1,), generator=g))
            v = int(torch.randint(1, 4000, (1,), generator=g))
            x = torch.randn(m, v, generator=g).round(decimals=1)  # many ties
            if trial % 3 == 0:
                x[0, int(torch.randint(0, v, (1,), generator=g))] = float("nan")
            if trial % 5 == 0:
                x[:] = 1.0
            if trial % 7 == 0:
                x[-1, -1] = float("inf")
            got = Sampler.greedy_sample(x)
            want = torch.ops._C.greedy_argmax(x)
            same += torch.equal(got, want) and got.dtype == torch.int64 and got.shape == (m,)
        print("same:", same)
        """
    )
    assert "patched: True" in out
    assert "same: 200" in out


def test_small_logits_are_sampled_on_the_calling_thread():
    """Patch ``small_sampling_on_the_calling_thread`` (patches/sampler_threads.py): vLLM's
    sampler runs with one OpenMP thread for one request's logits (49,152 and 151,936
    values) and with the model's threads for eight rows, gives the greedy tokens of the
    float32 logits either way, and leaves the thread count as it was, also after an
    error; with VLLM_X86_SAMPLER_ONE_THREAD=0, vLLM's forward is untouched."""
    code = """
        import os, torch
        torch.set_num_threads(2)
        from vllm_x86.runtime import patches
        patches.apply_all()
        from vllm.v1.sample.sampler import Sampler
        from vllm.v1.sample.metadata import SamplingMetadata
        from vllm.v1.sample.logits_processor import LogitsProcessors
        from vllm_x86.runtime.patches.ledger import MARK
        print("patched:", getattr(Sampler.forward, MARK, False))
        seen, fail = [], []
        original = Sampler.sample
        def sample(self, logits, *a, **k):
            seen.append(torch.get_num_threads())
            if fail:
                raise RuntimeError("a failing sampler")
            return original(self, logits, *a, **k)
        Sampler.sample = sample
        def greedy(rows):
            z = torch.zeros(rows)
            return SamplingMetadata(
                temperature=None, all_greedy=True, all_random=False, top_p=None,
                top_k=None, generators={}, max_num_logprobs=None, no_penalties=True,
                prompt_token_ids=None, frequency_penalties=z, presence_penalties=z,
                repetition_penalties=z, output_token_ids=[[] for _ in range(rows)],
                allowed_token_ids_mask=None, bad_words_token_ids={},
                logitsprocs=LogitsProcessors())
        s = Sampler()
        g = torch.Generator().manual_seed(0)
        for rows, vocab in ((1, 49152), (1, 151936), (8, 49152)):
            x = torch.randn(rows, vocab, generator=g).to(torch.bfloat16)
            got = s(x, greedy(rows)).sampled_token_ids.view(-1).long()
            want = x.float().max(dim=-1).indices
            print(f"{rows}x{vocab}: inside {seen[-1]} after {torch.get_num_threads()} "
                  f"same {torch.equal(got, want)}")
        fail.append(1)
        try:
            s(torch.randn(1, 49152), greedy(1))
        except RuntimeError as e:
            print(f"error: {e}; inside {seen[-1]} after {torch.get_num_threads()}")
        """
    out = run(code)
    assert "patched: True" in out
    assert "1x49152: inside 1 after 2 same True" in out
    assert "1x151936: inside 1 after 2 same True" in out
    assert "8x49152: inside 2 after 2 same True" in out
    assert "error: a failing sampler; inside 1 after 2" in out

    off = run(code, VLLM_X86_SAMPLER_ONE_THREAD="0")
    assert "patched: False" in off
    assert "1x49152: inside 2 after 2 same True" in off
