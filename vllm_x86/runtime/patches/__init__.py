"""Runtime patches: the places where the plugin changes how installed code behaves.

The plugin never rewrites files of vLLM, transformers or torch on disk. Where it must
change what they do, the change is a runtime patch, and every one is a record of the
ledger (ledger.py, shown in docs/patches.md): what it changes, why, the vLLM file and
version it is written against, the upstream change that would remove it, and its tests.
A test (tests/unit/test_patch_ledger.py) checks each record against the installed
packages, so a vLLM bump that moves a patched symbol fails and names the patch, and
fails on a patch site in the code that no record names.

This package holds the patches that are not part of a class the plugin gives vLLM, one
module each, its docstring the full story:

- ``qwen2_vl_torchvision``: an import hook serving transformers' torchvision-free
  Qwen2-VL image processing;
- ``aot_finalize_loading``: torch's AOT artifact class gets vLLM's ``finalize_loading``;
- ``frontend_warmup``: the OpenAI server's tokenizer copies and chat-template lookup
  beside the engine start;
- ``tied_embedding_gemm``: one prepared GEMM for a weight that tied layers share;
- ``openai_errors``: the OpenAI server's answers to a body it cannot parse, in vLLM's
  error shape and in words (docs/reliability.md);
- ``responses_input``: a 400, not a 500, for an assistant message of the Responses
  API's input without text;
- ``structured_output``: the plugin's checks of a structured-output request, run
  before vLLM's own (a 400 for a choice the model's tokens cannot spell);
- ``json_budget``: JSON-schema answers kept within max_tokens (the engine's grammar
  masks narrowed near the end of the budget; VLLM_X86_JSON_BUDGET);
- ``engine_death_exit``: the plugin's server exits 1, not 0, when its engine died;
- ``engine_thread``: with VLLM_X86_ENGINE_IN_SERVER=1, the engine core as a thread of
  the plugin's server instead of a process of its own;
- ``triton_allocator``: ``no_triton_allocator``, used by ops/gdn.py around one
  constructor;
- ``api_auth``: with an API key, vLLM's server asks for it on every route but the
  probes, metrics and the API description;
- ``model_inspection``: ``inspect_models_in_process``, applied by the conformance
  suite's worker to itself;
- ``greedy_argmax``: a greedy token by ``torch.max`` on CPU instead of vLLM CPU's
  one-element-at-a-time ``greedy_argmax`` (same indices, 2.5-3x faster);
- ``sampler_threads``: the sampler on the calling thread alone for one request's
  logits (no OpenMP region waiting for the model's other thread);
- ``step_profile``: timing wrappers for the harness's profiling mode, only with
  VLLM_X86_STEP_PROFILE set (docs/overhead.md).

The others live where they must, in the worker (its constructor and hooks), the
start-up code (staged.py, kv_alloc.py), the platform (``validate_environ``) and the op
classes, and their ledger records point there.

``apply_all()`` is called from the ``vllm.general_plugins`` entry point
(``vllm_x86.register_ops``), so it runs in every vLLM process that inspects or builds a
model (the engine, the workers, and the registry's inspection subprocess), and only when
X86Platform is vLLM's platform.
"""

from __future__ import annotations

from vllm_x86.runtime.patches import (
    aot_finalize_loading,
    api_auth,
    engine_death_exit,
    engine_thread,
    frontend_warmup,
    greedy_argmax,
    json_budget,
    openai_errors,
    qwen2_vl_torchvision,
    responses_input,
    sampler_threads,
    step_profile,
    structured_output,
    tied_embedding_gemm,
)
from vllm_x86.runtime.patches.ledger import LEDGER, Patch
from vllm_x86.runtime.patches.model_inspection import inspect_models_in_process
from vllm_x86.runtime.patches.triton_allocator import no_triton_allocator

__all__ = ["LEDGER", "Patch", "apply_all", "inspect_models_in_process", "no_triton_allocator"]


def apply_all() -> None:
    """Install the process-wide runtime patches (idempotent)."""
    qwen2_vl_torchvision.apply()  # first: before anything imports the model files
    aot_finalize_loading.apply()
    frontend_warmup.apply()
    api_auth.apply()
    tied_embedding_gemm.apply()
    openai_errors.apply()  # in the OpenAI server's process only
    responses_input.apply()  # in the OpenAI server's process only
    engine_death_exit.apply()  # in the plugin's OpenAI server's process only
    engine_thread.apply()  # in the plugin's servers: the engine launcher's context
    structured_output.apply()
    json_budget.apply()  # in the engine core's process: the grammar masks
    greedy_argmax.apply()  # the sampler: in the engine core's (worker's) process
    sampler_threads.apply()  # the sampler's threads: likewise
    step_profile.apply()  # only with VLLM_X86_STEP_PROFILE set
