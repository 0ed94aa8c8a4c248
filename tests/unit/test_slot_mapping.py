"""The plugin's slot mapping (ops/slot_mapping.py) against vLLM CPU's C++ stand-in for
vLLM's Triton kernel, and its registration in vLLM's place."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from vllm_x86.runtime.ops.slot_mapping import compute_slot_mapping

vllm_c = pytest.importorskip("vllm._C")


def _case(counts, block_size, max_tokens=4096, seed=0):
    g = torch.Generator().manual_seed(seed)
    reqs = len(counts)
    table = torch.randint(0, 2**31 // block_size - 1, (reqs + 3, 64), generator=g,
                          dtype=torch.int32)  # fmt: skip
    bounds = torch.zeros(reqs + 1, dtype=torch.int32)
    bounds[1:] = torch.cumsum(torch.tensor(counts, dtype=torch.int32), 0)
    positions = []
    for c in counts:  # each request's tokens continue its context at a random place
        start = int(torch.randint(0, 64 * block_size - c, (1,), generator=g))
        positions.append(torch.arange(start, start + c))
    return table, bounds, torch.cat(positions).to(torch.int64), max_tokens


@pytest.mark.parametrize(
    "counts,block_size",
    [([1], 16), ([1] * 8, 16), ([1] * 256, 128), ([7, 1, 300], 16), ([2048], 128),
     ([0, 3, 0, 1], 16), ([5, 1, 1, 9, 1], 64)],
)  # fmt: skip
def test_same_slots_as_vllm_cpu(counts, block_size):
    table, bounds, positions, max_tokens = _case(counts, block_size)
    n = positions.shape[0]
    theirs = torch.full((max_tokens,), -7, dtype=torch.int64)
    ours = theirs.clone()
    torch.ops._C.compute_slot_mapping_kernel_impl(bounds, positions, table, theirs, block_size)
    compute_slot_mapping(n, max_tokens, bounds, positions, table, table.stride(0), ours,
                         block_size)  # fmt: skip
    assert torch.equal(ours, theirs)
    # and what the slots mean: block of the token's request, offset in the block
    req = 0
    for t in range(n):
        while t >= bounds[req + 1]:
            req += 1
        p = int(positions[t])
        assert ours[t] == int(table[req, p // block_size]) * block_size + p % block_size
    assert (ours[n:] == -7).all()  # vLLM CPU's stand-in leaves the rest as it was


def _run(code: str, **env) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
        timeout=300, env=dict(os.environ, **env),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


REGISTERED = """
    import os
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON, dispatcher
    from vllm.v1.worker import block_table
    from vllm_x86.runtime.ops import slot_mapping
    if HAS_TRITON:
        print("triton has a CPU backend: nothing registered")
        raise SystemExit(0)

    def registered():
        impl = block_table.ComputeSlotMappingKernel.kernel._impl
        return "plugin" if impl is slot_mapping.compute_slot_mapping else impl.__module__

    register = dispatcher.register_kernels
    current_platform.register_triton_kernel_overrides()
    assert dispatcher.register_kernels is register  # put back after the call
    first = registered()
    # turned off: vLLM CPU's stand-in (registered again in this process to see it)
    os.environ["VLLM_X86_SLOT_MAPPING"] = "0"
    type(current_platform)._triton_overrides_registered = False
    current_platform.register_triton_kernel_overrides()
    print(first, registered())
"""


def test_registered_in_vllms_place_unless_turned_off():
    out = _run(REGISTERED)
    assert out in ("plugin vllm.utils.cpu_triton_utils",
                   "triton has a CPU backend: nothing registered"), out  # fmt: skip
