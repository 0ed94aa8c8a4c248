"""Patch ``inspect_models_in_process`` (a monkey-patch of a development tool; ledger.py).

Not applied by ``apply_all``: only the conformance suite's worker process
(vllm_x86/tools/conformance/conformance.py) calls it, on itself.

vLLM inspects a model class in a fresh subprocess (``registry._run_in_subprocess`` in
vllm/model_executor/models/registry.py: a Python + vLLM import, ~10 s on 2 cores) the
first time it meets the class, to keep CUDA uninitialised in the caller, and caches the
answer under VLLM_CACHE_ROOT/modelinfos. With a cold cache that is one such import per
architecture of the suite (74 of them). The worker runs on the CPU and imports each
model class anyway, so it asks the same question in-process: same function, same
answer, still written to the cache.

Upstream change that removes it: an option of vLLM's to inspect in-process on platforms
without CUDA. It can go when vLLM has one, or if the suite's cache of model infos is kept
warm in CI.
"""

from __future__ import annotations


def inspect_models_in_process() -> None:
    """vLLM's model inspection runs in this process instead of a subprocess."""
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = _run_here


def _run_here(fn):
    return fn()
