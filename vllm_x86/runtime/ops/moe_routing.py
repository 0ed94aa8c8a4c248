"""Sigmoid top-k MoE routing for vLLM's CPU router.

vLLM's CPU MoE router (``CPURouter._compute_routing`` in
vllm/model_executor/layers/fused_moe/router/cpu_router.py) handles grouped top-k
(softmax or sigmoid scores), DeepSeek V4's sqrtsoftplus, custom routing functions and,
on the remaining path, softmax only: ``assert self.scoring_func == "softmax"``. On GPU
the same models route through ``FusedTopKRouter`` / ``FusedTopKBiasRouter``, which take
sigmoid scores with an optional correction bias; on CPU every MoE layer gets a
``CPURouter`` (router_factory.py), so a model that routes with sigmoid scores and no
expert groups (Laguna; MiniMax-M2, with an ``e_score_correction_bias``) stops at that
assert on its first forward.

The routing those models (and transformers' ``LagunaTopKRouter``,
``MiniMaxM2TopKRouter``) define, per token, in float32:

    scores  = sigmoid(router_logits)
    chosen  = top_k(scores + e_score_correction_bias)  # the bias steers the choice only
    weights = scores[chosen]                           # ... not the weights
    weights = weights / sum(weights)                   # when renormalize
    weights = weights * routed_scaling_factor          # when the router applies it

The op table switches the class of each ``CPURouter`` of a loaded model that would
reach that assert to ``X86CPURouter`` below (``registry.apply_module_overrides``,
"router" rows); every other router keeps vLLM's code, the softmax path included. A
scoring function neither vLLM nor the plugin implements on this path raises a clear
error instead of routing differently. ``sigmoid_topk`` is plain torch ops, so Dynamo
traces through it in compiled mode; ``reference.sigmoid_topk`` is its reference.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.fused_moe.router.cpu_router import CPURouter

# Scoring functions vLLM's CPURouter itself handles on its non-grouped,
# non-custom path (sqrtsoftplus through its own biased/hash top-k kernels).
_VLLM_HANDLES = ("softmax", "sqrtsoftplus")
SUPPORTED = ("sigmoid",)


def sigmoid_topk(
    router_logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    e_score_correction_bias: torch.Tensor | None,
    routed_scaling_factor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[tokens, experts] logits -> (float32 weights, int32 expert ids), [tokens, top_k],
    contiguous, as vLLM's CPU MoE experts read them. Ids come best first."""
    scores = router_logits.float().sigmoid()
    if e_score_correction_bias is not None:
        choice = scores + e_score_correction_bias.float().unsqueeze(0)
        ids = torch.topk(choice, k=top_k, dim=-1)[1]
        weights = scores.gather(1, ids)
    else:
        weights, ids = torch.topk(scores, k=top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if routed_scaling_factor != 1.0:
        weights = weights * routed_scaling_factor
    return weights.contiguous(), ids.to(torch.int32).contiguous()


def needs_routing(router) -> str | None:
    """None if vLLM's CPURouter would reach its softmax-only assert with this router
    (so the plugin's routing applies), else why the router keeps vLLM's code."""
    if router.use_grouped_topk:
        return "grouped top-k (vLLM's CPU router handles softmax and sigmoid there)"
    if router.custom_routing_function is not None:
        return "a custom routing function"
    if router.scoring_func in _VLLM_HANDLES:
        return f"scoring_func={router.scoring_func!r} (vLLM's CPU router handles it)"
    return None


class X86CPURouter(CPURouter):
    """vLLM's CPURouter, with routing for its non-grouped, non-custom path when the
    scoring function is not softmax (vLLM asserts softmax there).

    A direct subclass rather than a mixin: CPython refuses to switch an object's class
    to a (mixin, CPURouter) class ("object layout differs"; vLLM's routers derive
    from ABC), and accepts a plain subclass."""

    def _compute_routing(
        self,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor,
        indices_type: torch.dtype | None,
        *,
        input_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if needs_routing(self) is not None:  # configuration changed after loading
            return super()._compute_routing(
                hidden_states, router_logits, indices_type, input_ids=input_ids
            )
        if self.scoring_func not in SUPPORTED:
            raise NotImplementedError(
                f"vllm-x86: MoE routing with scoring_func={self.scoring_func!r} and no "
                "expert groups is implemented neither by vLLM's CPU router (softmax, "
                f"sqrtsoftplus) nor by the plugin ({', '.join(SUPPORTED)})"
            )
        return sigmoid_topk(
            router_logits,
            self.top_k,
            self.renormalize,
            self.e_score_correction_bias,
            self.routed_scaling_factor,
        )
