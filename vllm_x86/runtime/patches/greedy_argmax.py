"""Patch ``greedy_sample_max`` (a monkey-patch; ledger.py).

vLLM's sampler picks a greedy request's token with ``Sampler.greedy_sample``, which on
CPU calls vLLM CPU's ``_C.greedy_argmax``. That kernel, like ``torch.argmax`` on CPU,
walks a row one element at a time: 65 us for one row of SmolLM2's 49,152 logits and
about 200 us for Qwen2.5's 151,936 on the development Xeon, every decode step, where
``torch.max(dim=-1)`` takes 25 and 64 us (2 threads, float32 logits). Both return the
index of the first largest value, and of the first NaN where a row has one; the patch
checks that on rows with ties, NaN and infinities (tests/unit/test_patches.py) and
returns the same int64 indices. Other platforms' path is vLLM's unchanged.

Upstream fix that removes it: vLLM CPU's greedy_argmax vectorized (or vLLM calling
torch.max). It can go when the pinned vLLM's kernel is as fast.
"""

from __future__ import annotations

from vllm_x86.runtime.patches.ledger import MARK


def apply() -> None:
    """Replace Sampler.greedy_sample on CPU (idempotent; see the module docstring)."""
    from vllm.platforms import current_platform
    from vllm.v1.sample.sampler import Sampler

    original = Sampler.__dict__["greedy_sample"].__func__
    if getattr(original, MARK, False) or not current_platform.is_cpu():
        return

    def greedy_sample(logits):
        return logits.max(dim=-1).indices.view(-1)

    setattr(greedy_sample, MARK, True)
    Sampler.greedy_sample = staticmethod(greedy_sample)
