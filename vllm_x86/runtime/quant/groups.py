"""INT4's group size per layer: a pure function (no torch), shared by the quantizer
(methods.py) and the plan per rank (parallel_plan.py), which must not import torch."""

from __future__ import annotations


def effective_group_size(k: int, group_size: int) -> int | None:
    """The group size a layer with K input channels uses: the configured one if it
    divides K, else the largest of 64 and 32 below it that does (SmolLM2's K = 576 is
    not a multiple of 128). Deterministic, so a prepacked checkpoint loads with the
    groups it was written with."""
    for g in (group_size, 64, 32):
        if g <= group_size and k % g == 0:
            return g
    return None
