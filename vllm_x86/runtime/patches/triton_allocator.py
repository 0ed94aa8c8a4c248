"""Patch ``no_triton_allocator`` (a function replaced for one constructor; ledger.py).

A context manager, not installed by ``apply_all``. vLLM's
``OlmoHybridGatedDeltaNetAttention.__init__``
(``model_executor/layers/mamba/gdn/olmo_gdn_linear_attn.py`` line 169) calls
``set_triton_allocator(device)`` unconditionally, which calls ``triton.set_allocator``.
The Triton here has no CPU backend, so vLLM disables it and ``vllm.triton_utils.triton``
is its ``TritonPlaceholder``, which has no ``set_allocator``: building the layer raises
``AttributeError``. The allocator only serves FLA's Triton kernels, which the plugin's
subclass of that layer (ops/gdn.py) does not run. So the subclass's ``__init__`` runs
vLLM's inside this context manager, which, only when vLLM reports no usable Triton,
rebinds the module's ``set_triton_allocator`` name to a no-op for the duration of that
call and restores it after. Nothing else is touched.

Upstream fix that removes it: vLLM skipping the call when ``HAS_TRITON`` is False (as
``register_triton_kernel_overrides`` does), or a CPU path for the layer.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator


@contextlib.contextmanager
def no_triton_allocator(module_name: str) -> Iterator[None]:
    """While active, ``module_name``'s ``set_triton_allocator`` does nothing, when
    vLLM has no usable Triton."""
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
