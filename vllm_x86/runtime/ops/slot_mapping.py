"""The KV-cache slot of every token of a step, without an OpenMP region.

vLLM computes the slot mapping of each step (token t of request r goes to slot
``block_table[r, pos // block_size] * block_size + pos % block_size``) with a Triton
kernel; vLLM CPU registers a C++ stand-in for it (``compute_slot_mapping_kernel_impl``,
through vLLM's ``register_kernels``). That stand-in opens an OpenMP parallel region
for a few integers: at one request, one token. It is the first parallel region of a
decode step, and on a machine with few cores the model's other OpenMP thread is then
asleep (``GOMP_SPINCOUNT``) or its core is busy with the API server, which is turning
the last step's token into text at that moment; the region waits until that thread
runs. The step profile of the tiny model on the AMD EPYC VM (2 vCPUs) put 0.95-1.0 ms
of input preparation in that wait (docs/overhead.md).

This module computes the same slots with a few small PyTorch operations, which run on
the calling thread (PyTorch parallelises an element-wise operation only from 32,768
elements), about 20 µs at one request; the model's first parallel region comes later
in the step, by when the other core is usually free. Written here rather than in the
plugin's C++ library because it is a handful of tensor operations whose cost is the
Python call either way.

It is registered in place of vLLM CPU's stand-in, in the same call to vLLM's
``register_kernels`` (``in_vllm_registration``: vLLM's registration rebinds every
module attribute that holds a kernel, one scan of every module, so a second
registration would scan again), by ``X86Platform.register_triton_kernel_overrides``;
``VLLM_X86_SLOT_MAPPING=0`` keeps vLLM CPU's. Same slots as vLLM CPU's stand-in
(tests/unit/test_slot_mapping.py compares them), which, unlike the Triton kernel, leaves
the entries past the step's tokens as they are.
"""

from __future__ import annotations

import contextlib

import torch

# vLLM's name for the kernel (vllm/platforms/cpu.py registers its stand-in under it)
KERNEL = "vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel"


def compute_slot_mapping(
    num_tokens: int,
    max_num_tokens: int,
    query_start_loc: torch.Tensor,  # [num_reqs + 1], int32
    positions: torch.Tensor,  # [num_tokens], int64
    block_table: torch.Tensor,  # [max_num_reqs, max_num_blocks_per_req], int32
    block_table_stride: int,
    slot_mapping: torch.Tensor,  # [max_num_tokens], int64
    KV_CACHE_BLOCK_SIZE: int,  # noqa: N803 (the Triton kernel's parameter names)
    TOTAL_CP_WORLD_SIZE: int = 1,  # noqa: N803
    TOTAL_CP_RANK: int = 0,  # noqa: N803
    CP_KV_CACHE_INTERLEAVE_SIZE: int = 1,  # noqa: N803
    PAD_ID: int = -1,  # noqa: N803
    BLOCK_SIZE: int = 1024,  # noqa: N803
) -> None:
    """vLLM CPU's ``_compute_slot_mapping_kernel_impl``, with its parameters."""
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("Context Parallelism is not supported on CPU.")
    n = positions.shape[0]
    if n == 0:
        return
    bs = KV_CACHE_BLOCK_SIZE
    # request of each token: how many request ends lie at or before it
    token = torch.arange(n, dtype=query_start_loc.dtype)
    req = torch.searchsorted(query_start_loc[1:], token, right=True)
    blocks = block_table[req, torch.div(positions, bs, rounding_mode="floor")]
    torch.add(torch.remainder(positions, bs), blocks, alpha=bs, out=slot_mapping[:n])


@contextlib.contextmanager
def in_vllm_registration():
    """While vLLM CPU registers its Triton stand-ins: its slot-mapping one replaced by
    ``compute_slot_mapping``, in the same call."""
    from vllm.triton_utils import dispatcher

    original = dispatcher.register_kernels

    def register_kernels(overrides):
        overrides = dict(overrides)
        if KERNEL in overrides:
            overrides[KERNEL] = compute_slot_mapping
        return original(overrides)

    dispatcher.register_kernels = register_kernels
    try:
        yield
    finally:
        dispatcher.register_kernels = original
