"""Patch ``tied_embedding_gemm_once`` (a monkey-patch; ledger.py).

On CPU, vLLM prepares a GEMM for every embedding and LM head after loading
(``UnquantizedEmbeddingMethod.process_weights_after_loading`` in
``vocab_parallel_embedding.py`` calls ``dispatch_cpu_unquantized_gemm(layer,
remove_weight=False)`` in ``layers/utils.py``), which for bf16 builds a oneDNN handle
holding its own reordered copy of the weight. A model with tied word embeddings
(Qwen3-0.6B, SmolLM2, Llama 3.2 1B, ...) has two such layers, the input embedding and
the LM head, sharing one weight Parameter (``tie_weights``), so vLLM reorders the same
matrix twice and keeps two copies: for Qwen3-0.6B's 151936 x 1024 bf16 table, 297 MiB of
memory more and about 0.1-0.4 s more at every start on the development VM. The patch
wraps that function (vLLM imports it from its module at the call): for a layer whose
weight is a Parameter an earlier call already prepared, with ``remove_weight=False`` on
both (the weight stays as it is) and no bias on either, the layer gets the earlier
layer's ``cpu_linear``, the same GEMM of the same tensor; every other call goes to
vLLM's function unchanged. The Parameters are held weakly, so a later model (the daemon
serves many) never meets an old one's GEMM.

Upstream fix that removes it: vLLM preparing one GEMM per weight (or none for an input
embedding that no LM head shares). It can go when the pinned vLLM does.
"""

from __future__ import annotations

import weakref

from vllm_x86.runtime.patches.ledger import MARK

# id(weight Parameter) -> (a weak reference to it, the cpu_linear vLLM prepared for
# it); remove_weight=False only. Keyed by id: tensors compare elementwise, so they
# cannot be the keys of a WeakKeyDictionary. An entry goes when its Parameter does.
_PREPARED_GEMMS: dict[int, tuple] = {}


def apply() -> None:
    """Wrap vLLM's function (idempotent; see the module docstring)."""
    import torch
    from vllm.model_executor.layers import utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm
    if getattr(original, MARK, False):
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

    setattr(dispatch_cpu_unquantized_gemm, MARK, True)
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm


def forget(weight) -> None:
    """Drop the GEMM remembered for `weight` (once loading is done, so that a layer
    giving up its ``cpu_linear`` frees it unless another layer holds it)."""
    _PREPARED_GEMMS.pop(id(weight), None)
