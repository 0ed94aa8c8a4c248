"""`x86_int8` and `x86_int4`: vLLM quantization configs of the plugin.

Two ways in:
- a bf16 checkpoint served with `--quantization x86_int8|x86_int4`: the linear layers
  of attention and MLP and the routed MoE experts (moe.py) are quantized while the
  model loads (which weights: scope.py). Options come from the
  environment (VLLM_X86_QUANT_GROUP_SIZE, VLLM_X86_QUANT_ZERO_POINT), see envs.py;
- a checkpoint written by `vllm-x86 quantize`: its config.json carries
  `quantization_config` with `quant_method` x86_int8/x86_int4 and `prepacked: true`;
  the packed tensors load as they are (format.py checks the format first), the MoE
  experts too where the checkpoint lists their layer in `packed_experts` (format
  version 2); experts stored in bf16 (an earlier converter's checkpoints, shapes the
  converter does not pack) are quantized while loading.

The embeddings stay in bf16, and so does the LM head unless VLLM_X86_QUANT_LM_HEAD=1
(or `vllm-x86 quantize --lm-head`) asks for it in INT8, or =int4 in INT4 (lm_head.py).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from vllm_x86.runtime.quant import format as qformat
from vllm_x86.runtime.quant import methods, scope
from vllm_x86.runtime.quant.linear import X86Int4Linear, X86Int8Linear

GROUP_SIZES = (32, 64, 128)


class Int8LinearMethod(X86Int8Linear, LinearMethodBase):
    pass


class Int4LinearMethod(X86Int4Linear, LinearMethodBase):
    pass


class _X86QuantConfig(QuantizationConfig):
    NAME = ""
    BITS = 0

    def __init__(
        self,
        group_size: int | None = None,
        zero_point: bool | None = None,
        prepacked: bool = False,
        layout: str | None = None,
        format_version: int | None = None,
        quantized_layers: list[str] | None = None,
        lm_head: bool | int | str | None = None,
        packed_experts: list[str] | None = None,
        lm_head_codes: str | None = None,
        int4_grid: str | None = None,
    ) -> None:
        super().__init__()
        group_size, zero_point, lm_head = scope.options(self.BITS, group_size, zero_point, lm_head)
        if self.BITS == 4 and group_size not in GROUP_SIZES:
            raise ValueError(f"x86_int4 group size must be one of {GROUP_SIZES}, not {group_size}")
        self.group_size = group_size
        self.zero_point = zero_point
        self.prepacked = prepacked
        self.layout = layout
        self.format_version = format_version
        # prepacked: the checkpoint's (unfused) names of the layers it holds packed
        self.quantized_layers = list(quantized_layers or [])
        self.lm_head = lm_head
        # prepacked: the checkpoint's names of the MoE layers whose experts it holds
        # packed (format version 2; the others are quantized while loading)
        self.packed_experts = list(packed_experts or [])
        # prepacked: the file (relative to the checkpoint) with the LM head's INT4 codes
        # (format version 3); its directory comes with maybe_update_config
        self.lm_head_codes = lm_head_codes
        # prepacked INT4: "all" where every Linear layer kept its 4-bit grid in groups of
        # 32 (convert.grid_scan), whatever group_size (the LM head's and experts') says
        self.int4_grid = int4_grid
        self.model_dir: str | None = None

    def __repr__(self) -> str:
        extra = (
            f", group_size={self.group_size}, zero_point={self.zero_point}"
            if self.BITS == 4
            else ""
        )
        return f"{type(self).__name__}(prepacked={self.prepacked}, lm_head={self.lm_head}{extra})"

    def get_name(self):
        return self.NAME

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16]

    @classmethod
    def get_min_capability(cls) -> int:
        return -1

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # bf16 checkpoints need no file; prepacked ones carry config.json

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> _X86QuantConfig:
        qformat.check_config(config, cls.NAME)
        return cls(
            group_size=config.get("group_size", 128),
            zero_point=config.get("zero_point", False),
            prepacked=bool(config.get("prepacked", False)),
            layout=config.get("layout"),
            format_version=config.get("format_version"),
            quantized_layers=config.get("quantized_layers"),
            lm_head=config.get("lm_head") if config.get("prepacked") else None,
            packed_experts=config.get("packed_experts"),
            lm_head_codes=config.get("lm_head_codes") if config.get("prepacked") else None,
            int4_grid=config.get("int4_grid") if config.get("prepacked") else None,
        )

    def maybe_update_config(self, model_name: str, *args, **kwargs) -> None:
        if self.prepacked:
            qformat.check_files(model_name)
            self.model_dir = model_name

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        kind = layer_kind(layer)
        if kind == scope.LM_HEAD and self.lm_head:
            from vllm_x86.runtime.quant.lm_head import X86LMHeadMethod

            # INT8 or INT4 on request, whatever the layers' bits
            codes = None
            if self.lm_head_codes:
                if self.model_dir is None:
                    raise qformat.FormatError(
                        "the checkpoint's LM head codes were asked for before its directory "
                        "was known"
                    )
                codes = os.path.join(self.model_dir, self.lm_head_codes)
            return X86LMHeadMethod(self.lm_head, self.group_size, self.zero_point, codes)
        if kind == scope.MOE_EXPERTS:
            return self._moe_method(layer, prefix)
        if kind == scope.ROUTER:
            from vllm.model_executor.layers.linear import UnquantizedLinearMethod

            if self.prepacked and prefix in self.quantized_layers:
                raise qformat.FormatError(
                    f"this checkpoint holds the MoE router {prefix} packed (an earlier "
                    "vllm-x86 wrote it); routers now stay in bf16: quantize the bf16 "
                    "model again"
                )
            return UnquantizedLinearMethod()  # the MoE router: bf16 (scope.py)
        if kind != scope.LINEAR:
            return None  # embeddings (and the LM head unless asked) stay in bf16
        if scope.weight_bits(scope.LINEAR, self.BITS, self.lm_head) is None:
            return None  # scope.py quantizes no Linear layers
        if self.prepacked:
            from vllm.model_executor.layers.linear import UnquantizedLinearMethod
            from vllm.model_executor.layers.quantization.utils.quant_utils import (
                is_layer_skipped,
            )

            # a fused layer (qkv_proj) is packed when its parts (q_proj, ...) are;
            # vLLM raises if only some of them are
            packed = is_layer_skipped(prefix, self.quantized_layers, self.packed_modules_mapping)
            if not packed:
                return UnquantizedLinearMethod()
        return (Int4LinearMethod if self.BITS == 4 else Int8LinearMethod)(self)

    def _moe_method(self, layer, prefix: str):
        """The routed experts of an MoE layer: packed in the checkpoint (a prepacked one
        that lists the layer in packed_experts), else quantized while loading (also for
        a prepacked checkpoint that stores them in bf16: written by an earlier
        converter, or a shape the converter does not pack), or, where moe.py cannot take
        the layer, vLLM's bf16 experts with a warning saying why."""
        from vllm.model_executor.layers.fused_moe import UnquantizedFusedMoEMethod

        from vllm_x86.runtime.quant import moe

        if self.prepacked and any(
            prefix == p or prefix.startswith(p + ".") for p in self.packed_experts
        ):
            kernel = moe.prepacked_kernel(self.BITS, self.layout)
            problem = moe.moe_problem(layer.moe_config, self.BITS, self.group_size, kernel)
            if problem is not None:
                raise qformat.FormatError(
                    f"this checkpoint holds the MoE experts of {prefix} packed and they "
                    f"cannot run here: {problem}; serve the bf16 model with --quantization "
                    f"{self.NAME}"
                )
            return moe.X86QuantMoEMethod(self, layer.moe_config, prepacked=True)
        kernel = moe.expert_kernel(self.BITS, self.group_size)
        refusal = moe.split_refusal(layer.moe_config, self.BITS, self.group_size, kernel)
        if refusal is not None:  # tensor parallel: never a different quantization than TP=1
            raise ValueError(refusal)
        problem = moe.moe_problem(layer.moe_config, self.BITS, self.group_size, kernel)
        if problem is not None:
            methods._warn_once(
                f"moe:{problem}",
                "vllm-x86: %s: the MoE experts of %s (and of layers like it) stay in bf16: %s",
                self.NAME,
                prefix,
                problem,
            )
            return UnquantizedFusedMoEMethod(layer.moe_config)
        return moe.X86QuantMoEMethod(self, layer.moe_config)


def layer_kind(layer: torch.nn.Module) -> str | None:
    """The kind (scope.py) of a vLLM layer's weights, or None for a layer that has no
    weights to quantize: the dispatch of ``get_quant_method``. (vLLM asks only about
    layers built with the quantization config: never about a Mamba-1 mixer's.)"""
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        VocabParallelEmbedding,
    )

    if isinstance(layer, ParallelLMHead):  # a VocabParallelEmbedding too: first
        return scope.LM_HEAD
    if isinstance(layer, VocabParallelEmbedding):
        return scope.EMBEDDING
    from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear

    if isinstance(layer, GateLinear):  # a LinearBase too: first
        return scope.ROUTER
    if isinstance(layer, LinearBase):
        return scope.LINEAR
    if isinstance(layer, RoutedExperts):
        return scope.MOE_EXPERTS
    return None


@register_quantization_config("x86_int8")
class X86Int8Config(_X86QuantConfig):
    NAME = "x86_int8"
    BITS = 8


@register_quantization_config("x86_int4")
class X86Int4Config(_X86QuantConfig):
    NAME = "x86_int4"
    BITS = 4
