"""vllm_x86/patches.py: the runtime patches, each in a fresh interpreter (an import hook
must not leak into the other tests' sys.modules)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import pytest


def run(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def torchvision_missing() -> None:
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here: the patch steps aside")


def test_qwen2_vl_image_processing_served_without_torchvision(torchvision_missing):
    out = run(
        """
        import importlib
        from vllm_x86 import patches
        name = patches.QWEN2_VL_TORCHVISION_MODULE
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            print("before:", e.name)
        patches.apply_all()
        patches.apply_all()  # idempotent
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import (
            Qwen2VLImageProcessor, smart_resize,
        )
        pil = importlib.import_module(patches.QWEN2_VL_PIL_MODULE)
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


def test_hook_steps_aside_when_torchvision_is_available():
    from vllm_x86 import patches

    finder = patches.Qwen2VLImageProcessingFinder()
    orig = patches._torchvision_available
    try:
        patches._torchvision_available = lambda: True
        assert finder.find_spec(patches.QWEN2_VL_TORCHVISION_MODULE) is None
        patches._torchvision_available = lambda: False
        assert finder.find_spec(patches.QWEN2_VL_TORCHVISION_MODULE) is not None
        assert finder.find_spec("transformers.models.qwen2_vl.modeling_qwen2_vl") is None
    finally:
        patches._torchvision_available = orig


def test_vllm_qwen3_5_model_file_imports(torchvision_missing):
    out = run(
        """
        from vllm_x86 import patches
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

    from vllm_x86 import patches

    name = "vllm.model_executor.layers.mamba.gdn.olmo_gdn_linear_attn"
    module = importlib.import_module(name)
    original = module.set_triton_allocator
    with patches.no_triton_allocator(name):
        inside = module.set_triton_allocator
        inside("cpu")  # no Triton needed
    assert module.set_triton_allocator is original
    assert (inside is original) == HAS_TRITON
