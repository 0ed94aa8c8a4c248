"""Fake quantization of a transformers model: the reference of the conformance suite's
INT8/INT4 modes.

``fake_quantize(model, "x86_int4")`` replaces, in place, each weight that `x86_int4`
quantizes when vLLM loads the same checkpoint by the values its codes stand for:
``dequantize(quantize(w))`` with the plugin's own functions (methods.py), from the
weight rounded to bf16 first (vLLM loads it in bf16, then quantizes). Which weights:
scope.py's rule, and methods.py ``bf16_reason`` for the shapes the kernel cannot take,
with the kernel vLLM would pick on this CPU. The model then computes what the
quantized vLLM model computes, up to the kernels' own rounding; a comparison with it
checks the kernels and the choice of layers, not quantization error.

A transformers weight's kind (scope.py): ``nn.Linear`` and ``Conv1D`` (GPT-2's
transposed linear) are ``linear``, except the output embedding (``lm_head``), the
``nn.Linear`` layers inside an ``experts`` list (``moe_experts``), the MoE router
(``router``) and those inside a Mamba-1 mixer (``mamba1_mixer``: vLLM builds them
without the quantization config); the 3-D tensors of a
fused experts module (transformers' ``use_experts_implementation``, [experts, out, in]
or, where the module says ``is_transposed``, [experts, in, out]; Llama 4's, which does
not say, [experts, in, out]: ``EXPERTS_TRANSPOSED``) are ``moe_experts``. A fused
experts module of unknown layout is an error, not a weight left out.
vLLM fuses some layers that transformers keeps apart (q/k/v into qkv_proj, gate and up
into gate_up_proj); both quantize each output channel on its own, so quantizing the
parts equals quantizing the fused weight. The shape rule is applied to each part: a
fused layer whose parts the kernel cannot take while it takes their sum would differ.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_x86.runtime.quant import methods as m
from vllm_x86.runtime.quant import scope

METHOD_BITS = {"x86_int8": 8, "x86_int4": 4}


@dataclass
class Weight:
    name: str  # the parameter's name in the model
    kind: str  # scope.py
    param: torch.nn.Parameter
    transposed: bool  # stored [K, N] (Conv1D, transposed experts)


def _linear_classes() -> tuple[type, ...]:
    from transformers.pytorch_utils import Conv1D

    return (torch.nn.Linear, Conv1D)


def weights(model: torch.nn.Module) -> list[Weight]:
    """Every weight of `model` that scope.py gives a quantizable kind (linear, MoE
    experts, LM head), with that kind."""
    from transformers.pytorch_utils import Conv1D

    out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head = out_emb.weight if out_emb is not None else None
    found: list[Weight] = []
    seen: set[int] = set()
    mamba1: list[str] = []  # the names of the Mamba-1 mixers (a parent comes first)
    for mname, mod in model.named_modules():
        prefix = f"{mname}." if mname else ""
        if type(mod).__name__ in scope.MAMBA1_MIXER_CLASSES:
            mamba1.append(prefix)
        if isinstance(mod, _linear_classes()):
            w = mod.weight
            if id(w) in seen:
                continue
            seen.add(id(w))
            if head is not None and w is head:
                kind = scope.LM_HEAD
            elif any(mname.startswith(mixer) for mixer in mamba1):
                kind = scope.MAMBA1_MIXER  # vLLM builds it unquantized (scope.py)
            elif ".experts." in f".{mname}.":
                kind = scope.MOE_EXPERTS
            elif scope.kind_of(mname) == "router":
                kind = scope.ROUTER  # the MoE router stays bf16 (scope.py)
            else:
                kind = scope.LINEAR
            found.append(Weight(prefix + "weight", kind, w, isinstance(mod, Conv1D)))
        elif hasattr(mod, "is_transposed") and hasattr(mod, "is_concatenated"):
            found += _experts(mod, prefix, bool(mod.is_transposed), seen)
        elif type(mod).__name__ in EXPERTS_TRANSPOSED:
            found += _experts(mod, prefix, EXPERTS_TRANSPOSED[type(mod).__name__], seen)
        elif mname.split(".")[-1] == "experts" and any(
            p.ndim == 3 for p in mod.parameters(recurse=False)
        ):
            raise NotImplementedError(
                f"{mname}: a fused experts module ({type(mod).__name__}) whose layout "
                "fake.py does not know: add it to EXPERTS_TRANSPOSED"
            )
    return found


# Fused experts modules of transformers that do not say their layout
# (``is_transposed``): class name -> stored [experts, in, out] (their forward is
# ``bmm(x, w)``).
EXPERTS_TRANSPOSED = {"Llama4TextExperts": True}


def _experts(mod, prefix: str, transposed: bool, seen: set[int]) -> list[Weight]:
    out = []
    for pname, p in mod.named_parameters(recurse=False):
        if p.ndim == 3 and id(p) not in seen:
            seen.add(id(p))
            out.append(Weight(prefix + pname, scope.MOE_EXPERTS, p, transposed))
    return out


def fake_quantize(
    model: torch.nn.Module,
    method: str,
    group_size: int | None = None,
    zero_point: bool | None = None,
    lm_head: bool | int | str | None = None,
) -> dict[str, str]:
    """Give `model` (in place) the weights `method` ("x86_int8" or "x86_int4") quantizes,
    quantized and dequantized. Options left None come from the environment as for
    vLLM (scope.options). Returns {parameter name: what was done} for every
    quantizable weight: "int8", "int4 g128", or "bf16: <reason>"."""
    if method not in METHOD_BITS:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(METHOD_BITS)}")
    bits = METHOD_BITS[method]
    group_size, zero_point, lm_head = scope.options(bits, group_size, zero_point, lm_head)
    report: dict[str, str] = {}
    for wt in weights(model):
        wbits = scope.weight_bits(wt.kind, bits, lm_head)
        if wbits is None:
            report[wt.name] = f"bf16: scope.py does not quantize {wt.kind} weights"
            continue
        if wt.kind == scope.LM_HEAD:
            inp = model.get_input_embeddings()
            if inp is not None and inp.weight is wt.param:
                raise NotImplementedError(
                    "a quantized LM head tied to the input embedding: the reference would "
                    "quantize the embedding too"
                )
        data = wt.param.data
        mats = data if data.ndim == 3 else data[None]  # [E, ., .]
        new = torch.empty_like(mats)
        what = None
        for e in range(mats.shape[0]):
            w = mats[e].t() if wt.transposed else mats[e]  # [N, K]
            w = w.to(torch.bfloat16)  # vLLM quantizes the bf16 weight it loaded
            n, k = w.shape
            if wt.kind == scope.LM_HEAD:
                why = m.lm_head_bf16_reason(n, k, wbits, group_size)
            else:
                why = m.bf16_reason(wbits, n, k, group_size, m.weight_kernel(wbits, group_size))
            if why is not None:
                what = f"bf16: {why}"
                new[e] = mats[e]
                continue
            g = m.effective_group_size(k, group_size)
            plan = scope.Plan(wbits, g if wbits == 4 else None)
            d = scope.fake_quantize(w, plan, zero_point, wt.kind)
            new[e] = (d.t() if wt.transposed else d).to(data.dtype)
            what = "int8" if wbits == 8 else f"int4 g{g}" + (" zp" if zero_point else "")
        with torch.no_grad():
            wt.param.data.copy_(new if data.ndim == 3 else new[0])
        report[wt.name] = what
    return report
