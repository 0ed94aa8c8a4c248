"""THE table of everything the plugin changes in vLLM's compute.

Every row names what it replaces (or adds) in vLLM, with what, and why. Reading this file tells
a newcomer all the plugin does to vLLM's math; nothing else in the code base registers
or replaces ops. Seven kinds of rows, one per mechanism vLLM offers a platform:

- ``customop``: a CustomOp class replaced with ``CustomOp.register_oot`` by a subclass
  built from vLLM's class and the plugin's mixin (which provides ``forward_cpu``). The
  subclass keeps vLLM's op name, so ``--compilation-config '{"custom_ops":
  ["-rotary_embedding"]}'`` switches the plugin's version off as it would the stock one.
  vLLM runs CustomOps in eager mode; compiled mode leaves them to Inductor unless
  ``custom_ops`` says otherwise.
- ``ir``: an implementation of a vLLM IR op, registered under the provider name
  ``x86``; ``X86Platform.get_default_ir_op_priority`` puts it before ``native``.
- ``layer``: a vLLM ``PluggableLayer`` class (a layer vLLM lets a platform replace
  whole) replaced with ``PluggableLayer.register_oot`` by a subclass built from vLLM's
  class and the plugin's mixin; vLLM then instantiates the subclass wherever a model
  builds the layer. These rows are installed by the worker just before it builds the
  model (``register_layers``), so processes that never build one do not import the
  layers.
- ``module``: after a model is loaded, every module of the named class has its class
  switched to a subclass with the plugin's mixin, when ``check`` accepts the module.
- ``router``: the same for the MoE router objects of a loaded model (vLLM's MoE runner
  modules hold theirs as ``.router``; routers are not modules): each router of the
  named class whose ``check`` accepts it has its class switched, to ``impl`` itself
  when that is already a subclass of vLLM's class.
- ``backend``: an attention backend of vLLM's registry (``AttentionBackendEnum``
  member name) replaced with ``register_backend`` by the plugin's class, for backends
  whose kernels have no CPU implementation in vLLM.
- ``quant``: the layers of the plugin's quantization methods (``--quantization
  x86_int8`` / ``x86_int4``, and the INT8/INT4 LM head), which vLLM asks for through
  the quantization config (quant/config.py, ``get_quant_method``) rather than a
  registry: the plugin's method class for vLLM's layer class, at ``bits`` per weight,
  with the ``kernels`` it can run (each: the torch ops it calls, the ISAs it needs, its
  reference) and ``choose``, the rule that picks one for this CPU and the settings
  (below: ``weight_kernel``, ``lm_head_kernel``; a prepacked checkpoint runs the
  kernel its layout is for, ``int4_layout_kernel``). quant/methods.py asks these rules.

Each kernel has a pure-torch reference (ops/reference.py) and tests against it
(tests/unit/test_ops.py, test_quant.py). Where a kernel cannot run, the reference runs
and the plugin says so once (ops/fallback.py). The ops' schemas and fakes are
ops/schemas.py's; what the CPU can run is hardware.py's (``usable_isas``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace

from vllm_x86.runtime.log import get_logger

logger = get_logger("ops")


@dataclass(frozen=True)
class Kernel:
    """A kernel a ``quant`` row can run."""

    name: str  # what a layer records (layer.x86_kernel) and quant/methods.py runs
    ops: tuple[str, ...]  # the torch ops it calls
    isas: tuple[str, ...]  # it runs on any one of these (hardware.ISA_NEEDS); (): any
    reference: str  # "module:function" its results are tested against
    why: str
    layout: str | None = None  # the packed layout a prepacked checkpoint records


@dataclass(frozen=True)
class Override:
    kind: str  # "customop" | "ir" | "layer" | "module" | "router" | "backend" | "quant"
    # vLLM's "module:Class" (customop, layer, module, router, quant), IR op name (ir), or
    # attention backend name (backend)
    target: str
    impl: str  # the plugin's "module:Object"
    why: str
    # module and router rows: "module:function" -> None or reason not to
    check: str | None = None
    cpp: bool = True  # False: the plugin's implementation is PyTorch (no C++ kernel)
    # quant rows: bits per weight, the kernels (best first) and "module:function"
    # (bits, group_size) -> the name of the kernel that runs here, or None (bf16)
    bits: int | None = None
    kernels: tuple[Kernel, ...] = ()
    choose: str | None = None


_ROPE = "vllm.model_executor.layers.rotary_embedding"
_ROPE_MIXIN = "vllm_x86.runtime.ops.rotary_embedding:X86RotaryMixin"
_ROPE_WHY = (
    "C++ kernel, bit-identical to vLLM's reference in every dtype; stock "
    "_C.rotary_embedding rounds differently and flips SmolLM2's eager bf16 answer "
    "(docs/correctness.md)"
)
_QK = "vllm_x86.runtime.ops.qwen3_attention"
_QK_WHY = (
    "split + q/k RMSNorm + neox RoPE in one kernel (split_norm_rope_neox) where vLLM "
    "runs a split, two norms and a rotary op"
)

# The quantized GEMM kernels (quant rows). Results: docs/quantization.md; tolerances:
# tests/unit/test_quant.py. The plugin's own run on AMX or, with bit-identical results,
# AVX-512 VNNI; vLLM CPU's need AMX; PyTorch's run anywhere.
_REF = "vllm_x86.runtime.ops.reference"
_DEQUANT = "vllm_x86.runtime.quant.methods"  # dequantize, then a float32 matmul
_PLUGIN_ISAS = ("amx", "avx512_vnni")
W8A16 = Kernel(
    "w8a16",
    ("torch.ops.vllm_x86.int8_w8a16_gemm",),
    _PLUGIN_ISAS,
    f"{_REF}:int8_w8a16_gemm",
    "the plugin's: activations kept at 16 bits per token (8 bits from "
    "VLLM_X86_QUANT_A8_ROWS rows on VNNI), as accurate as bf16 ones",
    layout="vllm-x86-int8-w8a16-amx-1",
)
VLLM_W8A8 = Kernel(
    "vllm",
    ("torch.ops._C.int8_scaled_mm_with_quant",),
    ("amx",),
    f"{_DEQUANT}:dequantize_int8",
    "vLLM CPU's AMX kernel: activations rounded to 8 bits per token (faster for batches, "
    "less accurate); VLLM_X86_QUANT_KERNEL=vllm",
)
TORCH_W8 = Kernel(
    "torch",
    ("torch.ops.aten._weight_int8pack_mm",),
    (),
    f"{_DEQUANT}:dequantize_int8",
    "PyTorch's weight-only kernel: neither AMX nor AVX-512 VNNI, or "
    "VLLM_X86_QUANT_KERNEL=torch; fast for one request, slow for batches",
)
W4A16 = Kernel(
    "w4a16",
    ("torch.ops.vllm_x86.int4_w4a16_gemm",),
    _PLUGIN_ISAS,
    f"{_REF}:int4_w4a16_gemm",
    "the plugin's, groups of 32 (zero points in eighths of a step), 64 and 128: "
    "activations as for w8a16",
    layout="vllm-x86-int4-w4a16-amx-1",
)
VLLM_W4A8 = Kernel(
    "vllm",
    ("torch.ops._C.int4_scaled_mm_cpu",),
    ("amx",),
    f"{_DEQUANT}:dequantize_int4",
    "vLLM CPU's AMX W4A8 kernel: VLLM_X86_QUANT_KERNEL=vllm (integer zero points); "
    "activations rounded to 8 bits",
    # the layout vLLM 0.32.0's packer produces (another vLLM may pack differently)
    layout="vllm-cpu-0.32-sgl-int4-awq-amx",
)
TORCH_W4 = Kernel(
    "torch",
    ("torch.ops.aten._weight_int4pack_mm_for_cpu",),
    (),
    f"{_DEQUANT}:dequantize_int4",
    "PyTorch's weight-only kernel: neither AMX nor AVX-512 VNNI (groups of 32: no AMX), "
    "or VLLM_X86_QUANT_KERNEL=torch; fast for one request, slow for batches",
)


def _experts(k: Kernel) -> Kernel:
    """`k` run per expert inside the MoE layer's one opaque op (quant/moe.py)."""
    return replace(
        k, ops=("torch.ops.vllm_x86.quant_moe_experts", *k.ops), reference=f"{_REF}:moe_experts"
    )


_Q = "vllm_x86.runtime.quant"
_CHOOSE = "vllm_x86.runtime.ops.registry"
_LINEAR = "vllm.model_executor.layers.linear:LinearBase"
_EXPERTS = "vllm.model_executor.layers.fused_moe.routed_experts:RoutedExperts"
_LM_HEAD = "vllm.model_executor.layers.vocab_parallel_embedding:ParallelLMHead"
_QUANT_WHY = (
    "vLLM CPU has no weight-only INT8/INT4 method with 16-bit activations; its AMX "
    "kernels round activations to 8 bits (+2.6 % perplexity for INT8 on the default "
    "model, docs/quantization.md)"
)

OVERRIDES: tuple[Override, ...] = (
    # rotary embedding, and the subclasses that only change the cos/sin cache
    Override("customop", f"{_ROPE}.base:RotaryEmbedding", _ROPE_MIXIN, _ROPE_WHY),
    Override("customop", f"{_ROPE}.llama3_rope:Llama3RotaryEmbedding", _ROPE_MIXIN, _ROPE_WHY),
    Override(
        "customop",
        f"{_ROPE}.linear_scaling_rope:LinearScalingRotaryEmbedding",
        _ROPE_MIXIN,
        _ROPE_WHY,
    ),
    Override(
        "customop", f"{_ROPE}.ntk_scaling_rope:NTKScalingRotaryEmbedding", _ROPE_MIXIN, _ROPE_WHY
    ),
    Override(
        "customop",
        f"{_ROPE}.dynamic_ntk_scaling_rope:DynamicNTKScalingRotaryEmbedding",
        _ROPE_MIXIN,
        _ROPE_WHY,
    ),
    Override(
        "customop",
        f"{_ROPE}.dynamic_ntk_alpha_rope:DynamicNTKAlphaRotaryEmbedding",
        _ROPE_MIXIN,
        _ROPE_WHY,
    ),
    Override(
        "customop", f"{_ROPE}.yarn_scaling_rope:YaRNScalingRotaryEmbedding", _ROPE_MIXIN, _ROPE_WHY
    ),
    Override("customop", f"{_ROPE}.gemma4_rope:Gemma4RotaryEmbedding", _ROPE_MIXIN, _ROPE_WHY),
    # activations: stock vLLM CPU runs PyTorch's separate activation and multiply on x86
    Override(
        "customop",
        "vllm.model_executor.layers.activation:SiluAndMul",
        "vllm_x86.runtime.ops.activation:X86SiluAndMulMixin",
        "one-pass C++ kernel instead of PyTorch's silu + mul (two passes)",
    ),
    Override(
        "customop",
        "vllm.model_executor.layers.activation:GeluAndMul",
        "vllm_x86.runtime.ops.activation:X86GeluAndMulMixin",
        "one-pass C++ kernel (erf and tanh GELU) instead of PyTorch's gelu + mul",
    ),
    Override(
        "customop",
        "vllm.model_executor.layers.activation:XIELU",
        "vllm_x86.runtime.ops.xielu:X86XIELUMixin",
        "vLLM's xIELU (Apertus) holds its parameters in bf16 whatever the model dtype, "
        "so float32 models ran it with bf16-rounded coefficients; in float32 the "
        "plugin's class holds them in float32 (vLLM's math)",
        cpp=False,
    ),
    # RMSNorm: vLLM IR ops; on CPU stock vLLM has only the native (PyTorch) version
    Override(
        "ir",
        "rms_norm",
        "vllm_x86.runtime.ops.layernorm:rms_norm_x86",
        "C++ kernel: one read to sum squares, one to scale, instead of ~6 PyTorch ops",
    ),
    Override(
        "ir",
        "fused_add_rms_norm",
        "vllm_x86.runtime.ops.layernorm:fused_add_rms_norm_x86",
        "C++ kernel: residual add and RMSNorm in place, two passes",
    ),
    Override(
        "ir",
        "fused_add_rms_norm",
        "vllm_x86.runtime.ops.layernorm:fused_add_rms_norm_f32res_x86",
        "VLLM_X86_FP32_RESIDUAL (eager): the residual sum kept in float32 (vLLM rounds it "
        "to bf16 at every layer, which moved the default model's logits by up to 0.68 and "
        "its greedy tokens off the float32 model's; docs/correctness.md); C++ kernel",
    ),
    Override(
        "ir",
        "fused_add_rms_norm",
        "vllm_x86.runtime.ops.layernorm:fused_add_rms_norm_f32res_torch",
        "VLLM_X86_FP32_RESIDUAL in compiled mode (PyTorch, which Inductor fuses) and where "
        "the C++ kernel cannot take the arguments",
        cpp=False,
    ),
    # Mamba-1 mixers (Mamba, FalconMamba, Jamba)
    Override(
        "layer",
        "vllm.model_executor.layers.mamba.mamba_mixer:MambaMixer",
        "vllm_x86.runtime.ops.mamba:X86MambaMixerMixin",
        "vLLM's CPU build cannot run it: the prefill scan is a CUDA-only _C op (the "
        "plugin's selective_scan_fwd runs instead), bf16 packs the conv weight its conv "
        "ops read unpacked, and decode passes a 3-D state to a 4-D state kernel "
        "(ops/mamba.py)",
        cpp=False,
    ),
    # vLLM's Attention layer: its two Python custom ops per layer as one call
    Override(
        "module",
        "vllm.model_executor.layers.attention.attention:Attention",
        "vllm_x86.runtime.ops.attention:X86AttentionMixin",
        "vLLM's layer makes two Python custom ops per layer and step around vLLM CPU's "
        "two attention kernels; one call (one opaque op in a compiled graph) runs the "
        "same kernels with the same arguments (docs/overhead.md)",
        check="vllm_x86.runtime.ops.attention:direct_attention_problem",
        cpp=False,
    ),
    # a decode step of a whole decoder layer in one C++ call (ops/decoder_layer.py)
    *(
        Override(
            "module",
            f"vllm.model_executor.models.{family}:{family.capitalize()}DecoderLayer",
            "vllm_x86.runtime.ops.decoder_layer:X86DecoderLayerMixin",
            "a decode step of a small model is mostly fixed cost: about ten op calls per "
            "layer with Python between them; with INT8/INT4 weights one C++ call "
            "(decode_layer) makes the same kernel calls (docs/overhead.md)",
            check="vllm_x86.runtime.ops.decoder_layer:fusable",
        )
        for family in ("llama", "qwen2", "qwen3", "mistral")
    ),
    # ... and in compiled mode, those decode steps run outside the compiled graph
    *(
        Override(
            "module",
            f"vllm.model_executor.models.{family}:{family.capitalize()}Model",
            "vllm_x86.runtime.ops.decoder_layer:X86FusedDecodeModelMixin",
            "with every layer one C++ call per decode step, the compiled graph's Python "
            "wrapper and its ten kernel calls per layer are slower; prefill keeps the "
            "compiled graph (docs/overhead.md)",
            check="vllm_x86.runtime.ops.decoder_layer:all_layers_fusable",
            cpp=False,
        )
        for family in ("llama", "qwen2", "qwen3", "mistral")
    ),
    # Qwen3 / Qwen3-MoE attention prologue
    Override(
        "module",
        "vllm.model_executor.models.qwen3:Qwen3Attention",
        f"{_QK}:X86QkNormRopeAttentionMixin",
        _QK_WHY,
        check=f"{_QK}:fusable",
    ),
    Override(
        "module",
        "vllm.model_executor.models.qwen3_moe:Qwen3MoeAttention",
        f"{_QK}:X86QkNormRopeAttentionMixin",
        _QK_WHY,
        check=f"{_QK}:fusable",
    ),
    # the best logits of a bf16 LM head in float32 (VLLM_X86_FP32_RESIDUAL)
    Override(
        "module",
        "vllm.model_executor.layers.logits_processor:LogitsProcessor",
        "vllm_x86.runtime.ops.logits:X86ExactTopLogitsMixin",
        "vLLM's bf16 LM head rounds the logits to bf16 (steps of 0.125 at the default "
        "model's 16-32) before the sampler takes them in float32; the tokens that can be "
        "the best are recomputed with float32 accumulation (docs/correctness.md)",
        check="vllm_x86.runtime.ops.logits:refinable",
        cpp=False,
    ),
    # the input embedding, when nothing computes with its table, read by row from the
    # checkpoint file instead of held in memory (attached after loading: ops/file_embedding.py)
    Override(
        "module",
        "vllm.model_executor.layers.vocab_parallel_embedding:VocabParallelEmbedding",
        "vllm_x86.runtime.ops.file_embedding:X86FileEmbeddingMixin",
        "a decode step reads one row of the input embedding per token, and with an untied "
        "or quantized LM head nothing else reads the table (Qwen2.5-Coder-0.5B: 272 MB); "
        "vLLM holds it in the engine's memory all the same, and vLLM CPU a oneDNN copy of "
        "it for a GEMM that only an LM head runs (dropped where the model has its own head)",
        check="vllm_x86.runtime.ops.file_embedding:eligible",
        cpp=False,
    ),
    # MoE routing: vLLM's CPU router asserts softmax where no expert groups are used
    Override(
        "router",
        "vllm.model_executor.layers.fused_moe.router.cpu_router:CPURouter",
        "vllm_x86.runtime.ops.moe_routing:X86CPURouter",
        "sigmoid top-k routing (optional correction bias for the choice only) without "
        "expert groups, which vLLM's CPU router rejects (Laguna, MiniMax-M2)",
        check="vllm_x86.runtime.ops.moe_routing:needs_routing",
        cpp=False,
    ),
    # attention whose V head size differs from the Q/K one (MiMo-V2-Flash)
    Override(
        "backend",
        "TRITON_ATTN_DIFFKV",
        "vllm_x86.runtime.ops.diffkv_attention:X86DiffKVAttentionBackend",
        "vLLM's DiffKV backends are GPU kernels (FlashAttention, Triton); the plugin's "
        "runs the torch reference on the same packed cache",
        cpp=False,
    ),
    # Gated DeltaNet linear attention: Qwen3-Next, Qwen3.5 in float32; OLMo-Hybrid
    Override(
        "layer",
        "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn:QwenGatedDeltaNetAttention",
        "vllm_x86.runtime.ops.gdn:X86GatedDeltaNetMixin",
        "vLLM's CPU GDN kernels are bf16 only (gdn_attention.py asserts 'CPU GDN "
        "attention requires BF16'); float32 runs the plugin's float32 gated delta rule, "
        "bf16 keeps vLLM's kernels",
        cpp=False,
    ),
    Override(
        "layer",
        "vllm.model_executor.layers.mamba.gdn.olmo_gdn_linear_attn:OlmoHybridGatedDeltaNetAttention",
        "vllm_x86.runtime.ops.gdn:X86OlmoHybridGatedDeltaNetMixin",
        "vLLM's OLMo-Hybrid layer runs FLA Triton kernels only and sets a Triton allocator "
        "when built; the Triton here has no CPU backend. The plugin's layer is built "
        "without the allocator and runs the plugin's float32 gated delta rule",
        cpp=False,
    ),
    # quantized layers (quant/): the Linear layers, the MoE experts and, on request
    # (VLLM_X86_QUANT_LM_HEAD), the LM head of x86_int8 / x86_int4
    Override(
        "quant",
        _LINEAR,
        f"{_Q}.linear:X86Int8Linear",
        f"x86_int8 Linear layers: {_QUANT_WHY}",
        bits=8,
        kernels=(W8A16, VLLM_W8A8, TORCH_W8),
        choose=f"{_CHOOSE}:weight_kernel",
    ),
    Override(
        "quant",
        _LINEAR,
        f"{_Q}.linear:X86Int4Linear",
        f"x86_int4 Linear layers: {_QUANT_WHY}",
        bits=4,
        kernels=(W4A16, VLLM_W4A8, TORCH_W4),
        choose=f"{_CHOOSE}:weight_kernel",
    ),
    Override(
        "quant",
        _EXPERTS,
        f"{_Q}.moe:X86QuantMoEMethod",
        "x86_int8 MoE experts on the Linear layers' kernels; vLLM CPU's fused INT8 MoE "
        "rounds activations to 8 bits",
        bits=8,
        kernels=tuple(_experts(k) for k in (W8A16, VLLM_W8A8, TORCH_W8)),
        choose=f"{_CHOOSE}:weight_kernel",
    ),
    Override(
        "quant",
        _EXPERTS,
        f"{_Q}.moe:X86QuantMoEMethod",
        "x86_int4 MoE experts on the Linear layers' kernels; vLLM CPU's W4A8 MoE runs on Arm only",
        bits=4,
        kernels=tuple(_experts(k) for k in (W4A16, VLLM_W4A8, TORCH_W4)),
        choose=f"{_CHOOSE}:weight_kernel",
    ),
    Override(
        "quant",
        _LM_HEAD,
        f"{_Q}.lm_head:X86LMHeadMethod",
        "INT8 LM head (VLLM_X86_QUANT_LM_HEAD=int8): a large share of the bytes read per "
        "token for large vocabularies; stays bf16 without AMX or AVX-512 VNNI",
        bits=8,
        kernels=(W8A16, VLLM_W8A8),
        choose=f"{_CHOOSE}:lm_head_kernel",
    ),
    Override(
        "quant",
        _LM_HEAD,
        f"{_Q}.lm_head:X86LMHeadMethod",
        "INT4 LM head (VLLM_X86_QUANT_LM_HEAD=int4): the plugin's kernel only (groups of "
        "64 or 128), else bf16",
        bits=4,
        kernels=(W4A16,),
        choose=f"{_CHOOSE}:lm_head_kernel",
    ),
)

# ------------------------------------------------------------ the quant rows' rules
# What runs a quantized weight, from hardware.usable_isas() (the one answer to what
# this CPU can run) and VLLM_X86_QUANT_KERNEL. quant/methods.py re-exports these.

_quant_logger = get_logger("quant")


def quant_isa() -> str | None:
    """The ISA the plugin's INT8/INT4 kernels run on here: "amx", "avx512_vnni" (the
    same packed weights and bit-identical results, csrc/vnni_gemm.cpp), or None (no
    AMX and no AVX-512 VNNI, or VLLM_X86_QUANT_KERNEL=torch asks for PyTorch's
    weight-only kernels, for comparisons). hardware.py's answer, so it is known
    without the kernels loaded; check_plugin_kernels() then says why they cannot run."""
    from vllm_x86.runtime import envs, hardware

    if envs.get("VLLM_X86_QUANT_KERNEL") == "torch":
        return None
    return hardware.best_isa(hardware.QUANT_ISAS)


def plugin_kernels_available() -> bool:
    """Whether the plugin's INT8/INT4 kernels (AMX or AVX-512 VNNI) are the ones to use."""
    return quant_isa() is not None


def amx_available() -> bool:
    """vLLM CPU's own INT8/INT4 kernels (VLLM_X86_QUANT_KERNEL=vllm, INT4 groups of 32)
    need AMX."""
    return quant_isa() == "amx"


def int8_kernel() -> str:
    """The INT8 kernel: "w8a16" (the plugin's, default), "vllm" (vLLM CPU's AMX kernel,
    on request) or "torch" (neither AMX nor AVX-512 VNNI, or on request)."""
    from vllm_x86.runtime import envs

    if not plugin_kernels_available():
        return TORCH_W8.name
    if envs.get("VLLM_X86_QUANT_KERNEL") == "vllm":
        return VLLM_W8A8.name if amx_available() else TORCH_W8.name
    check_plugin_kernels()
    return W8A16.name


def int4_kernel(group_size: int) -> str:
    """The INT4 kernel for a configured group size: "w4a16" (the plugin's; groups of 32,
    64 and 128), "vllm" (vLLM CPU's AMX W4A8, on request) or "torch" (neither AMX nor
    AVX-512 VNNI, or vLLM's on request without AMX)."""
    from vllm_x86.runtime import envs

    if not plugin_kernels_available():
        return TORCH_W4.name
    if envs.get("VLLM_X86_QUANT_KERNEL") == "vllm":
        return VLLM_W4A8.name if amx_available() else TORCH_W4.name
    check_plugin_kernels()
    return W4A16.name


def weight_kernel(bits: int, group_size: int) -> str:
    """The kernel a weight quantized while loading runs on (int8_kernel, int4_kernel):
    the rule of the Linear and MoE-expert rows."""
    return int8_kernel() if bits == 8 else int4_kernel(group_size)


def lm_head_kernel(bits: int, group_size: int) -> str | None:
    """The LM head rows' rule: the Linear layers' kernel where it is the plugin's (INT8:
    also vLLM's on request), or None: the head stays in bf16 (PyTorch's weight-only
    kernels are not used for it)."""
    kernel = weight_kernel(bits, group_size)
    if bits == 8:
        return None if kernel == TORCH_W8.name else kernel
    return kernel if kernel == W4A16.name else None


def int4_layout_kernel(layout: str | None) -> str:
    """The kernel a prepacked INT4 checkpoint's layout is for (INT8 ones: always
    w8a16)."""
    return W4A16.name if layout == W4A16.layout else VLLM_W4A8.name


def _vnni_rows_note(isa: str) -> str:
    """What VLLM_X86_QUANT_VNNI_ROWS changes here, for the log line above."""
    import vllm_x86.runtime._C as C

    rows = C.quant_vnni_rows()
    if isa != "amx" or C.int4_kernel(1) != "avx512_vnni":
        return ""
    upto = "one row" if rows == 1 else f"up to {rows} rows"
    return f"; INT4 GEMMs of {upto} run the AVX-512 VNNI kernel (VLLM_X86_QUANT_VNNI_ROWS)"


def activations(isa: str | None) -> str:
    """How the plugin's kernels on `isa` round activations, in words (log, doctor)."""
    from vllm_x86.runtime.ops import kernels

    rows = kernels.a8_rows() if isa == "avx512_vnni" else 0
    if rows == 0:
        return "16-bit activations"
    if rows == 1:
        return "8-bit activations (a scale per 64 inputs)"
    return f"16-bit activations below {rows} rows, 8-bit (a scale per 64 inputs) from {rows}"


_isa_logged = False


def check_plugin_kernels() -> None:
    """Raise with what to do when the plugin's INT8/INT4 kernels cannot run; log once
    which ISA they run on."""
    global _isa_logged
    from vllm_x86.runtime.ops import kernels

    if not kernels.available():
        raise RuntimeError(
            "x86_int8/x86_int4 run the plugin's kernels and the plugin's kernels did not "
            f"load ({kernels.load_error()}); run `make install`, or set "
            "VLLM_X86_QUANT_KERNEL=torch for PyTorch's weight-only kernels"
        )
    isa = kernels.quant_isa()
    if not isa:
        raise RuntimeError(
            "the plugin's INT8/INT4 kernels cannot run in this process: no AVX-512 VNNI, "
            "and Linux refused the AMX tile state; set VLLM_X86_QUANT_KERNEL=torch"
        )
    if not _isa_logged:
        _isa_logged = True
        _quant_logger.info(
            "vllm-x86: INT8/INT4 GEMMs run the plugin's %s kernels, %s%s",
            isa,
            activations(isa),
            _vnni_rows_note(isa),
        )


def quant_rows() -> tuple[Override, ...]:
    """The quant rows of the table."""
    return tuple(row for row in OVERRIDES if row.kind == "quant")


def chosen_kernel(row: Override, group_size: int = 128) -> Kernel | None:
    """The kernel of quant `row` that runs here with the current settings (its
    ``choose`` rule), or None: the layer stays in bf16."""
    name = _load(row.choose)(row.bits, group_size)
    if name is None:
        return None
    for kernel in row.kernels:
        if kernel.name == name:
            return kernel
    raise ValueError(f"{row.choose} chose {name!r}, which the {row.impl} row does not list")


_installed: dict[str, type] = {}
_module_classes: dict[type, type] = {}


def _load(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def plugin_is_platform() -> bool:
    """Whether vLLM's platform is the plugin's (X86Platform.is_vllm_x86)."""
    from vllm.platforms import current_platform

    return getattr(current_platform, "is_vllm_x86", False) is True


def ops_enabled() -> bool:
    """False when VLLM_X86_OPS=0: the user asked for vLLM's own ops."""
    from vllm_x86.runtime import envs

    if envs.get_bool("VLLM_X86_OPS"):
        return True
    global _said_off
    if not _said_off:
        _said_off = True
        logger.info("vllm-x86: op table off (VLLM_X86_OPS=0): vLLM's own CPU ops run")
    return False


_said_off = False


def register_all() -> dict[str, type]:
    """Install the customop and backend rows (idempotent; the layer rows are
    register_layers'). Only when the plugin is vLLM's platform (with VLLM_X86_DISABLE=1,
    stock vLLM CPU runs untouched) and the op table is on (VLLM_X86_OPS)."""
    if _installed or not plugin_is_platform() or not ops_enabled():
        return _installed
    from vllm.model_executor.custom_op import CustomOp

    from vllm_x86.runtime.ops import kernels, layernorm
    from vllm_x86.runtime.ops.fallback import warn_fallback

    if not kernels.available():
        warn_fallback("every plugin kernel", kernels.load_error() or "no kernels")
    for row in OVERRIDES:
        if row.kind == "customop":
            _installed[row.target.split(":")[1]] = _register_oot(row, CustomOp)
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    for row in OVERRIDES:
        if row.kind == "backend":
            register_backend(AttentionBackendEnum[row.target], row.impl.replace(":", "."))
            _installed[row.target] = _load(row.impl)
    layernorm.register()
    logger.debug("vllm-x86: installed op overrides: %s", sorted(_installed))
    return _installed


def register_layers() -> None:
    """Install the layer rows (idempotent), under the same conditions as register_all.
    Called by X86Worker.load_model before vLLM builds the model."""
    if not plugin_is_platform() or not ops_enabled():
        return
    from vllm.model_executor.custom_op import PluggableLayer

    for row in OVERRIDES:
        if row.kind == "layer":
            _register_oot(row, PluggableLayer)


def _register_oot(row: Override, registry: type) -> type:
    """A customop or layer row: vLLM's class + the plugin's mixin, registered out of
    tree with `registry` (CustomOp or PluggableLayer, which look the replacement up by
    vLLM's class name), once. Returns the class vLLM will build."""
    from vllm.model_executor.custom_op import op_registry_oot

    base = _load(row.target)
    if base.__name__ in op_registry_oot:
        return op_registry_oot[base.__name__]
    cls = type(f"X86{base.__name__}", (_load(row.impl), base), {"__doc__": row.why})
    vllm_name = getattr(base, "name", None)
    registry.register_oot(cls, name=base.__name__)
    if vllm_name is not None:
        # register_oot names the class after the key; keep vLLM's name so the user's
        # custom_ops "+name"/"-name" settings apply to the override too.
        cls.name = vllm_name
    return cls


def ir_providers(vllm_config=None, inductor: bool = False) -> dict[str, list[str]]:
    """IR op -> provider priority the platform should set (empty without kernels).
    Without `vllm_config`: the C++ kernels' priority. With it, the priority for that
    engine: in compiled mode (`inductor`) vLLM's native implementations (which Inductor
    fuses) except fused_add_rms_norm with a float32 residual
    (VLLM_X86_FP32_RESIDUAL, layernorm.fp32_residual_applies), in PyTorch."""
    from vllm_x86.runtime.ops import layernorm

    if not ops_enabled() or not layernorm.register():
        return {}
    out = {
        row.target: [layernorm.PROVIDER, "native"]
        for row in OVERRIDES
        if row.kind == "ir" and row.impl.endswith(("rms_norm_x86", "add_rms_norm_x86"))
    }
    if vllm_config is None:
        return out
    if inductor:
        out = {}
    why = layernorm.fp32_residual_applies(vllm_config)
    if why is None:
        out["fused_add_rms_norm"] = (
            [layernorm.PROVIDER_F32RES_TORCH]
            if inductor
            else [layernorm.PROVIDER_F32RES, layernorm.PROVIDER_F32RES_TORCH]
        )
    logger.info(
        "vllm-x86: residual stream in %s",
        "float32 (VLLM_X86_FP32_RESIDUAL)" if why is None else f"the model's dtype: {why}",
    )
    return out


def _objects(model, kind: str):
    """What rows of `kind` match against: the model's modules, or (router rows) the
    MoE routers they hold, each once."""
    if kind == "module":
        yield from model.modules()
        return
    seen: set[int] = set()
    for module in model.modules():
        router = module.__dict__.get("router")
        if router is not None and id(router) not in seen:
            seen.add(id(router))
            yield router


def apply_module_overrides(model) -> dict[str, int]:
    """Switch the class of matching modules (module rows) and MoE routers (router rows)
    of a loaded model. Returns how many objects each row changed; logs why a row did
    not apply."""
    counts: dict[str, int] = {}
    if not ops_enabled():
        return counts
    reasons: dict[str, str] = {}
    for kind in ("module", "router"):
        targets = []
        for row in (r for r in OVERRIDES if r.kind == kind):
            try:
                targets.append((row, _load(row.target)))
            except (ImportError, AttributeError) as e:  # a file this vLLM lacks
                logger.debug("vllm-x86: %s not available: %s", row.target, e)
        if not targets:
            continue
        for obj in _objects(model, kind):
            for row, base in targets:
                if type(obj) is not base:
                    continue
                why = _load(row.check)(obj) if row.check else None
                if why is not None:
                    reasons[row.target] = why
                    continue
                sub = _module_classes.get(base)
                if sub is None:
                    impl = _load(row.impl)
                    if not (isinstance(impl, type) and issubclass(impl, base)):  # a mixin
                        impl = type(f"X86{base.__name__}", (impl, base), {"__doc__": row.why})
                    sub = _module_classes[base] = impl
                obj.__class__ = sub
                counts[row.target] = counts.get(row.target, 0) + 1
    kinds = {row.target: (row.kind, row.cpp) for row in OVERRIDES}
    for target, n in counts.items():
        what = (
            "modules use the fused kernel"
            if kinds[target] == ("module", True)
            else "use the plugin's code"
        )
        logger.info("vllm-x86: %d %s %s", n, target.split(":")[1], what)
    for target, why in reasons.items():
        if target not in counts:
            logger.info("vllm-x86: %s keeps vLLM's code: %s", target.split(":")[1], why)
    return counts
