// Per-ISA kernel entry points of vllm-x86.
//
// Each ISA translation unit (isa_avx2.cpp, isa_avx512.cpp, isa_avx512bf16.cpp) compiles
// kernels_impl.h under its own `#pragma GCC target` and defines these functions in its
// own namespace. ops.cpp (built for the baseline x86-64 ISA) checks arguments, splits
// the work over threads and calls the table of the ISA chosen at run time. Nothing in
// this header depends on an ISA, so it can be included everywhere.
#pragma once

#include <cstdint>

#include "kv_layout.h"

namespace vllm_x86 {

// Element types the kernels handle.
enum DType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// Row addressing for norm-like ops: row r = (i0, i1) with r = i0 * n1 + i1 and
// element offset i0 * s0 + i1 * s1 (elements, last dim contiguous).
struct Rows2 {
  int64_t n0, n1, s0, s1;
};

struct KernelTable {
  const char* name;
  // out[r] = round(round(x[r] * rsqrt(mean(x[r]^2) + eps)) * w)   (w may be null)
  // scratch: `hidden` floats per calling thread
  void (*rms_norm)(int dt, void* out, Rows2 o, const void* x, Rows2 xr, const void* w,
                   int64_t hidden, float eps, int64_t r_begin, int64_t r_end, float* scratch);
  // s = x + res (fp32); res = round(s); x = round(round(s * rsqrt(mean(s^2)+eps)) * w)
  // scratch: 2 * `hidden` floats per calling thread
  void (*fused_add_rms_norm)(int dt, void* x, int64_t xs, void* res, int64_t rs,
                             const void* w, int64_t hidden, float eps, int64_t r_begin,
                             int64_t r_end, float* scratch);
  // In-place rotary embedding of tokens [t_begin, t_end); cache rows are
  // [cos(rot/2) | sin(rot/2)] in cache_dt.
  void (*rotary_embedding)(int dt, int cache_dt, const int64_t* positions, void* q,
                           int64_t qs, int nq, void* k, int64_t ks, int nk, int head,
                           int rot, bool neox, const void* cache, int64_t cache_s,
                           int64_t t_begin, int64_t t_end);
  // out[r] = round(round(act(x[r, :d])) * x[r, d:]); act: 0 silu, 1 gelu(erf), 2 gelu(tanh)
  void (*act_and_mul)(int dt, int act, void* out, int64_t os, const void* x, int64_t xs,
                      int64_t d, int64_t r_begin, int64_t r_end);
  // Qwen3 attention prologue for tokens [t_begin, t_end): split the fused qkv row,
  // per-head RMSNorm of q and k (weights qw, kw of size head), neox RoPE on the
  // first `rot` dims, write q, k, v (contiguous rows). scratch: `head` floats.
  void (*split_norm_rope_neox)(int dt, int cache_dt, void* q_out, void* k_out, void* v_out,
                               const void* qkv, int64_t qkv_s, const int64_t* positions,
                               const void* qw, const void* kw, const void* cache,
                               int64_t cache_s, int nq, int nk, int head, int rot, float eps,
                               int64_t t_begin, int64_t t_end, float* scratch);
  // fused_add_rms_norm with a float32 residual (x in dt): s = x + res; res = s (float32,
  // not rounded); x = round(round(s * rsqrt(mean(s^2)+eps)) * w)
  void (*fused_add_rms_norm_f32res)(int dt, void* x, int64_t xs, float* res, int64_t rs,
                                    const void* w, int64_t hidden, float eps,
                                    int64_t r_begin, int64_t r_end);
  // Decode attention of vLLM CPU's paged KV cache, one query token per row, for
  // items [i_begin, i_end) (item = row * kvh + KV head): writes the token's key and
  // value into their slot (none for a negative slot), then out = softmax(scale * q K^T) V
  // in float32 for the G query heads of the KV head. layout: 0 vLLM's "vec"/"vec16", 1 its "amx" (bfloat16,
  // AVX-512 tables only). scratch: G * (hd + max seq_len) floats per calling thread.
  void (*decode_attention)(int dt, int layout, const void* q, int64_t qs, const void* k,
                           int64_t ks, const void* v, int64_t vs, void* cache,
                           int64_t block_elems, int kvh, int64_t bs, int64_t hd, int G,
                           const int64_t* slots, const int32_t* block_table, int64_t bt_s,
                           const int32_t* seq_lens, float scale, void* out, int64_t os,
                           int64_t i_begin, int64_t i_end, float* scratch);
  // Rows [r_begin, r_end) of an LM head's logits (dt: bf16 or fp16): out = float32
  // logits, with the tokens within |best| * rel of the row's best recomputed as float32
  // dot products of hidden and weight rows (+ bias, may be null); see kernels_impl.h.
  void (*refine_logits)(int dt, const void* logits, int64_t ls, const void* hidden,
                        int64_t hs, const void* weight, int64_t ws, const void* bias,
                        int64_t V, int64_t K, float rel, float* out, int64_t os,
                        int64_t r_begin, int64_t r_end);
};

namespace avx2 {
extern const KernelTable table;
}
namespace avx512 {
extern const KernelTable table;
}
namespace avx512bf16 {
extern const KernelTable table;
}

}  // namespace vllm_x86
