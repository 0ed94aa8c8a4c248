"""Patch ``aot_artifact_finalize_loading`` (a monkey-patch; ledger.py).

In compiled mode vLLM saves the compiled model as an AOT artifact and, at the next
start, loads it back (``compilation/decorators.py``, ``_try_load_aot_compiled_fn``) and
then calls ``loaded_fn._artifacts.compiled_fn.finalize_loading(vllm_config)``. Only
vLLM's own ``VllmSerializableFunction`` (``compilation/caching.py``) has that method.
vLLM CPU compiles in mode ``DYNAMO_TRACE_ONCE`` with the plain ``inductor`` backend
(``platforms/cpu.py``), so torch saves the model as its own
``BundledAOTAutogradSerializableCallable`` (``torch/_dynamo/aot_compile_types.py``),
whose ``__getattr__`` forwards to the compiled function: the call raises
``'function' object has no attribute 'finalize_loading'``, vLLM logs "Compiling model
again due to a load failure" and compiles from scratch at every start, so the compile
cache saves only Inductor's own part. For that class there is nothing left to
finalize: its ``deserialize_compile_artifacts`` has already rebuilt the compiled
function when ``torch.compiler.load_compiled_function`` returns (vLLM's method exists
because its class defers that work, and returns at once when it has nothing deferred).
The patch gives torch's class a ``finalize_loading`` that does nothing, only when the
class has none of its own. Whether an artifact is still valid is decided as before:
vLLM's source check and guards, the plugin's cache key and manifests
(startup/compile_cache.py).

Upstream fix that removes it: vLLM calling ``finalize_loading`` only where it exists
(or torch's class defining it). It can go when the pinned vLLM or torch has either.
"""

from __future__ import annotations


def apply() -> None:
    """torch's AOT-compiled callable gets the no-op ``finalize_loading`` vLLM calls."""
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as cls

    if "finalize_loading" not in vars(cls):
        cls.finalize_loading = finalize_loading_done


def finalize_loading_done(self, vllm_config) -> None:
    """Already loaded: deserialize_compile_artifacts rebuilt the compiled function."""
