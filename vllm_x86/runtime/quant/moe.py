"""MoE experts of `x86_int8` and `x86_int4`: each expert's weights quantized while
loading, or loaded packed from a prepacked checkpoint.

vLLM's fused-MoE layer (``RoutedExperts``) asks the quantization config for a
``FusedMoEMethodBase``; ``X86QuantMoEMethod`` is the plugin's. It loads the experts'
bf16 weights as vLLM's unquantized method does (w13 [E, 2I, H]: gate and up; w2
[E, H, I]: down), then quantizes and packs each expert's w13 and w2 on its own with the
Linear layers' quantizer and packing (methods.quantize_pack), so the same GEMM kernels
(``torch.ops.vllm_x86.int8_w8a16_gemm`` / ``int4_w4a16_gemm``, or vLLM's / PyTorch's
where the Linear layers use those) compute each expert's tokens.

A prepacked checkpoint (`vllm-x86 quantize`, format version 2) holds each expert's
gate, up and down already packed by ``pack_experts`` (the same quantize_pack of the same
w13 and w2, w13 split at half its rows into gate and up); for the layers it lists in
``packed_experts`` the method, built with ``prepacked=True``, creates the packed [E, ...]
parameters and loads each expert's tensors into them (``_packed_loader``), nothing
quantized. Other layers of such a checkpoint (and every layer of a version-1 one) hold
bf16 experts and are quantized while loading (config.py).

Routing is not touched: vLLM's runner calls the layer's router (``select_experts``:
vLLM's CPU router, or the plugin's for sigmoid scores, ops/moe_routing.py) and hands the
chosen experts and their weights to ``apply``; the router's own weight stays in bf16
(scope.py). vLLM CPU's fused INT4/INT8 MoE kernels are not used: they quantize the
activations to 8 bits (the accuracy cost the Linear layers avoid, docs/quantization.md),
and its W4A8 MoE runs on Arm only.

``apply`` calls one custom op (``torch.ops.vllm_x86.quant_moe_experts``, opaque to
Dynamo, which compiles vLLM's CPU MoE forward) that groups the (token, expert) pairs by
expert and, for each expert that has tokens, runs gate_up GEMM -> activation-and-multiply (vLLM's) -> down GEMM, then adds
the rows, scaled by their routing weights, into a float32 output. A layer this method
does not take (an expert shape the kernel refuses, an activation other than SiLU/GELU
gated, expert parallelism) keeps vLLM's bf16 experts, with a warning that says why
(config.py).
"""

from __future__ import annotations

import weakref

import torch
from torch.nn import Module, Parameter
from vllm.model_executor.layers.fused_moe import FusedMoEMethodBase
from vllm.model_executor.layers.fused_moe.activation import MoEActivation

from vllm_x86.runtime.ops import schemas  # noqa: F401  (quant_moe_experts' schema, first)
from vllm_x86.runtime.quant import methods as m
from vllm_x86.runtime.quant import scope

ACTIVATIONS = (MoEActivation.SILU, MoEActivation.GELU, MoEActivation.GELU_TANH)
_logged: set[str] = set()
# Quantized expert layers by key, for the custom op below (weak: a dropped model goes).
_LAYERS: weakref.WeakValueDictionary[str, Module] = weakref.WeakValueDictionary()


def quant_moe_experts(
    x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, layer_key: str
) -> torch.Tensor:
    """The routed experts of the layer registered as `layer_key` (run_experts), as one
    op (torch.ops.vllm_x86.quant_moe_experts; schema and fake in ops/schemas.py): on
    CPU vLLM compiles the MoE layer's forward with Dynamo, and the grouping of tokens by
    expert depends on the data, so Dynamo must see it as one opaque call."""
    layer = _LAYERS[layer_key]
    return layer.quant_method.run(layer, x, topk_weights, topk_ids)


torch.library.impl("vllm_x86::quant_moe_experts", "CPU")(quant_moe_experts)


def moe_problem(moe, bits: int, group_size: int, kernel: str) -> str | None:
    """Why the experts of a layer with FusedMoEConfig `moe` cannot be quantized, or
    None."""
    if moe.moe_parallel_config.use_ep:
        return "expert parallelism is not supported by the quantized experts"
    if not moe.is_act_and_mul or moe.activation not in ACTIVATIONS:
        return f"activation {moe.activation.value!r} (the quantized experts run gated SiLU/GELU)"
    if getattr(moe, "swiglu_limit", None) is not None:
        return "a clamped SwiGLU (swiglu_limit)"
    return expert_shape_problem(
        moe.hidden_dim, moe.intermediate_size_per_partition, bits, group_size, kernel
    )


def expert_shape_problem(
    h: int, i: int, bits: int, group_size: int, kernel: str, split: bool = False
) -> str | None:
    """Why experts with hidden size `h` and intermediate size `i` cannot be quantized
    for `kernel` (gate_up 2I x H, down H x I), or None. `split`: also gate and up
    alone (I x H), which the prepacked format stores apart (pack_experts)."""
    shapes = [("gate_up", 2 * i, h), ("down", h, i)]
    if split:
        shapes.insert(0, ("gate (and up)", i, h))
    for what, n, k in shapes:
        p = scope.plan("experts", n, k, bits, group_size, kernel=kernel)
        if not p.quantized:
            return f"expert {what} weight {n}x{k}: {p.reason}"
    return None


def split_refusal(moe, bits: int, group_size: int, kernel: str) -> str | None:
    """With tensor parallel (experts split along the intermediate size): why each
    rank's share cannot be quantized as the whole experts are at tensor parallel size
    1, as a sentence for a refusal; None where it can (or nothing is split)."""
    tp = moe.moe_parallel_config.tp_size
    if tp == 1 or moe.moe_parallel_config.use_ep:
        return None
    h, full, i = moe.hidden_dim, moe.intermediate_size, moe.intermediate_size_per_partition
    what = (
        f"{NAMES[bits]} with tensor parallel size {tp}: the MoE experts' {full} "
        f"intermediate channels split into {i} per rank"
    )
    whole = expert_shape_problem(h, full, bits, group_size, kernel)
    part = expert_shape_problem(h, i, bits, group_size, kernel)
    if whole is None and part is not None:
        return (
            f"{what}, which cannot be quantized ({part}); they are at tensor parallel "
            "size 1. Use a smaller --tensor-parallel-size (or --pipeline-parallel-size)."
        )
    g = expert_group(bits, full, group_size)
    if whole is None and g is not None and i % g:
        fits = expert_group(bits, i, group_size)
        return (
            f"{what}, which their groups of {g} do not divide (a group would straddle "
            "two ranks). "
            + (f"Set VLLM_X86_QUANT_GROUP_SIZE={fits} or use" if fits else "Use")
            + " a smaller --tensor-parallel-size (or --pipeline-parallel-size)."
        )
    return None


NAMES = {8: "x86_int8", 4: "x86_int4"}


def _tp_size() -> int:
    """The tensor-parallel group's size; the experts' split is over that group only
    without data parallel (with it vLLM splits them over data x tensor ranks, and each
    rank's down projection is quantized on its own)."""
    from vllm_x86.runtime.quant.linear import _tp_size as size

    return size()


def expert_group(bits: int, k: int, group_size: int) -> int | None:
    """The INT4 group size of an expert weight with K input channels (None for INT8)."""
    return m.effective_group_size(k, group_size) if bits == 4 else None


def prepacked_kernel(bits: int, layout: str | None) -> str:
    """The kernel a prepacked checkpoint's experts are packed for (its layout's)."""
    return "w8a16" if bits == 8 else m.int4_layout_kernel(layout)


# Checkpoint names of an expert's projections -> vLLM's shard ids (w1 gate, w3 up,
# w2 down): the names vLLM's expert loaders map onto w13 and w2.
SHARDS = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2", "w1": "w1", "w3": "w3", "w2": "w2"}


def pack_experts(
    bits: int,
    kernel: str,
    gate: torch.Tensor,
    up: torch.Tensor,
    down: torch.Tensor,
    group_size: int,
    zero_point: bool,
) -> dict[str, dict[str, torch.Tensor]]:
    """One expert's weights (gate, up [I, H]; down [H, I]) quantized and packed exactly
    as process_weights_after_loading does (w13 = gate and up stacked, packed whole;
    w2), returned by shard: {"w1": gate's rows of the packed w13 tensors, "w3": up's,
    "w2": ...}. Packing works on blocks of whole output channels, so the packed w13
    splits into gate and up at half its first dimension when I is a multiple of the
    block (expert_shape_problem with split=True checks it)."""
    h, i = gate.shape[1], gate.shape[0]
    w13 = m.quantize_pack(
        bits, kernel, torch.cat([gate, up]), expert_group(bits, h, group_size), zero_point
    )
    w2 = m.quantize_pack(bits, kernel, down, expert_group(bits, i, group_size), zero_point)
    out: dict[str, dict[str, torch.Tensor]] = {"w1": {}, "w3": {}, "w2": w2}
    for name, t in w13.items():
        half = t.shape[0] // 2
        out["w1"][name], out["w3"][name] = t[:half], t[half:]
    return out


def _packed_loader(dtype: torch.dtype):
    """The weight loader of a packed expert parameter ([E, ...]): vLLM's expert loaders
    call it with one expert's tensor and its shard id (w1/w3: the first/second half of
    w13's first dimension; w2: the whole of w2)."""

    def load(param, loaded_weight, weight_name, shard_id, expert_id, return_success=False):
        if loaded_weight.dtype != dtype:
            raise ValueError(
                f"prepacked expert tensor {weight_name} of dtype {loaded_weight.dtype} where "
                f"{dtype} belongs: the checkpoint's files and its quantization_config "
                "disagree; quantize the bf16 model again"
            )
        dst = param.data[expert_id]
        if shard_id in ("w1", "w3"):
            half = dst.shape[0] // 2
            dst = dst.narrow(0, 0 if shard_id == "w1" else half, half)
        elif shard_id != "w2":
            raise ValueError(f"shard_id must be w1, w2 or w3, not {shard_id!r}")
        if tuple(dst.shape) != tuple(loaded_weight.shape):
            raise ValueError(
                f"prepacked expert tensor {weight_name} (expert {expert_id}, {shard_id}) has "
                f"shape {tuple(loaded_weight.shape)} where {tuple(dst.shape)} belongs; "
                "quantize the bf16 model again"
            )
        dst.copy_(loaded_weight)
        return True if return_success else None

    return load


def expert_kernel(bits: int, group_size: int) -> str:
    """The GEMM kernel of the experts: the one Linear layers quantized while loading use
    (the op table's rule)."""
    return m.weight_kernel(bits, group_size)


def run_experts(x, topk_weights, topk_ids, gemm, activation, num_experts, weight_on_input=False):
    """Routed MoE: x [M, H] bf16, topk_weights/topk_ids [M, top_k] -> [M, H] bf16.
    ``gemm(which, e, rows)`` multiplies rows by expert e's w13 (which=13) or w2 (2)."""
    from vllm.model_executor.layers.fused_moe.activation import apply_moe_activation

    m_tokens, top_k = topk_ids.shape
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    rows = order // top_k
    weights = topk_weights.reshape(-1)[order].float()
    out = torch.zeros(m_tokens, x.shape[1], dtype=torch.float32)
    start = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        idx, w = rows[start : start + c], weights[start : start + c]
        start += c
        xs = x[idx]
        if weight_on_input:  # top_k 1: the weight scales the expert's input instead
            xs = (xs.float() * w[:, None]).to(x.dtype)
        h = gemm(13, e, xs)
        a = h.new_empty(c, h.shape[1] // 2)
        apply_moe_activation(activation, a, h)
        y = gemm(2, e, a).float()
        out.index_add_(0, idx, y if weight_on_input else y * w[:, None])
    return out.to(x.dtype)


class X86QuantMoEMethod(FusedMoEMethodBase):
    def __init__(self, config, moe, prepacked: bool = False) -> None:
        super().__init__(moe)
        self.config = config
        self.bits = config.BITS
        # prepacked: the checkpoint holds this layer's experts packed (pack_experts)
        self.prepacked = prepacked
        self.kernel = (
            prepacked_kernel(self.bits, config.layout)
            if prepacked
            else expert_kernel(self.bits, config.group_size)
        )

    def create_weights(
        self, layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype, **kw
    ):
        from vllm.model_executor.layers.fused_moe import UnquantizedFusedMoEMethod

        if params_dtype != torch.bfloat16:
            raise ValueError(
                f"{self.config.get_name()} runs bfloat16 models (its kernels take bfloat16 "
                f"activations), not {params_dtype}; pass --dtype bfloat16"
            )
        if self.prepacked:
            self._create_prepacked(
                layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype, kw
            )
            return
        # the bf16 parameters and loaders of vLLM's unquantized method (it reads only
        # self.moe): the checkpoint loads exactly as without quantization
        UnquantizedFusedMoEMethod.create_weights(
            self,
            layer,
            num_experts,
            hidden_size,
            intermediate_size_per_partition,
            params_dtype,
            **kw,
        )

    def _create_prepacked(self, layer, e, h, i, params_dtype, attrs) -> None:
        """The packed parameters of a prepacked checkpoint's experts ([E, ...] stacks of
        what pack_experts makes of each expert), loaded by _packed_loader; biases, if
        any, in bf16 with vLLM's loader."""
        from vllm.model_executor.utils import set_weight_attrs

        if self.moe.moe_parallel_config.tp_size > 1:
            raise ValueError(
                "prepacked x86 checkpoints run with tensor parallel size 1; serve the bf16 "
                f"model with --quantization {self.config.get_name()} to split it"
            )
        for which, n, k in (("w13", 2 * i, h), ("w2", h, i)):
            group = expert_group(self.bits, k, self.config.group_size)
            for name, (shape, dtype, _) in m.packed_shapes(
                self.bits, self.kernel, n, k, group
            ).items():
                p = Parameter(torch.empty((e, *shape), dtype=dtype), requires_grad=False)
                set_weight_attrs(p, {"weight_loader": _packed_loader(dtype)})
                layer.register_parameter(f"{which}_{name}", p)
            if self.moe.has_bias:
                b = Parameter(torch.zeros(e, n, dtype=params_dtype), requires_grad=False)
                layer.register_parameter(f"{which}_bias", b)
                set_weight_attrs(b, attrs)

    def _down_split(self) -> bool:
        """Tensor parallel splits the experts' down projection over this rank's tensor
        parallel group (not with data parallel, where the split spans the DP ranks too)."""
        parallel = getattr(self.moe, "moe_parallel_config", None)
        tp = getattr(parallel, "tp_size", 1)
        return tp > 1 and not parallel.use_ep and tp == _tp_size()

    def _split_down(self, w: torch.Tensor, group: int | None) -> list[dict]:
        """Tensor parallel splits each expert's down projection along K (the
        intermediate size): quantized as at tensor parallel size 1, as the linear
        layers are (linear.py): INT8 with the whole row's scale (a max over the ranks);
        INT4 as it is (split_refusal let it through: each rank's share holds whole
        groups of the size the whole weight uses)."""
        from vllm_x86.runtime.quant.linear import _tp_max

        if self.bits == 4:  # groups that straddle ranks were refused (split_refusal)
            return [
                m.quantize_pack(4, self.kernel, w[x], group, self.config.zero_point)
                for x in range(w.shape[0])
            ]
        amax = _tp_max(w.float().abs().amax(dim=2))  # [E, H]: each row's maximum, all ranks
        out = []
        for x in range(w.shape[0]):
            q, scale = m.quantize_int8(w[x], amax=amax[x])
            out.append({"weight": m.pack_int8_for(self.kernel, q), "weight_scale": scale})
        return out

    def process_weights_after_loading(self, layer: Module) -> None:
        if getattr(layer, "x86_done", False):
            return
        layer.x86_done = True
        # The key is vLLM's layer name, the same in every process: compiled mode bakes it
        # into the graph, and a later start loads that graph from the compile cache.
        name = getattr(layer, "layer_name", None) or f"experts@{id(layer):x}"
        other = _LAYERS.get(name)
        if other is not None and other is not layer:
            m._warn_once(
                f"moe-key-{name}",
                "vllm-x86: a second model in this process has MoE layer %s; the custom op "
                "now runs the newer one's experts under that name",
                name,
            )
        layer.x86_moe_key = name
        _LAYERS[name] = layer
        if self.prepacked:
            m.check_prepacked_runs(
                self.kernel, "this checkpoint's MoE experts are packed", self.config.get_name()
            )
        elif self.kernel in ("w8a16", "w4a16"):
            m.check_plugin_kernels()
        elif self.kernel == "torch":
            m._warn_once(
                "noamx",
                "vllm-x86: %s without AMX or AVX-512 VNNI runs PyTorch's weight-only kernels: "
                "fast for one request, slow for batches",
                self.config.get_name(),
            )
        layer.x86_moe_elements = 0  # elements on the INT8/INT4 kernels (conformance count)
        e, h, i = (
            layer.w13_weight.shape[0],
            self.moe.hidden_dim,
            self.moe.intermediate_size_per_partition,
        )
        for which, n, k in (("w13", 2 * i, h), ("w2", h, i)):
            layer.x86_moe_elements += e * n * k
            group = expert_group(self.bits, k, self.config.group_size)
            if not self.prepacked:  # quantize and pack each expert's bf16 weight
                w = getattr(layer, f"{which}_weight").data
                if which == "w2" and self._down_split():
                    packed = self._split_down(w, group)
                else:
                    packed = [
                        m.quantize_pack(self.bits, self.kernel, w[x], group, self.config.zero_point)
                        for x in range(e)
                    ]
                for name in packed[0]:
                    t = torch.stack([p[name] for p in packed])
                    setattr(layer, f"{which}_{name}", Parameter(t, requires_grad=False))
            setattr(layer, f"x86_{which}_group", group)
            bias = getattr(layer, f"{which}_bias", None)
            setattr(layer, f"x86_{which}_bias", None if bias is None else bias.data.float())
        key = f"{self.config.get_name()}{tuple(layer.w13_weight.shape)}{self.prepacked}"
        if key not in _logged:
            _logged.add(key)
            n13 = 2 * i
            m.logger.info(
                "vllm-x86: MoE experts in INT%d (%s, %d experts, gate_up %dx%d, down %dx%d, "
                "kernel %s%s)",
                self.bits,
                "prepacked" if self.prepacked else "quantized while loading",
                e,
                n13,
                self.moe.hidden_dim,
                self.moe.hidden_dim,
                self.moe.intermediate_size_per_partition,
                self.kernel,
                "" if self.bits == 8 else f", groups {layer.x86_w13_group}/{layer.x86_w2_group}",
            )

    def _gemm(self, layer):
        bits, kernel = self.bits, self.kernel

        def gemm(which: int, e: int, x: torch.Tensor) -> torch.Tensor:
            w = "w13" if which == 13 else "w2"
            bias = getattr(layer, f"x86_{w}_bias")
            bias = None if bias is None else bias[e]
            weight = getattr(layer, f"{w}_weight")[e]
            if bits == 8:
                return m.int8_matmul(
                    kernel, x, weight, getattr(layer, f"{w}_weight_scale")[e], bias
                )

            def part(name):
                t = getattr(layer, f"{w}_{name}", None)
                return None if t is None else t[e]

            return m.int4_matmul(
                kernel,
                x,
                weight,
                part("weight_scale"),
                part("weight_zp"),
                getattr(layer, f"x86_{w}_group"),
                bias,
                part("weight_scale_zero"),
            )

        return gemm

    def get_fused_moe_quant_config(self, layer):
        from vllm.model_executor.layers.fused_moe.config import FusedMoEQuantConfig

        return FusedMoEQuantConfig.make()  # describes nothing the runner acts on here

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        if layer.expert_map is not None:
            raise NotImplementedError("vllm-x86: quantized MoE experts with expert parallelism")
        return torch.ops.vllm_x86.quant_moe_experts(x, topk_weights, topk_ids, layer.x86_moe_key)

    def run(self, layer, x, topk_weights, topk_ids):
        return run_experts(
            x,
            topk_weights,
            topk_ids,
            self._gemm(layer),
            layer.activation,
            layer.w13_weight.shape[0],
            layer.apply_router_weight_on_input,
        )
