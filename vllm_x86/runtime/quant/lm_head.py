"""The LM head in INT8 or INT4, on request (`VLLM_X86_QUANT_LM_HEAD=1` or `int8`, or
`int4`; or a prepacked checkpoint written with `vllm-x86 quantize --lm-head int8|int4`).

Decoding a token reads the LM head whole: for models with large vocabularies it is a
large share of the bytes (Qwen3-0.6B: 156 M of its 596 M weights read per token), so
with only the decoder layers quantized, INT8 can gain at most 1.6x over bf16 on that
model. The LM head is quantized like the Linear layers after the weights are loaded:
INT8 symmetric with a float32 scale per vocabulary entry, or INT4 with x86_int4's groups
and zero points (VLLM_X86_QUANT_GROUP_SIZE, VLLM_X86_QUANT_ZERO_POINT), on the same
kernels. The input embedding keeps its bf16 table: a lookup reads one row per token,
and with tied embeddings the two share that table, so the quantized copy is extra
memory (1 or half a byte per weight), not a replacement.

A prepacked checkpoint written with `--lm-head int4 --method gptq` carries the head's
GPTQ codes (format.py, lm_head_codes): they are packed instead of rounding the bf16
head, after checks that they are this head's (rows, columns, groups). Rounded while loading,
the head alone costs the default model about 13 % perplexity (min/max rounding 14 %;
a float32 simulation, docs/quantization.md), GPTQ about 1 % (gptq.py). The search
(methods.quantize_int4) weights the head's errors by w^2, the Linear layers' by |w|:
the powers that did best on each.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

from vllm_x86.runtime.quant import methods as m


class X86LMHeadMethod(UnquantizedEmbeddingMethod):
    def __init__(
        self,
        bits: int = 8,
        group_size: int = 128,
        zero_point: bool = True,
        codes: str | None = None,
    ):
        super().__init__()
        self.bits = bits
        self.group_size = group_size
        self.zero_point = zero_point
        self.codes = codes  # a prepacked checkpoint's file with the head's INT4 codes

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if getattr(layer, "x86_done", False):
            return
        layer.x86_done = True
        w = layer.weight.data
        n, k = w.shape
        problem = m.lm_head_bf16_reason(n, k, self.bits, self.group_size)
        layer.x86_lm_head = problem is None
        if not layer.x86_lm_head:
            m._warn_once("lmhead", "vllm-x86: the LM head stays in bf16: %s", problem)
            super().process_weights_after_loading(layer)
            return
        kernel = m.lm_head_kernel(self.bits, self.group_size)  # the op table's rule
        g = m.effective_group_size(k, self.group_size) if self.bits == 4 else None
        if self.codes:
            packed = m.pack_int4_for(kernel, *load_codes(self.codes, n, k, g))
        else:
            # INT4: the rounding the Linear layers use (VLLM_X86_QUANT_INT4_ROUNDING),
            # its search weighting errors by |w|^2 for the head
            packed = m.quantize_pack(
                self.bits, kernel, w, g, self.zero_point, m.HEAD_SEARCH_WEIGHT_POWER
            )
        layer.x86_lm_kernel = kernel
        layer.x86_lm_group = g
        layer.x86_lm_weight = packed["weight"]
        layer.x86_lm_scale = packed["weight_scale"]
        layer.x86_lm_zp = packed.get("weight_zp")
        if self.bits == 8:
            m.logger.info("vllm-x86: LM head (%d x %d) in INT8", n, k)
        else:
            m.logger.info(
                "vllm-x86: LM head (%d x %d) in INT4 (groups of %d%s%s)",
                n,
                k,
                g,
                ", zero points" if self.zero_point or self.codes else "",
                ", the checkpoint's GPTQ codes" if self.codes else "",
            )

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if not getattr(layer, "x86_lm_head", False):
            return super().apply(layer, x, bias)
        x2 = x.reshape(-1, x.shape[-1])
        b = None if bias is None else bias.float()
        if self.bits == 8:
            out = m.int8_matmul(layer.x86_lm_kernel, x2, layer.x86_lm_weight, layer.x86_lm_scale, b)
        else:
            out = m.int4_matmul(
                layer.x86_lm_kernel,
                x2,
                layer.x86_lm_weight,
                layer.x86_lm_scale,
                layer.x86_lm_zp,
                layer.x86_lm_group,
                b,
            )
        return out.reshape(*x.shape[:-1], out.shape[-1])


def load_codes(path: str, n: int, k: int, group: int):
    """The INT4 codes of an [n, k] LM head from a prepacked checkpoint's lm_head_codes
    file, as quantize_int4 returns them (q [n, k] int32, scale [k/g, n] bf16, zero
    [k/g, n] int32). Rows past the file's (vLLM pads the vocabulary to a multiple of 64)
    get zero codes and scales. Anything else that does not match is a FormatError."""
    from safetensors import safe_open

    from vllm_x86.runtime.quant import format as qformat

    try:
        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
            nib, scale, zero = (f.get_tensor(x) for x in ("qweight", "scale", "zero"))
    except Exception as e:  # missing file or tensor, damaged header
        raise qformat.FormatError(
            f"the checkpoint's LM head codes ({path}) could not be read "
            f"({type(e).__name__}: {e}); quantize the bf16 model again"
        ) from None
    rows = nib.shape[0]
    if (
        str(group) != meta.get("group_size")
        or nib.dtype != torch.uint8
        or tuple(nib.shape) != (rows, k // 2)
        or rows > n
        or tuple(scale.shape) != (k // group, rows)
        or tuple(zero.shape) != (k // group, rows)
    ):
        raise qformat.FormatError(
            f"the LM head codes in {path} (qweight {tuple(nib.shape)}, groups of "
            f"{meta.get('group_size')}) are not for this model's {n} x {k} head in groups "
            f"of {group}; quantize the bf16 model again"
        )
    q, scale, zero = qformat.Codes(nib, scale, zero.to(torch.int32)).unpack()
    if rows < n:
        q = torch.cat([q, q.new_zeros(n - rows, k)])
        scale = torch.cat([scale, scale.new_zeros(k // group, n - rows)], 1)
        zero = torch.cat([zero, zero.new_zeros(k // group, n - rows)], 1)
    return q, scale.to(torch.bfloat16), zero


def release_unshared_weights(model: torch.nn.Module) -> int:
    """Free the bf16 weight of each quantized LM head that no other layer shares; the
    bytes freed.

    A quantized head computes from its INT8/INT4 copy (``apply``) and never reads its bf16
    weight again. With tied embeddings that weight is also the input embedding's table and
    stays; an untied head's (Qwen2.5-Coder-0.5B: 151936 x 896, 272 MB) was kept for
    nothing. Kept where it may be shared: the head module is not a ParallelLMHead (a model
    that uses its embedding module as the head), is the model's input embedding, or its
    weight's storage belongs to another parameter of the model. What reads a head's
    weight checks its shape first (ops/logits.head_weight: no rows, no weight)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    heads = [
        mod
        for mod in model.modules()
        if isinstance(getattr(mod, "quant_method", None), X86LMHeadMethod)
        and getattr(mod, "x86_lm_head", False)
        and isinstance(mod, ParallelLMHead)
    ]
    if not heads:
        return 0
    get_embeddings = getattr(model, "get_input_embeddings", None)
    try:
        embedding = get_embeddings() if callable(get_embeddings) else None
    except Exception:  # a model whose method needs inputs: compare storages only
        embedding = None
    owners: dict[int, int] = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if p.numel():
                ptr = p.untyped_storage().data_ptr()
                owners[ptr] = owners.get(ptr, 0) + 1
    freed = 0
    for head in heads:
        w = head.weight
        if head is embedding or owners.get(w.untyped_storage().data_ptr(), 0) != 1:
            continue
        freed += w.numel() * w.element_size()
        w.data = w.data.new_empty((0, w.shape[1]))
    if freed:
        m.logger.info(
            "vllm-x86: the LM head's bf16 weight freed (%.0f MiB): the head runs from its "
            "quantized copy and no other layer shares that weight",
            freed / 2**20,
        )
    return freed
