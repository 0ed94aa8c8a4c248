"""The vLLM linear methods of `x86_int8` and `x86_int4`: create a layer's weights
(bf16 to quantize while loading, or a prepacked checkpoint's tensors), pack them after
loading and multiply. The arithmetic (quantize, pack, kernel choice, GEMM calls) is
methods.py's; which layers stay in bf16 is scope.py's; config.py binds these classes to
vLLM's ``LinearMethodBase``.
"""

from __future__ import annotations

import torch
from torch.nn import Module, Parameter

from vllm_x86.runtime.quant import scope
from vllm_x86.runtime.quant.methods import (
    _info_once,
    _warn_once,
    check_prepacked_runs,
    effective_group_size,
    grid_group,
    int4_layout_kernel,
    int4_matmul,
    int4_rounding_for,
    int8_kernel,
    int8_matmul,
    pack_int8_for,
    packed_shapes,
    plugin_kernels_available,
    quantize_int8,
    quantize_pack,
    weight_kernel,
)


def _tp_size() -> int:
    from vllm.distributed import get_tensor_model_parallel_world_size

    return get_tensor_model_parallel_world_size()


def _tp_max(t: torch.Tensor) -> torch.Tensor:
    """The elementwise maximum of `t` over the tensor-parallel ranks (t itself at size
    1), through the group's CPU process group (gloo; once per layer at load time)."""
    if _tp_size() == 1:
        return t
    import torch.distributed as dist
    from vllm.distributed.parallel_state import get_tp_group

    t = t.contiguous()
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=get_tp_group().cpu_group)
    return t


def _packed_param(layer: Module, name: str, shape, dtype, weight_loader, rows_per_entry=1):
    """A parameter for a prepacked tensor, loaded by the layer's own weight loader.

    Tensor parallel: a column-parallel layer's rank takes its output channels, whole
    blocks of them (above). A row-parallel layer's rank takes part of every channel's
    input channels K: every packed layout orders each block row by K first (blocks of 64
    inputs, or groups), so the rank's share is a contiguous range of dimension 1, the
    rank's index times its size, which is what vLLM's RowParallelLinear loader narrows
    to given `input_dim` 1; a per-channel INT8 scale (one dimension) is the whole row's,
    as at one rank. check_split has refused shares that cut a block or a group.

    Prepacked checkpoints keep the checkpoint's unfused names (q_proj, k_proj, ...),
    each tensor packed on its own. Packing works on blocks of whole output channels (16
    for INT8, 32 for INT4) and packing a concatenation equals concatenating the packed
    parts (tested), so vLLM's loaders for fused layers place each part at its output
    offset: `output_dim` 0, and for tensors whose first dimension counts blocks of
    channels, `packed_dim` 0 with `packed_factor` the block size (the offsets are
    divided by it)."""
    from vllm.model_executor.utils import set_weight_attrs

    p = Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
    attrs = {"output_dim": 0, "weight_loader": _checked(weight_loader, dtype)}
    if getattr(layer, "x86_k_split", False) and len(shape) > 1:
        attrs["input_dim"] = 1
    if rows_per_entry > 1:
        attrs.update(packed_dim=0, packed_factor=rows_per_entry)
    set_weight_attrs(p, attrs)
    layer.register_parameter(name, p)


def _checked(weight_loader, dtype):
    """The layer's loader, after a dtype check: a bf16 tensor where a packed one
    belongs means the checkpoint and its config disagree."""

    def load(param, loaded_weight, *args, **kwargs):
        if loaded_weight.dtype != dtype:
            raise ValueError(
                f"prepacked tensor of dtype {loaded_weight.dtype} where {dtype} belongs: "
                "the checkpoint's files and its quantization_config disagree; quantize "
                "the bf16 model again"
            )
        return weight_loader(param, loaded_weight, *args, **kwargs)

    return load


def _set(layer: Module, name: str, t: torch.Tensor) -> None:
    if hasattr(layer, name):
        delattr(layer, name)
    layer.register_parameter(name, Parameter(t, requires_grad=False))


class _X86QuantLinearMethod:
    """Shared create_weights for both methods (subclasses of vLLM's LinearMethodBase
    are built in config.py, so importing this module needs no vLLM import)."""

    bits: int

    def __init__(self, config) -> None:
        self.config = config

    # bf16 weights, quantized after loading
    def _create_bf16(self, layer, k, n, params_dtype, extra) -> None:
        from vllm.model_executor.parameter import ModelWeightParameter
        from vllm.model_executor.utils import set_weight_attrs

        weight_loader = extra.pop("weight_loader")
        weight = ModelWeightParameter(
            data=torch.empty(n, k, dtype=params_dtype),
            input_dim=1,
            output_dim=0,
            weight_loader=weight_loader,
        )
        layer.register_parameter("weight", weight)
        set_weight_attrs(weight, extra)

    def create_weights(
        self,
        layer,
        input_size_per_partition,
        output_partition_sizes,
        input_size,
        output_size,
        params_dtype,
        **extra_weight_attrs,
    ):
        if params_dtype != torch.bfloat16:
            raise ValueError(
                f"{self.config.get_name()} runs bfloat16 models (its kernels take bfloat16 "
                f"activations), not {params_dtype}; pass --dtype bfloat16"
            )
        n, k = sum(output_partition_sizes), input_size_per_partition
        layer.x86_shape = (n, k)
        layer.x86_k_split = k != input_size  # a row-parallel layer: K split over ranks
        if k != input_size or n != output_size:
            self.check_split(n, k, output_size, input_size)
        problem = self.shape_problem(n, k)
        layer.x86_quantized = problem is None
        if problem is not None:
            _warn_once(
                f"shape{n}x{k}", "vllm-x86: a %dx%d linear layer stays in bf16: %s", n, k, problem
            )
        if self.config.prepacked and layer.x86_quantized:
            self.create_prepacked(layer, n, k, extra_weight_attrs["weight_loader"])
        else:
            self._create_bf16(layer, k, n, params_dtype, dict(extra_weight_attrs))

    def check_split(self, n: int, k: int, n_full: int, k_full: int) -> None:
        """Tensor parallel: each rank quantizes its share [n, k] of the [n_full, k_full]
        weight. Refuse (a ValueError naming what to change) where the share cannot be
        quantized as the whole layer is at tensor parallel size 1, so that TP=N runs
        the same quantized model as TP=1 and never leaves a layer in bf16 that TP=1
        quantizes."""
        whole, part = self.shape_problem(n_full, k_full), self.shape_problem(n, k)
        if whole is None and part is not None:
            raise ValueError(
                f"{self.config.get_name()} with tensor parallel size {_tp_size()}: a "
                f"{n_full}x{k_full} linear layer splits into {n}x{k} per rank, which "
                f"cannot be quantized ({part}); it is at tensor parallel size 1. Use a "
                "smaller --tensor-parallel-size (or --pipeline-parallel-size)."
            )

    def process_weights_after_loading(self, layer: Module) -> None:
        if getattr(layer, "x86_done", False):
            return
        layer.x86_done = True
        if not layer.x86_quantized:
            from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

            dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
            return
        if self.config.prepacked:
            check_prepacked_runs(
                layer.x86_kernel, "this checkpoint is packed", self.config.get_name()
            )
            return
        if not plugin_kernels_available():
            _warn_once(
                "noamx",
                "vllm-x86: %s without AMX or AVX-512 VNNI runs PyTorch's weight-only "
                "kernels: fast for one request, slow for batches",
                self.config.get_name(),
            )
        self.quantize_and_pack(layer, layer.weight.data)

    def apply(self, layer: Module, x: torch.Tensor, bias: torch.Tensor | None = None):
        if not layer.x86_quantized:
            from vllm.model_executor.layers.utils import cpu_unquantized_gemm

            return cpu_unquantized_gemm(layer, x, layer.weight, bias)
        x2 = x.reshape(-1, x.shape[-1])
        out = self.matmul(layer, x2, None if bias is None else bias.float())
        return out.reshape(*x.shape[:-1], out.shape[-1])


class X86Int8Linear(_X86QuantLinearMethod):
    bits = 8

    def shape_problem(self, n, k):
        # a prepacked checkpoint is always in the plugin's layout
        kernel = "w8a16" if self.config.prepacked else int8_kernel()
        return scope.plan("linear", n, k, 8, kernel=kernel).reason

    def create_prepacked(self, layer, n, k, loader):
        layer.x86_kernel = "w8a16"
        for name, (shape, dtype, rows) in packed_shapes(8, "w8a16", n, k).items():
            _packed_param(layer, name, shape, dtype, loader, rows)

    def quantize_and_pack(self, layer, w):
        layer.x86_kernel = int8_kernel()
        if getattr(layer, "x86_k_split", False):
            # Row parallel: each rank holds part of every output channel's K, and the
            # per-channel scale must be the whole row's, as at tensor parallel size 1
            # (each rank's own maximum would quantize the model differently).
            q, scale = quantize_int8(w, amax=_tp_max(w.float().abs().amax(dim=1)))
            _set(layer, "weight", pack_int8_for(layer.x86_kernel, q))
            _set(layer, "weight_scale", scale)
            return
        for name, t in quantize_pack(8, layer.x86_kernel, w).items():
            _set(layer, name, t)

    def matmul(self, layer, x, bias):
        return int8_matmul(layer.x86_kernel, x, layer.weight, layer.weight_scale, bias)


class X86Int4Linear(_X86QuantLinearMethod):
    bits = 4

    def _kernel(self) -> str:
        if self.config.prepacked:
            return int4_layout_kernel(self.config.layout)
        return weight_kernel(4, self.config.group_size)

    def shape_problem(self, n, k):
        return scope.plan("linear", n, k, 4, self.config.group_size, kernel=self._kernel()).reason

    def check_split(self, n, k, n_full, k_full):
        super().check_split(n, k, n_full, k_full)
        g = effective_group_size(k_full, self.config.group_size)
        if g is not None and k != k_full and k % g:
            fits = effective_group_size(k, self.config.group_size)
            raise ValueError(
                f"x86_int4 with tensor parallel size {_tp_size()}: a layer's {k_full} "
                f"input channels split into {k} per rank, which its groups of {g} do not "
                "divide (a group would straddle two ranks). "
                + (
                    f"Set VLLM_X86_QUANT_GROUP_SIZE={fits} (groups every rank's share "
                    "holds, at every tensor parallel size) or use"
                    if fits is not None
                    else "Use"
                )
                + " a smaller --tensor-parallel-size (or --pipeline-parallel-size)."
            )

    def _group(self, layer) -> int:
        n, k = layer.x86_shape
        if self.config.prepacked and self.config.int4_grid == "all":
            return 32  # the checkpoint kept the weights' own grid (convert.grid_scan)
        g = effective_group_size(k, self.config.group_size)
        if g != self.config.group_size:
            _warn_once(
                f"group{k}",
                "vllm-x86: x86_int4 uses groups of %d for layers with "
                "%d input channels (not a multiple of %d)",
                g,
                k,
                self.config.group_size,
            )
        return g

    def create_prepacked(self, layer, n, k, loader):
        g = self._group(layer)
        layer.x86_group = g
        layer.x86_kernel = self._kernel()
        for name, (shape, dtype, rows) in packed_shapes(4, layer.x86_kernel, n, k, g).items():
            _packed_param(layer, name, shape, dtype, loader, rows)

    def quantize_and_pack(self, layer, w):
        layer.x86_kernel = self._kernel()
        g = self._group(layer)
        kept = grid_group(w, g, self.config.zero_point, layer.x86_kernel)
        if kept != g:
            _info_once(
                "grid",
                "vllm-x86: x86_int4 keeps the 4-bit grid these weights already sit on "
                "(groups of 32, as in a model dequantized from a 4-bit GGUF) instead of "
                "rounding them again into groups of %d (VLLM_X86_QUANT_INT4_GRID=0: round "
                "them again)",
                g,
            )
        layer.x86_group = kept
        packed = quantize_pack(
            4,
            layer.x86_kernel,
            w,
            kept,
            self.config.zero_point,
            rounding=int4_rounding_for(kept, g),
        )
        for name, t in packed.items():
            _set(layer, name, t)

    def matmul(self, layer, x, bias):
        return int4_matmul(
            layer.x86_kernel,
            x,
            layer.weight,
            getattr(layer, "weight_scale", None),
            getattr(layer, "weight_zp", None),
            layer.x86_group,
            bias,
            getattr(layer, "weight_scale_zero", None),
        )
