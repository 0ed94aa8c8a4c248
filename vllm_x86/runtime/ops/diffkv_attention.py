"""Attention with different K and V head sizes (DiffKV) on the CPU.

vLLM gives a layer whose V head size differs from its Q/K head size (MiMo-V2-Flash:
192/128) a DiffKV backend: FLASH_ATTN_DIFFKV where FlashAttention 3/4 runs, else
TRITON_ATTN_DIFFKV (models/mimo_v2.py). Both are GPU kernels; Triton has no CPU
backend here, so such models stopped at the first KV-cache write. The op table
(registry.py, ``backend`` row) puts this class in TRITON_ATTN_DIFFKV's place: vLLM's
backend, metadata builder and packed cache layout (``[num_blocks, num_kv_heads,
block_size, head_size + head_size_v]``), with the two Triton kernels replaced by the
pure-torch references ``reshape_and_cache_diffkv`` and ``paged_attention_diffkv``
(ops/reference.py; float32 math, one request at a time). There is no C++ kernel
yet, and the plugin says so once.
"""

from __future__ import annotations

import torch
from vllm.utils.torch_utils import is_quantized_kv_cache
from vllm.v1.attention.backends.triton_attn_diffkv import (
    TritonAttentionDiffKVBackend,
    TritonAttentionDiffKVImpl,
)

from vllm_x86.runtime.ops import reference
from vllm_x86.runtime.ops.fallback import warn_fallback


class X86DiffKVAttentionImpl(TritonAttentionDiffKVImpl):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if is_quantized_kv_cache(self.kv_cache_dtype):
            raise NotImplementedError(
                f"vllm-x86 DiffKV attention: quantized KV cache {self.kv_cache_dtype!r} "
                "is not supported on CPU"
            )
        if self.alibi_slopes is not None:
            raise NotImplementedError("vllm-x86 DiffKV attention: ALiBi is not supported")
        warn_fallback(
            "DiffKV attention (TRITON_ATTN_DIFFKV)", "no C++ kernel yet; Triton has no CPU backend"
        )

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        reference.reshape_and_cache_diffkv(key, value, kv_cache.transpose(1, 2), slot_mapping)

    def forward(
        self,
        layer: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("vllm-x86 DiffKV attention: no fused output quantization")
        if attn_metadata is None:
            return output.fill_(0)
        n = attn_metadata.num_actual_tokens
        head_size_v = kv_cache.shape[-1] - self.head_size  # K then V, packed
        out = output[:n].view(n, self.num_heads, head_size_v)
        reference.paged_attention_diffkv(
            out,
            query[:n].view(n, self.num_heads, self.head_size),
            kv_cache.transpose(1, 2),
            head_size_v,
            attn_metadata.query_start_loc,
            attn_metadata.seq_lens,
            attn_metadata.block_table,
            self.scale,
            window_left=self.sliding_window[0],
            softcap=float(self.logits_soft_cap or 0.0),
            sinks=self.sinks,
        )
        return output


class X86DiffKVAttentionBackend(TritonAttentionDiffKVBackend):
    """TRITON_ATTN_DIFFKV with the plugin's CPU implementation (see module doc)."""

    @staticmethod
    def get_impl_cls() -> type[X86DiffKVAttentionImpl]:
        return X86DiffKVAttentionImpl
