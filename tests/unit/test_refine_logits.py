"""torch.ops.vllm_x86.refine_top_logits (the best logits of a bf16/fp16 LM head
recomputed in float32, ops/logits.py) against its reference
(ops/reference.refine_top_logits) on every elementwise ISA this CPU can run.

The kernel must pick the same candidates as the reference (the same threshold, in
float32) and leave every other logit at its exact float32 conversion; a recomputed
logit is a float32 dot product summed in another order, so it may differ from the
reference in the last bits. Rows with NaN, +inf or only -inf behave as torch's amax
makes the reference behave.
"""

from __future__ import annotations

import pytest
import torch

from vllm_x86.runtime.ops import kernels, reference
from vllm_x86.runtime.ops.logits import REFINE_REL, refine_top_logits

pytestmark = pytest.mark.skipif(
    not kernels.available(), reason=f"kernel library not built: {kernels.load_error()}"
)


def _case(rows, vocab, hidden, dtype, seed, bias=False):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, hidden, generator=g).to(dtype)
    w = (torch.randn(vocab + 5, hidden, generator=g) * 0.3).to(dtype)  # more rows than vocab
    b = (torch.randn(vocab + 5, generator=g)).to(dtype) if bias else None
    logits = h.float() @ w[:vocab].float().t()
    if b is not None:
        logits = logits + b[:vocab].float()
    logits = logits.to(dtype)  # the head's rounded output
    return logits, h, w, b


def _check(logits, h, w, b):
    got = torch.ops.vllm_x86.refine_top_logits(logits, h, w, b, REFINE_REL)
    want = reference.refine_top_logits(logits, h, w, b, REFINE_REL)
    plain = logits.to(torch.float32)
    assert got.dtype == torch.float32 and got.shape == logits.shape
    # the same tokens recomputed, the others left as converted (NaN where NaN)
    changed_got = ~((got == plain) | (got.isnan() & plain.isnan()))
    changed_want = ~((want == plain) | (want.isnan() & plain.isnan()))
    assert torch.equal(changed_got, changed_want)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    return got


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "rows,vocab,hidden", [(1, 49152, 576), (3, 1003, 100), (8, 4096, 256), (1, 17, 8)]
)
@pytest.mark.parametrize("bias", [False, True])
def test_refined_logits_match_the_reference(isa, dtype, rows, vocab, hidden, bias):
    logits, h, w, b = _case(rows, vocab, hidden, dtype, seed=rows + vocab, bias=bias)
    got = _check(logits, h, w, b)
    exact = h.float() @ w[:vocab].float().t() + (b[:vocab].float() if bias else 0)
    assert torch.equal(got.argmax(-1), exact.argmax(-1))


def test_near_ties_are_all_recomputed(isa):
    h = torch.ones(2, 8, dtype=torch.bfloat16)
    w = torch.ones(40, 8)
    w[29, 0] += 0.01  # one of 40 near-equal tokens is best
    w = w.to(torch.bfloat16)
    got = _check(h @ w.t(), h, w, None)
    assert got.argmax(-1).tolist() == [29, 29]


def test_rows_with_nan_and_infinities(isa):
    logits, h, w, _ = _case(4, 300, 32, torch.bfloat16, seed=7)
    logits[0, 5] = float("nan")  # NaN best: nothing recomputed
    logits[1, 17] = float("inf")  # +inf best: nothing recomputed
    logits[2, :] = float("-inf")  # only -inf: the threshold is -inf, every token recomputed
    logits[3, 299] = float("-inf")  # one -inf beside finite values: as usual
    got = _check(logits, h, w, None)
    assert got[0, 5].isnan() and got[1, 17] == float("inf")
    assert torch.isfinite(got[2]).all()


def test_the_logits_processor_uses_the_kernel_where_it_can():
    """ops/logits.refine_top_logits (what the LogitsProcessor calls) gives the kernel's
    result; the kernel refuses float32 logits, which need no refining."""
    logits, h, w, _ = _case(2, 2000, 64, torch.bfloat16, seed=3)
    kernel = torch.ops.vllm_x86.refine_top_logits(logits, h, w, None, REFINE_REL)
    assert torch.equal(refine_top_logits(logits, h, w), kernel)
    with pytest.raises(RuntimeError, match="bfloat16 or float16"):
        torch.ops.vllm_x86.refine_top_logits(logits.float(), h.float(), w.float(), None, 0.1)
