"""Patch ``small_sampling_on_the_calling_thread`` (a monkey-patch; ledger.py).

After the LM head, vLLM's sampler works on the step's logits: it converts them to
float32 (``Sampler.forward``), applies the logits processors and picks the tokens
(for greedy requests ``torch.max``, patch ``greedy_sample_max``). PyTorch splits an
element-wise operation or a reduction of more than 32,768 elements across its OpenMP
threads, so at one request each of those opens a parallel region over one row of
49,152 (SmolLM2) or 151,936 (Qwen2.5) logits, about 10-30 µs of work. On a machine
whose every core runs a model thread, by then the model's other OpenMP thread has gone
to sleep (``GOMP_SPINCOUNT``, docs/threads.md) or its core is running the API server,
and the region waits until that thread runs again: py-spy with native frames on the
engine of SmolLM2 INT8 (AMD EPYC VM, 2 vCPUs) found the conversion's region, waiting
in libgomp's barrier, in 5.5 % of the samples of the busy loop, about 0.45 ms of a
decode step, for a conversion that takes 10 µs on its own.

With ``VLLM_X86_SAMPLER_ONE_THREAD`` (default 1), ``Sampler.forward`` runs with the
calling thread's OpenMP thread count at 1 where the logits have at most
``SMALL_LOGITS`` elements (one request's row, up to five of SmolLM2's), so those
operations run on the calling thread without a parallel region; the count is set back
before it returns, also on an error. Larger batches keep the model's threads. The
count is the calling thread's own (OpenMP's ``nthreads-var``, what PyTorch's
``get_num_threads`` reads): set through the OpenMP runtime that PyTorch loaded
(``libgomp.so.1``), not ``torch.set_num_threads``, which also resets oneDNN's cache.
Where that runtime is not the one PyTorch uses (checked once: PyTorch must read the
count back), the patch is not applied and the log says so.

With it, the sampler's share of those samples fell from 8.6-9.8 % to 1.9-3.5 %, and the
side-by-side harness read 1.09x (0.92-1.18 per round) at one request (docs/overhead.md).
Same tokens: the operations are the same, on one thread (tests/unit/test_patches.py).
Upstream change that removes it: PyTorch not opening a parallel region for work this
small, or vLLM's sampler choosing its threads.
"""

from __future__ import annotations

import contextlib
import ctypes

from vllm_x86.runtime import envs
from vllm_x86.runtime.log import get_logger
from vllm_x86.runtime.patches.ledger import MARK

logger = get_logger("patches")

# Logits of at most this many elements are sampled on the calling thread: one row of
# the largest vocabularies served (Qwen2.5's 151,936), five of SmolLM2's 49,152.
SMALL_LOGITS = 1 << 18
OPENMP_RUNTIME = "libgomp.so.1"

_omp = None  # the OpenMP runtime's (get, set) functions, once checked


def openmp_threads():
    """(omp_get_max_threads, omp_set_num_threads) of the OpenMP runtime PyTorch runs on,
    or None with the reason logged (checked once per process)."""
    global _omp
    if _omp is not None:
        return _omp or None
    import torch

    try:
        lib = ctypes.CDLL(OPENMP_RUNTIME)  # the one already loaded with PyTorch
        get, put = lib.omp_get_max_threads, lib.omp_set_num_threads
    except (OSError, AttributeError) as e:
        logger.info("vllm-x86: sampling keeps PyTorch's threads (no %s: %s)", OPENMP_RUNTIME, e)
        _omp = False
        return None
    get.restype = ctypes.c_int
    put.argtypes = [ctypes.c_int]
    before = torch.get_num_threads()
    put(1)
    seen = torch.get_num_threads()
    put(before)
    if seen != 1 or torch.get_num_threads() != before:
        logger.info(
            "vllm-x86: sampling keeps PyTorch's threads (%s is not the OpenMP runtime "
            "PyTorch uses)",
            OPENMP_RUNTIME,
        )
        _omp = False
        return None
    _omp = (get, put)
    return _omp


@contextlib.contextmanager
def one_thread(numel: int):
    """The calling thread's OpenMP thread count at 1 for logits of `numel` elements up
    to SMALL_LOGITS, as it was otherwise; restored on the way out."""
    omp = _omp or None
    if omp is None or numel > SMALL_LOGITS:
        yield
        return
    get, put = omp
    before = get()
    if before == 1:
        yield
        return
    put(1)
    try:
        yield
    finally:
        put(before)


def apply() -> None:
    """Wrap Sampler.forward on CPU (idempotent; see the module docstring)."""
    if not envs.get_bool("VLLM_X86_SAMPLER_ONE_THREAD"):
        return
    from vllm.platforms import current_platform
    from vllm.v1.sample.sampler import Sampler

    original = Sampler.forward
    if getattr(original, MARK, False) or not current_platform.is_cpu():
        return
    if openmp_threads() is None:
        return

    def forward(self, logits, *args, **kwargs):
        with one_thread(logits.numel()):
            return original(self, logits, *args, **kwargs)

    setattr(forward, MARK, True)
    forward.__wrapped__ = original
    Sampler.forward = forward
