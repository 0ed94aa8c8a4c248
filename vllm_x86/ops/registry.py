"""THE table of everything the plugin changes in vLLM's compute.

Every row names what it replaces in vLLM, with what, and why. Reading this file tells
a newcomer all the plugin does to vLLM's math; nothing else in the code base registers
or replaces ops. Six kinds of rows, one per mechanism vLLM offers a platform:

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

Each kernel has a pure-torch reference (ops/reference.py) and tests against it
(tests/unit/test_ops.py). Where a kernel cannot run, the reference runs and the plugin
says so once (ops/fallback.py).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from vllm_x86.log import get_logger

logger = get_logger("ops")


@dataclass(frozen=True)
class Override:
    kind: str  # "customop" | "ir" | "layer" | "module" | "router" | "backend"
    # vLLM's "module:Class" (customop, layer, module, router), IR op name (ir), or
    # attention backend name (backend)
    target: str
    impl: str  # the plugin's "module:Object"
    why: str
    # module and router rows: "module:function" -> None or reason not to
    check: str | None = None
    cpp: bool = True  # False: the plugin's implementation is PyTorch (no C++ kernel)


_ROPE = "vllm.model_executor.layers.rotary_embedding"
_ROPE_MIXIN = "vllm_x86.ops.rotary_embedding:X86RotaryMixin"
_ROPE_WHY = (
    "C++ kernel, bit-identical to vLLM's reference in every dtype; stock "
    "_C.rotary_embedding rounds differently and flips SmolLM2's eager bf16 answer "
    "(docs/correctness.md)"
)
_QK = "vllm_x86.ops.qwen3_attention"
_QK_WHY = (
    "split + q/k RMSNorm + neox RoPE in one kernel (split_norm_rope_neox) where vLLM "
    "runs a split, two norms and a rotary op"
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
        "vllm_x86.ops.activation:X86SiluAndMulMixin",
        "one-pass C++ kernel instead of PyTorch's silu + mul (two passes)",
    ),
    Override(
        "customop",
        "vllm.model_executor.layers.activation:GeluAndMul",
        "vllm_x86.ops.activation:X86GeluAndMulMixin",
        "one-pass C++ kernel (erf and tanh GELU) instead of PyTorch's gelu + mul",
    ),
    Override(
        "customop",
        "vllm.model_executor.layers.activation:XIELU",
        "vllm_x86.ops.xielu:X86XIELUMixin",
        "vLLM's xIELU (Apertus) holds its parameters in bf16 whatever the model dtype, "
        "so float32 models ran it with bf16-rounded coefficients; in float32 the "
        "plugin's class holds them in float32 (vLLM's math)",
        cpp=False,
    ),
    # RMSNorm: vLLM IR ops; on CPU stock vLLM has only the native (PyTorch) version
    Override(
        "ir",
        "rms_norm",
        "vllm_x86.ops.layernorm:rms_norm_x86",
        "C++ kernel: one read to sum squares, one to scale, instead of ~6 PyTorch ops",
    ),
    Override(
        "ir",
        "fused_add_rms_norm",
        "vllm_x86.ops.layernorm:fused_add_rms_norm_x86",
        "C++ kernel: residual add and RMSNorm in place, two passes",
    ),
    # Mamba-1 mixers (Mamba, FalconMamba, Jamba)
    Override(
        "layer",
        "vllm.model_executor.layers.mamba.mamba_mixer:MambaMixer",
        "vllm_x86.ops.mamba:X86MambaMixerMixin",
        "vLLM's CPU build cannot run it: the prefill scan is a CUDA-only _C op (the "
        "plugin's selective_scan_fwd runs instead), bf16 packs the conv weight its conv "
        "ops read unpacked, and decode passes a 3-D state to a 4-D state kernel "
        "(ops/mamba.py)",
        cpp=False,
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
    # MoE routing: vLLM's CPU router asserts softmax where no expert groups are used
    Override(
        "router",
        "vllm.model_executor.layers.fused_moe.router.cpu_router:CPURouter",
        "vllm_x86.ops.moe_routing:X86CPURouter",
        "sigmoid top-k routing (optional correction bias for the choice only) without "
        "expert groups, which vLLM's CPU router rejects (Laguna, MiniMax-M2)",
        check="vllm_x86.ops.moe_routing:needs_routing",
        cpp=False,
    ),
    # attention whose V head size differs from the Q/K one (MiMo-V2-Flash)
    Override(
        "backend",
        "TRITON_ATTN_DIFFKV",
        "vllm_x86.ops.diffkv_attention:X86DiffKVAttentionBackend",
        "vLLM's DiffKV backends are GPU kernels (FlashAttention, Triton); the plugin's "
        "runs the torch reference on the same packed cache",
        cpp=False,
    ),
    # Gated DeltaNet linear attention: Qwen3-Next, Qwen3.5 in float32; OLMo-Hybrid
    Override(
        "layer",
        "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn:QwenGatedDeltaNetAttention",
        "vllm_x86.ops.gdn:X86GatedDeltaNetMixin",
        "vLLM's CPU GDN kernels are bf16 only (gdn_attention.py asserts 'CPU GDN "
        "attention requires BF16'); float32 runs the plugin's float32 gated delta rule, "
        "bf16 keeps vLLM's kernels",
        cpp=False,
    ),
    Override(
        "layer",
        "vllm.model_executor.layers.mamba.gdn.olmo_gdn_linear_attn:OlmoHybridGatedDeltaNetAttention",
        "vllm_x86.ops.gdn:X86OlmoHybridGatedDeltaNetMixin",
        "vLLM's OLMo-Hybrid layer runs FLA Triton kernels only and sets a Triton allocator "
        "when built; the Triton here has no CPU backend. The plugin's layer is built "
        "without the allocator and runs the plugin's float32 gated delta rule",
        cpp=False,
    ),
)

_installed: dict[str, type] = {}
_module_classes: dict[type, type] = {}


def _load(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def plugin_is_platform() -> bool:
    from vllm.platforms import current_platform

    from vllm_x86.platform import X86Platform

    return isinstance(current_platform, X86Platform)


def ops_enabled() -> bool:
    """False when VLLM_X86_OPS=0: the user asked for vLLM's own ops."""
    from vllm_x86 import envs

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

    from vllm_x86.ops import kernels, layernorm
    from vllm_x86.ops.fallback import warn_fallback

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


def ir_providers() -> dict[str, list[str]]:
    """IR op -> provider priority the platform should set (empty without kernels)."""
    from vllm_x86.ops import layernorm

    if not ops_enabled() or not layernorm.register():
        return {}
    return {row.target: [layernorm.PROVIDER, "native"] for row in OVERRIDES if row.kind == "ir"}


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
    kinds = {row.target: row.kind for row in OVERRIDES}
    for target, n in counts.items():
        what = (
            "modules use the fused kernel" if kinds[target] == "module" else "use the plugin's code"
        )
        logger.info("vllm-x86: %d %s %s", n, target.split(":")[1], what)
    for target, why in reasons.items():
        if target not in counts:
            logger.info("vllm-x86: %s keeps vLLM's code: %s", target.split(":")[1], why)
    return counts
