"""Which weights `x86_int8` and `x86_int4` quantize: the one rule, in one place.

The methods (config.py, moe.py), the offline converter (convert.py) and the
fake-quantized reference (fake.py) ask this module, so they cannot disagree:

- ``linear``: the Linear layers of the decoder (attention q/k/v/o, MLP gate/up/down,
  the shared experts of MoE models): quantized;
- ``experts``: the routed MoE experts, each expert's gate_up (w13, [2I, H]) and down
  (w2, [H, I]) quantized on its own, exactly as a Linear weight of that shape;
- ``router``: the MoE router (``...mlp.gate``; vLLM's ``GateLinear``): stays in bf16,
  so the choice of experts is the bf16 model's;
- ``lm_head``: INT8 (``VLLM_X86_QUANT_LM_HEAD=1``, ``vllm-x86 quantize --lm-head``) or
  INT4 (``VLLM_X86_QUANT_LM_HEAD=int4``), for both methods, only when asked; else bf16;
- ``mamba1_mixer``: the Linear layers of a Mamba-1 mixer (in_proj, x_proj, dt_proj,
  out_proj of Mamba, FalconMamba and Jamba's Mamba layers): bf16. vLLM builds its
  ``MambaMixer`` (vllm/model_executor/layers/mamba/mamba_mixer.py) without the
  quantization config, so no method is asked for them; a reference must leave them too.
  (Mamba-2 mixers take the config for in_proj and out_proj: those are ``linear``.)
- ``embedding`` and everything else (norms, biases, convolutions, ...): bf16.

A weight of a quantized kind whose shape the kernel does not take stays in bf16 with a
warning (``plan`` says why). INT8 is symmetric with a float32 scale per output channel;
INT4 uses groups of ``effective_group_size`` input channels (the configured size, or 64
or 32 where it does not divide K) and zero points unless symmetric.
"""

from __future__ import annotations

from typing import NamedTuple

from vllm_x86.runtime.quant import methods as m

QUANTIZED_KINDS = ("linear", "experts")  # plus "lm_head" on request


class Plan(NamedTuple):
    """How one weight is stored: ``bits`` None means bf16 (``reason`` says why)."""

    bits: int | None
    group: int | None = None
    reason: str | None = None

    @property
    def quantized(self) -> bool:
        return self.bits is not None


def kind_of(name: str) -> str:
    """The kind of a weight or module, from its name in a checkpoint, in transformers or
    in vLLM (``model.layers.3.mlp.experts`` / ``...experts.gate_up_proj`` / ``...experts.
    5.down_proj.weight`` -> experts; ``...mlp.gate(.weight)`` -> router)."""
    parts = name.split(".")
    if parts[-1] in ("weight", "bias", "qweight"):
        parts = parts[:-1]
    if any(p in ("embed_tokens", "wte", "embeddings", "embed_in") for p in parts):
        return "embedding"
    if "layers" not in parts and "h" not in parts:
        return "lm_head" if parts and parts[-1] in ("lm_head", "embed_out") else "other"
    if "experts" in parts:
        return "experts"
    if parts and parts[-1] == "gate":
        return "router"
    return "linear"


def plan(
    kind: str,
    n: int,
    k: int,
    bits: int,
    group_size: int = 128,
    lm_head: bool = False,
    kernel: str | None = None,
) -> Plan:
    """How a [n, k] weight of `kind` is stored under `x86_int{bits}`. `kernel` is the
    GEMM kernel that will run it ("w8a16"/"w4a16", the plugin's; "vllm"; "torch");
    None: the plugin's, or vLLM's W4A8 for INT4 groups of 32. For vLLM's fused layers
    (qkv_proj, gate_up_proj) n is the fused size."""
    if kind == "lm_head":
        if not lm_head:
            return Plan(None, reason="the LM head stays in bf16 unless asked for")
        bits = lm_head_bits(lm_head)  # INT8 (or INT4) on request, either method (lm_head.py)
    elif kind not in QUANTIZED_KINDS:
        return Plan(None, reason=f"{kind} weights stay in bf16")
    if bits == 8:
        problem = m.int8_shape_problem(n, k, kernel or "w8a16")
        return Plan(None, reason=problem) if problem else Plan(8)
    if kernel is None:
        kernel = "w4a16"
    problem = m.int4_shape_problem(n, k, group_size, kernel)
    if problem:
        return Plan(None, reason=problem)
    return Plan(4, m.effective_group_size(k, group_size))


def fake_quantize(w, p: Plan, zero_point: bool = True, kind: str = "linear"):
    """The float32 weight a bf16/float [n, k] weight `w` of `kind` stands for once stored
    as `p` says: what the kernels compute with (the reference of every parity test).
    INT4 rounds as the methods do (VLLM_X86_QUANT_INT4_ROUNDING; the LM head's search
    weights its errors as lm_head.py does)."""
    if not p.quantized:
        return w.float()
    if p.bits == 8:
        return m.dequantize_int8(*m.quantize_int8(w))
    power = m.HEAD_SEARCH_WEIGHT_POWER if kind == "lm_head" else m.SEARCH_WEIGHT_POWER
    group, rounding = p.group, None
    if kind not in (LM_HEAD, MOE_EXPERTS):
        # Linear layers keep a 4-bit grid they already sit on (linear.py)
        group = m.grid_group(w, p.group, zero_point, m.weight_kernel(4, p.group))
        rounding = m.int4_rounding_for(group, p.group)
    q, scale, zero = m.quantize_int4(w, group, zero_point, rounding, power=power)
    return m.dequantize_int4(q, scale, zero, group)


# Names of the kinds, for readers that ask by kind (config.layer_kind, fake.py).
LINEAR = "linear"
MOE_EXPERTS = "experts"
LM_HEAD = "lm_head"
EMBEDDING = "embedding"
ROUTER = "router"
MAMBA1_MIXER = "mamba1_mixer"

# The transformers classes of a Mamba-1 mixer (vLLM's MambaMixer): their Linear layers
# are MAMBA1_MIXER weights.
MAMBA1_MIXER_CLASSES = ("MambaMixer", "FalconMambaMixer", "JambaMambaMixer")
# In a checkpoint only the model type tells a Mamba-1 mixer's weights apart: config.json's
# model_type -> the name segment of its mixers (backbone.layers.3.mixer.in_proj.weight,
# model.layers.3.mamba.in_proj.weight).
MAMBA1_MIXER_SEGMENTS = {"mamba": "mixer", "falcon_mamba": "mixer", "jamba": "mamba"}


def checkpoint_kind(name: str, model_type: str | None) -> str:
    """kind_of for a tensor of a checkpoint whose config.json says `model_type`: also
    tells the Linear layers of Mamba-1 mixers (MAMBA1_MIXER) apart."""
    kind = kind_of(name)
    segment = MAMBA1_MIXER_SEGMENTS.get(model_type or "")
    if kind == LINEAR and segment is not None and segment in name.split("."):
        return MAMBA1_MIXER
    return kind


def weight_bits(kind: str, bits: int, lm_head: bool | int) -> int | None:
    """The bits a weight of `kind` is quantized to under a method of `bits` (8 or 4),
    or None for bf16 (shape rules aside: ``plan``). The LM head is INT8 or INT4 on
    request (`lm_head`: lm_head_bits's values), whatever the method."""
    if kind == LM_HEAD:
        return lm_head_bits(lm_head) or None
    return bits if kind in QUANTIZED_KINDS else None


def lm_head_bits(value: bool | int | str | None) -> int:
    """What VLLM_X86_QUANT_LM_HEAD (or a prepacked checkpoint's `lm_head`) asks for, in
    bits: 0 (the model's dtype), 8 (`1`, `int8`) or 4 (`int4`: the groups and zero
    points of x86_int4, VLLM_X86_QUANT_GROUP_SIZE and VLLM_X86_QUANT_ZERO_POINT)."""
    if value is None or isinstance(value, bool):
        return 8 if value else 0
    if isinstance(value, int) and value in (0, 4, 8):
        return value
    v = str(value).strip().lower()
    if v in ("", "0", "false", "no", "off"):
        return 0
    if v in ("1", "true", "yes", "on", "8", "int8"):
        return 8
    if v in ("4", "int4"):
        return 4
    raise ValueError(
        f"VLLM_X86_QUANT_LM_HEAD must be 0 (the model's dtype), 1 or int8 (INT8) or int4, "
        f"not {value!r}"
    )


def options(
    bits: int,
    group_size: int | None = None,
    zero_point: bool | None = None,
    lm_head: bool | int | str | None = None,
) -> tuple[int, bool, int]:
    """(group_size, zero_point, lm_head bits: 0, 8 or 4) with the unset ones from the
    environment (VLLM_X86_QUANT_GROUP_SIZE, VLLM_X86_QUANT_ZERO_POINT,
    VLLM_X86_QUANT_LM_HEAD): what a model quantized while it loads uses. Zero points
    apply to INT4 weights, the LM head's included. Checks VLLM_X86_QUANT_INT4_ROUNDING
    where INT4 is asked for (the quantizers read it)."""
    from vllm_x86.runtime import envs

    if group_size is None:
        group_size = int(envs.get("VLLM_X86_QUANT_GROUP_SIZE"))
    if zero_point is None:
        zero_point = envs.get_bool("VLLM_X86_QUANT_ZERO_POINT")
    head = lm_head_bits(envs.get("VLLM_X86_QUANT_LM_HEAD") if lm_head is None else lm_head)
    if bits == 4 or head == 4:
        m.int4_rounding()  # VLLM_X86_QUANT_INT4_ROUNDING: a wrong value stops here, with a sentence
    return group_size, bool(zero_point) and (bits == 4 or head == 4), head
