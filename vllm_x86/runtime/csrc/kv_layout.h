// vLLM CPU's paged KV cache, as its cpu_attn_reshape_and_cache writes it: one (block, KV
// head) holds bs keys, then bs values, of hd elements each (2 * bs * hd in all), laid
// out by the layout vLLM chose for the layer (its attention ISA):
//   0 ("vec", "vec16"): key (t, d) at d * bs + t (transposed), value at t * hd + d;
//   1 ("amx", bfloat16): key at (t / 16) * 16 * hd + (d / 2) * 32 + (t % 16) * 2 + d % 2
//     (pairs of dimensions, 16 tokens a tile), value at (d / 16) * bs * 16 + (t / 2) * 32
//     + (d % 16) * 2 + t % 2 (pairs of tokens, 16 dimensions a tile).
// tests/unit/test_decode_attention.py checks both against vLLM's own writes. Shared by the
// ISA kernels (kernels_impl.h) and the host code (ops.cpp), which has no ISA of its own.
#pragma once

#include <cstdint>

namespace vllm_x86 {

inline int64_t kv_key_at(int layout, int64_t bs, int64_t hd, int64_t t, int64_t d) {
  return layout == 0 ? d * bs + t : (t / 16) * 16 * hd + (d / 2) * 32 + (t % 16) * 2 + d % 2;
}
inline int64_t kv_value_at(int layout, int64_t bs, int64_t hd, int64_t t, int64_t d) {
  return bs * hd + (layout == 0 ? t * hd + d : (d / 16) * bs * 16 + (t / 2) * 32 + (d % 16) * 2 + t % 2);
}

}  // namespace vllm_x86
