// The W8A16 and W4A16 GEMMs of amx_gemm.cpp for CPUs with AVX-512 VNNI and no AMX
// (AMD Zen 4 and later, Intel Ice Lake / Cascade Lake): same packed weights, same
// activation split (split_rows: 16-bit integers as a signed hi and lo byte per input),
// same int32 sums and the same float32 epilogue in the same order, so the output is
// bit-identical to the AMX kernel's. From VLLM_X86_QUANT_A8_ROWS rows (ops.cpp decides)
// the 8-bit-activation GEMMs at the end of this file run instead: not bit-identical.
//
// The packed block row [16 channels][4 inputs] (64 bytes) is one zmm in the order
// vpdpbusd wants: lane n gets the dot product of its channel's 4 weights with 4 inputs
// broadcast to every lane. vpdpbusd multiplies UNSIGNED bytes by signed bytes, so the
// weights go in as unsigned and the activations as signed:
//   INT8: w + 128 (w xor 0x80): sum a (w + 128) = sum a w + 128 sum a
//   INT4: the code c (0..15):   sum a c = sum a (c - z) + z sum a
// and the per-token sums of a (one per group of inputs) take the extra term back out.
// INT4 groups of 32 (zero points in eighths of a step, amx_gemm.cpp's layout): a
// block's low nibbles are one group and its high nibbles the next, summed apart, and
// sum a (8 c - z) = 8 sum a c - z sum a.
// Every sum is exact in int32 (|a| <= 128, weights <= 255, K < 2^16), so the corrected
// sums equal AMX's tdpbssd sums exactly.
//
// A step takes up to 4 blocks of 16 channels (the caller's unit of work) and 2 tokens:
// 2 accumulators (hi, lo) per token and block, 16 zmm. A single token (decode of one
// request, or the last of an odd count) goes one block at a time, so the weights stream
// in memory order (one token, 4 blocks side by side read 20 GB/s on one core; block by
// block 30-35). From VX_EXPAND_ROWS tokens (prefill), INT4 blocks are first expanded to
// bytes once into a per-thread buffer and every pair of tokens reads them there (L2);
// fewer tokens unpack the nibbles in registers.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "vnni_gemm.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")

#include "bf16_store.h"

namespace vllm_x86 {
namespace vnni {

namespace {

enum Src { kRaw8, kRaw4, kBytes };

// Software prefetch, in input blocks ahead of the one multiplied. Measured one thread,
// M = 1, 64 MiB of 1024 x 1024 weights from memory: INT4 reads 10.5 GB/s without, 16-18
// with 4 blocks (2 KiB) ahead, less with 2, 8 or 16; INT8 is fastest without.
#ifndef VX_PF8
#define VX_PF8 0
#endif
#ifndef VX_PF4
#define VX_PF4 4
#endif
// From how many tokens INT4 blocks are expanded to bytes once (per thread and 4 channel
// blocks) instead of unpacking the nibbles for every pair or tile of tokens.
#ifndef VX_EXPAND_ROWS
#define VX_EXPAND_ROWS 16
#endif
// With 8-bit activations one unpacked block row feeds 4 tokens: expanding pays later.
#ifndef VX_EXPAND_ROWS_A8
#define VX_EXPAND_ROWS_A8 64
#endif
#ifndef VX_HINT
#define VX_HINT _MM_HINT_T0
#endif  // packed INT8, packed INT4, expanded unsigned bytes

inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Sums of tokens' hi and lo bytes over each group: sums[(t * g_n + g) * 2 + {0: hi, 1: lo}]
void group_sums(const int8_t* a, int64_t m, int64_t k, int64_t group, int32_t* sums) {
  const __m512i ones = _mm512_set1_epi8(1);
  const int64_t g_n = k / group, step = group < 64 ? group : 64;
  const __mmask64 take = step == 64 ? ~0ULL : (1ULL << step) - 1;
  for (int64_t t = 0; t < m; ++t)
    for (int h = 0; h < 2; ++h) {
      const int8_t* row = a + (2 * t + h) * k;
      for (int64_t g = 0; g < g_n; ++g) {
        __m512i acc = _mm512_setzero_si512();
        for (int64_t c = g * group; c < (g + 1) * group; c += step)
          acc = _mm512_dpbusd_epi32(acc, ones, _mm512_maskz_loadu_epi8(take, row + c));
        sums[(t * g_n + g) * 2 + h] = _mm512_reduce_add_epi32(acc);
      }
    }
}

// INT4 block (512 bytes) -> its 16 rows of codes as unsigned bytes (1024 bytes)
inline void expand_int4_block(const uint8_t* src, uint8_t* dst) {
  const __m512i mask = _mm512_set1_epi8(0x0f);
  for (int v = 0; v < 8; ++v) {
    __m512i b = _mm512_loadu_si512(src + 64 * v);
    _mm512_store_si512(dst + 64 * v, _mm512_and_si512(b, mask));
    _mm512_store_si512(dst + 64 * (v + 8), _mm512_and_si512(_mm512_srli_epi16(b, 4), mask));
  }
}

// Raw sums over input blocks [kb0, kb1) for NJ channel blocks and T tokens:
// acc[(t * NJ + j) * 2 + h] (16 int32 lanes each). blk[j] points at block kb0 of channel
// block j; `stride`: bytes from one input block to the next. kSplit (INT4 groups of 32,
// one block): the low-nibble rows 0-7 and the high-nibble rows 8-15 apart,
// acc[((half * T + t) * NJ + j) * 2 + h].
template <int S, int NJ, int T, bool kSplit = false>
inline void dot(const uint8_t* const* blk, int64_t stride, int64_t nkb, const int8_t* const* hi,
                int64_t koff, __m512i* out, int64_t k) {
  constexpr int kHalf = kSplit ? T * NJ * 2 : 0;  // offset of the high nibbles' sums
  constexpr int kN = T * NJ * 2 * (kSplit ? 2 : 1);
  __m512i acc[kN];
  for (int i = 0; i < kN; ++i) acc[i] = _mm512_setzero_si512();
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i mask = _mm512_set1_epi8(0x0f);
  for (int64_t kb = 0; kb < nkb; ++kb) {
    const int64_t c0 = koff + kb * 64;
    constexpr int64_t ahead = S == kRaw8 ? VX_PF8 : S == kRaw4 ? VX_PF4 : 0;
    if (ahead > 0)
      for (int j = 0; j < NJ; ++j)
        for (int l = 0; l < stride; l += 64)
          _mm_prefetch(reinterpret_cast<const char*>(blk[j] + (kb + ahead) * stride + l),
                       VX_HINT);
    if (S == kRaw4) {
      for (int v = 0; v < 8; ++v) {
        __m512i x0[T][2], x1[T][2];  // inputs of rows v and v + 8, hi and lo
        for (int t = 0; t < T; ++t)
          for (int h = 0; h < 2; ++h) {
            x0[t][h] = bcast4(hi[t] + h * k + c0 + 4 * v);
            x1[t][h] = bcast4(hi[t] + h * k + c0 + 4 * (v + 8));
          }
        for (int j = 0; j < NJ; ++j) {
          const __m512i b = _mm512_loadu_si512(blk[j] + kb * stride + 64 * v);
          const __m512i w0 = _mm512_and_si512(b, mask);
          const __m512i w1 = _mm512_and_si512(_mm512_srli_epi16(b, 4), mask);
          for (int t = 0; t < T; ++t)
            for (int h = 0; h < 2; ++h) {
              __m512i& c = acc[(t * NJ + j) * 2 + h];
              c = _mm512_dpbusd_epi32(c, w0, x0[t][h]);
              __m512i& c1 = acc[kHalf + (t * NJ + j) * 2 + h];
              c1 = _mm512_dpbusd_epi32(c1, w1, x1[t][h]);
            }
        }
      }
    } else {
      for (int r = 0; r < 16; ++r) {
        __m512i x[T][2];
        for (int t = 0; t < T; ++t)
          for (int h = 0; h < 2; ++h) x[t][h] = bcast4(hi[t] + h * k + c0 + 4 * r);
        for (int j = 0; j < NJ; ++j) {
          __m512i w = _mm512_loadu_si512(blk[j] + kb * stride + 64 * r);
          if (S == kRaw8) w = _mm512_xor_si512(w, flip);
          for (int t = 0; t < T; ++t)
            for (int h = 0; h < 2; ++h) {
              __m512i& c = acc[(r >= 8 ? kHalf : 0) + (t * NJ + j) * 2 + h];
              c = _mm512_dpbusd_epi32(c, w, x[t][h]);
            }
        }
      }
    }
  }
  for (int i = 0; i < kN; ++i) out[i] = acc[i];
}

// One token and one channel block at a time: the weights are read in memory order (one
// stream), with the hi and lo sums split over two sets of rows (4 independent chains):
// even and odd rows of INT8, the low (rows 0-7) and high nibbles (rows 8-15) of INT4.
// kSplit (INT4 groups of 32): out[0..1] the low nibbles' hi and lo sums, out[2..3] the
// high nibbles'; else out[0..1] both.
template <int S, bool kSplit = false>
inline void dot_one(const uint8_t* blk, int64_t stride, int64_t nkb, const int8_t* hi,
                    int64_t koff, __m512i* out, int64_t k) {
  __m512i h0 = _mm512_setzero_si512(), h1 = h0, l0 = h0, l1 = h0;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i mask = _mm512_set1_epi8(0x0f);
  const int8_t* lo = hi + k;
  for (int64_t kb = 0; kb < nkb; ++kb) {
    const int64_t c0 = koff + kb * 64;
    const uint8_t* b0 = blk + kb * stride;
    constexpr int64_t ahead = S == kRaw8 ? VX_PF8 : S == kRaw4 ? VX_PF4 : 0;
    if (ahead > 0)
      for (int l = 0; l < stride; l += 64)
        _mm_prefetch(reinterpret_cast<const char*>(b0 + ahead * stride + l), VX_HINT);
    if (S == kRaw4) {
      for (int v = 0; v < 8; ++v) {
        const __m512i b = _mm512_loadu_si512(b0 + 64 * v);
        const __m512i w0 = _mm512_and_si512(b, mask);
        const __m512i w1 = _mm512_and_si512(_mm512_srli_epi16(b, 4), mask);
        h0 = _mm512_dpbusd_epi32(h0, w0, bcast4(hi + c0 + 4 * v));
        l0 = _mm512_dpbusd_epi32(l0, w0, bcast4(lo + c0 + 4 * v));
        h1 = _mm512_dpbusd_epi32(h1, w1, bcast4(hi + c0 + 4 * (v + 8)));
        l1 = _mm512_dpbusd_epi32(l1, w1, bcast4(lo + c0 + 4 * (v + 8)));
      }
    } else if (S == kBytes) {
      for (int r = 0; r < 8; ++r) {
        const __m512i w0 = _mm512_loadu_si512(b0 + 64 * r);
        const __m512i w1 = _mm512_loadu_si512(b0 + 64 * (r + 8));
        h0 = _mm512_dpbusd_epi32(h0, w0, bcast4(hi + c0 + 4 * r));
        l0 = _mm512_dpbusd_epi32(l0, w0, bcast4(lo + c0 + 4 * r));
        h1 = _mm512_dpbusd_epi32(h1, w1, bcast4(hi + c0 + 4 * (r + 8)));
        l1 = _mm512_dpbusd_epi32(l1, w1, bcast4(lo + c0 + 4 * (r + 8)));
      }
    } else {
      for (int r = 0; r < 16; r += 2) {
        __m512i w0 = _mm512_loadu_si512(b0 + 64 * r);
        __m512i w1 = _mm512_loadu_si512(b0 + 64 * (r + 1));
        w0 = _mm512_xor_si512(w0, flip);
        w1 = _mm512_xor_si512(w1, flip);
        h0 = _mm512_dpbusd_epi32(h0, w0, bcast4(hi + c0 + 4 * r));
        l0 = _mm512_dpbusd_epi32(l0, w0, bcast4(lo + c0 + 4 * r));
        h1 = _mm512_dpbusd_epi32(h1, w1, bcast4(hi + c0 + 4 * (r + 1)));
        l1 = _mm512_dpbusd_epi32(l1, w1, bcast4(lo + c0 + 4 * (r + 1)));
      }
    }
  }
  if (kSplit) {
    out[0] = h0;
    out[1] = l0;
    out[2] = h1;
    out[3] = l1;
  } else {
    out[0] = _mm512_add_epi32(h0, h1);
    out[1] = _mm512_add_epi32(l0, l1);
  }
}

template <int S, int T>
inline void dot_nj(int nj, const uint8_t* const* blk, int64_t stride, int64_t nkb,
                   const int8_t* const* hi, int64_t koff, __m512i* out, int64_t k) {
  switch (nj) {
    case 1: dot<S, 1, T>(blk, stride, nkb, hi, koff, out, k); break;
    case 2: dot<S, 2, T>(blk, stride, nkb, hi, koff, out, k); break;
    case 3: dot<S, 3, T>(blk, stride, nkb, hi, koff, out, k); break;
    default: dot<S, 4, T>(blk, stride, nkb, hi, koff, out, k); break;
  }
}

// A 64-byte-aligned per-thread buffer for 4 channel blocks of expanded INT4 bytes
// (kb_n input blocks of 1024 bytes each).
uint8_t* expand_buffer(int64_t kb_n) {
  thread_local std::vector<uint8_t> buf;
  const size_t need = static_cast<size_t>(4 * kb_n * 1024 + 64);
  if (buf.size() < need) buf.resize(need);
  auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return reinterpret_cast<uint8_t*>((addr + 63) & ~static_cast<uintptr_t>(63));
}

// blk[j]: where channel block nb0 + j (j < nj) starts, packed in w or, with `bytes`,
// first expanded there from INT4 to bytes. Returns the stride between input blocks.
int64_t block_pointers(const uint8_t* w, int64_t k_block, int64_t kb_n, int64_t nb0, int nj,
                       uint8_t* bytes, const uint8_t** blk) {
  for (int j = 0; j < nj; ++j) {
    if (bytes) {
      for (int64_t kb = 0; kb < kb_n; ++kb)
        expand_int4_block(w + ((nb0 + j) * kb_n + kb) * k_block, bytes + (j * kb_n + kb) * 1024);
      blk[j] = bytes + j * kb_n * 1024;
    } else {
      blk[j] = w + (nb0 + j) * kb_n * k_block;
    }
  }
  return bytes ? 1024 : k_block;
}

template <bool kInt4>
void gemm(const int8_t* a, const float* xscale, int64_t m, int64_t k, int64_t group,
          const void* w, const float* wscale, const uint8_t* wzero, const float* bias,
          uint16_t* out, int64_t ldo, int64_t nb_begin, int64_t nb_end) {
  const int64_t kb_n = k / 64, g_n = k / group, kb_per_g = group / 64;
  constexpr int64_t kBlock = kInt4 ? 512 : 1024;
  const auto* wb = static_cast<const uint8_t*>(w);
  const bool expand = kInt4 && m >= VX_EXPAND_ROWS;
  const bool half = kInt4 && group == 32;  // two groups a block, zero points in eighths
  const int shift = half ? 3 : 0;
  thread_local std::vector<int32_t> sums_buf;
  if (sums_buf.size() < static_cast<size_t>(m * g_n * 2)) sums_buf.resize(m * g_n * 2);
  int32_t* sums = sums_buf.data();
  group_sums(a, m, k, group, sums);
  uint8_t* bytes = expand ? expand_buffer(kb_n) : nullptr;
  const __m512 k256 = _mm512_set1_ps(256.f);
  const __m512i k128 = _mm512_set1_epi32(128);
  alignas(64) float facc[2][4][16];
  __m512i acc[2 * 4 * 2];
  for (int64_t nb0 = nb_begin; nb0 < nb_end; nb0 += 4) {
    const int nj = static_cast<int>(nb_end - nb0 < 4 ? nb_end - nb0 : 4);
    const uint8_t* blk0[4];
    const int64_t stride = block_pointers(wb, kBlock, kb_n, nb0, nj, bytes, blk0);
    for (int64_t t0 = 0; t0 < m; t0 += 2) {
      const int nt = static_cast<int>(m - t0 < 2 ? m - t0 : 2);
      const int8_t* hi[2] = {a + 2 * t0 * k, a + 2 * (t0 + nt - 1) * k};
      std::memset(facc, 0, sizeof facc);
      // take the unsigned offset out of the sums of token t, block j, group g, then add
      // them times the group's scales
      auto epilogue = [&](int t, int j, int64_t g, __m512i h, __m512i l) {
        const int32_t* st = sums + ((t0 + t) * g_n + g) * 2;
        if (kInt4) {
          const __m512i z = _mm512_cvtepu8_epi32(_mm_loadu_si128(
              reinterpret_cast<const __m128i*>(wzero + ((nb0 + j) * g_n + g) * 16)));
          h = _mm512_sub_epi32(_mm512_slli_epi32(h, shift),
                               _mm512_mullo_epi32(z, _mm512_set1_epi32(st[0])));
          l = _mm512_sub_epi32(_mm512_slli_epi32(l, shift),
                               _mm512_mullo_epi32(z, _mm512_set1_epi32(st[1])));
        } else {
          h = _mm512_sub_epi32(h, _mm512_mullo_epi32(k128, _mm512_set1_epi32(st[0])));
          l = _mm512_sub_epi32(l, _mm512_mullo_epi32(k128, _mm512_set1_epi32(st[1])));
        }
        const float* sp = kInt4 ? wscale + ((nb0 + j) * g_n + g) * 16 : wscale + (nb0 + j) * 16;
        const __m512 s = _mm512_loadu_ps(sp);
        __m512 v = _mm512_mul_ps(
            _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(h), k256), _mm512_cvtepi32_ps(l)), s);
        _mm512_store_ps(facc[t][j], _mm512_add_ps(_mm512_load_ps(facc[t][j]), v));
      };
      if (half && nt == 1) {
        // one token, groups of 32: each block's two groups from one pass over it
        for (int j = 0; j < nj; ++j)
          for (int64_t kb = 0; kb < kb_n; ++kb) {
            const uint8_t* blk = blk0[j] + kb * stride;
            if (expand)
              dot_one<kBytes, true>(blk, stride, 1, hi[0], kb * 64, acc, k);
            else
              dot_one<kRaw4, true>(blk, stride, 1, hi[0], kb * 64, acc, k);
            epilogue(0, j, 2 * kb, acc[0], acc[1]);
            epilogue(0, j, 2 * kb + 1, acc[2], acc[3]);
          }
      } else if (half) {
        // two tokens, groups of 32: one channel block at a time (the split sums of more
        // would not fit the registers)
        for (int64_t kb = 0; kb < kb_n; ++kb)
          for (int j = 0; j < nj; ++j) {
            const uint8_t* blk = blk0[j] + kb * stride;
            if (expand)
              dot<kBytes, 1, 2, true>(&blk, stride, 1, hi, kb * 64, acc, k);
            else
              dot<kRaw4, 1, 2, true>(&blk, stride, 1, hi, kb * 64, acc, k);
            for (int hf = 0; hf < 2; ++hf)
              for (int t = 0; t < nt; ++t)
                epilogue(t, j, 2 * kb + hf, acc[(hf * 2 + t) * 2], acc[(hf * 2 + t) * 2 + 1]);
          }
      } else if (nt == 1) {
        // one token: block by block, each block's inputs in memory order
        for (int j = 0; j < nj; ++j)
          for (int64_t g = 0; g < g_n; ++g) {
            const uint8_t* blk = blk0[j] + g * kb_per_g * stride;
            if (expand)
              dot_one<kBytes>(blk, stride, kb_per_g, hi[0], g * group, acc, k);
            else
              dot_one<kInt4 ? kRaw4 : kRaw8>(blk, stride, kb_per_g, hi[0], g * group, acc, k);
            epilogue(0, j, g, acc[0], acc[1]);
          }
      } else {
        for (int64_t g = 0; g < g_n; ++g) {
          const uint8_t* blk[4];
          for (int j = 0; j < nj; ++j) blk[j] = blk0[j] + g * kb_per_g * stride;
          if (expand)
            dot_nj<kBytes, 2>(nj, blk, stride, kb_per_g, hi, g * group, acc, k);
          else
            dot_nj<kInt4 ? kRaw4 : kRaw8, 2>(nj, blk, stride, kb_per_g, hi, g * group, acc, k);
          for (int t = 0; t < nt; ++t)
            for (int j = 0; j < nj; ++j)
              epilogue(t, j, g, acc[(t * nj + j) * 2], acc[(t * nj + j) * 2 + 1]);
        }
      }
      for (int t = 0; t < nt; ++t) {
        const float xs = xscale[t0 + t];
        for (int j = 0; j < nj; ++j) {
          const int64_t n0 = (nb0 + j) * 16;
          const __m512 b = bias ? _mm512_loadu_ps(bias + n0) : _mm512_setzero_ps();
          __m512 v = _mm512_mul_ps(_mm512_load_ps(facc[t][j]), _mm512_set1_ps(xs));
          store_bf16_row(out + (t0 + t) * ldo + n0, _mm512_add_ps(v, b));
        }
      }
    }
  }
}

}  // namespace

// ---- A8: activations in 8 bits, a scale per token and group of 64 inputs ----
//
// The 16-bit activations above cost two vpdpbusd per 4 inputs (hi and lo byte): the
// same instruction count per multiply-add as bf16's vdpbf16ps, so from about 16 rows
// the kernels run at bf16's compute rate. With 8-bit activations one vpdpbusd does.
// A scale per 64 inputs (not per token) keeps the rounding local: an outlier coarsens
// only its own group (on the default model: +0.65 % perplexity against bf16 for INT8,
// +2.4 % with one scale per token). The int32 sum of each 64-input block is exact; it
// is corrected for the weights' unsigned offset (128, or the zero point) with the
// block's activation sum, converted to float and added times the block's scales. INT4
// groups of 32 (zero points in eighths of a step): each half of a block is summed and
// corrected apart (its nibbles, its activation sum, its weight group), the block's
// weights read twice from cache.

// bf16 rows [r_begin, r_end) of x -> int8 rows of a ([m, k]), with ascale[r * k/64 + g]
// and asum[r * k/32 + 2 g + h] (the sums of the group's int8 values, its first and its
// second 32 inputs apart: INT4 groups of 32 correct each half with its own zero point).
// A group holding NaN or infinity gets a NaN scale, so the row's outputs are NaN as a
// float matmul's would be.
void quant_rows_a8(const uint16_t* x, int64_t ldx, int64_t k, int64_t r_begin, int64_t r_end,
                   int8_t* a, float* ascale, int32_t* asum) {
  const int64_t g_n = k / 64;
  const __m512 lim = _mm512_set1_ps(127.f);
  for (int64_t r = r_begin; r < r_end; ++r) {
    const uint16_t* xr = x + r * ldx;
    for (int64_t g = 0; g < g_n; ++g) {
      __m512 f[4];
      __m512 amax = _mm512_setzero_ps();
      __mmask16 nan = 0;
      for (int i = 0; i < 4; ++i) {
        __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + g * 64 + 16 * i));
        f[i] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
        amax = _mm512_max_ps(amax, _mm512_abs_ps(f[i]));
        nan |= _mm512_cmp_ps_mask(f[i], f[i], _CMP_UNORD_Q);
      }
      const float mx = nan ? NAN : _mm512_reduce_max_ps(amax);
      const float s = mx > 0.f && mx < INFINITY ? mx / 127.f : 1.f;
      ascale[r * g_n + g] = mx < INFINITY ? s : NAN;
      const __m512 inv = _mm512_set1_ps(1.f / s);
      __m512i sum[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
      for (int i = 0; i < 4; ++i) {
        __m512 v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(f[i], inv), -lim), lim);
        __m512i q = _mm512_cvtps_epi32(v);  // round to nearest even
        sum[i / 2] = _mm512_add_epi32(sum[i / 2], q);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(a + r * k + g * 64 + 16 * i),
                         _mm512_cvtepi32_epi8(q));
      }
      asum[r * 2 * g_n + 2 * g] = _mm512_reduce_add_epi32(sum[0]);
      asum[r * 2 * g_n + 2 * g + 1] = _mm512_reduce_add_epi32(sum[1]);
    }
  }
}

namespace {

// T tokens x NJ channel blocks, one 64-input block kb: raw int32 sums acc[t * NJ + j]
// over its 64 inputs (H = -1), or over its first (H = 0: the low nibbles, rows 0-7) or
// second 32 (H = 1: the high nibbles, rows 8-15) alone, for INT4 groups of 32.
template <int S, int NJ, int T, int H = -1>
inline void dot8(const uint8_t* const* blk, int64_t kb, int64_t stride,
                 const int8_t* const* a, int64_t c0, __m512i* acc) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i mask = _mm512_set1_epi8(0x0f);
  for (int i = 0; i < T * NJ; ++i) acc[i] = _mm512_setzero_si512();
  if (S == kRaw4) {
    for (int v = 0; v < 8; ++v) {
      __m512i x0[T], x1[T];
      for (int t = 0; t < T; ++t) {
        x0[t] = bcast4(a[t] + c0 + 4 * v);
        x1[t] = bcast4(a[t] + c0 + 4 * (v + 8));
      }
      for (int j = 0; j < NJ; ++j) {
        const __m512i b = _mm512_loadu_si512(blk[j] + kb * stride + 64 * v);
        const __m512i w0 = _mm512_and_si512(b, mask);
        const __m512i w1 = _mm512_and_si512(_mm512_srli_epi16(b, 4), mask);
        for (int t = 0; t < T; ++t) {
          if (H != 1) acc[t * NJ + j] = _mm512_dpbusd_epi32(acc[t * NJ + j], w0, x0[t]);
          if (H != 0) acc[t * NJ + j] = _mm512_dpbusd_epi32(acc[t * NJ + j], w1, x1[t]);
        }
      }
    }
  } else {
    for (int r = H == 1 ? 8 : 0; r < (H == 0 ? 8 : 16); ++r) {
      __m512i x[T];
      for (int t = 0; t < T; ++t) x[t] = bcast4(a[t] + c0 + 4 * r);
      for (int j = 0; j < NJ; ++j) {
        __m512i w = _mm512_loadu_si512(blk[j] + kb * stride + 64 * r);
        if (S == kRaw8) w = _mm512_xor_si512(w, flip);
        for (int t = 0; t < T; ++t) acc[t * NJ + j] = _mm512_dpbusd_epi32(acc[t * NJ + j], w, x[t]);
      }
    }
  }
}

// One 64-input block's sums into the float accumulators facc[t][j]: offset out, times
// the activation group's scale (and, for INT4, the weight group's scale). H >= 0 (INT4
// groups of 32, zero points in eighths of a step): the sums of half H of the block
// alone, weight group 2 kb + H: 8 sum a c - z sum a.
template <bool kInt4, int NJ, int T, int H = -1>
inline void add8(const __m512i* acc, const int32_t* const* asum, const float* const* ascale,
                 int64_t kb, int64_t kb_per_wg, int64_t g_n, int64_t nb0, const float* wscale,
                 const uint8_t* wzero, __m512 (*facc)[4]) {
  const int64_t wg = H >= 0 ? 2 * kb + H : kb / kb_per_wg;
  for (int j = 0; j < NJ; ++j) {
    __m512i z;
    __m512 ws;
    if (kInt4) {
      const int64_t o = ((nb0 + j) * g_n + wg) * 16;
      z = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wzero + o)));
      ws = _mm512_loadu_ps(wscale + o);
    }
    for (int t = 0; t < T; ++t) {
      const int32_t sum = H >= 0 ? asum[t][2 * kb + H] : asum[t][2 * kb] + asum[t][2 * kb + 1];
      const __m512i s = _mm512_set1_epi32(sum);
      const __m512i raw = H >= 0 ? _mm512_slli_epi32(acc[t * NJ + j], 3) : acc[t * NJ + j];
      const __m512i c = kInt4 ? _mm512_sub_epi32(raw, _mm512_mullo_epi32(z, s))
                              : _mm512_sub_epi32(raw, _mm512_slli_epi32(s, 7));
      const __m512 sc = kInt4 ? _mm512_mul_ps(ws, _mm512_set1_ps(ascale[t][kb]))
                              : _mm512_set1_ps(ascale[t][kb]);
      facc[t][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), sc, facc[t][j]);
    }
  }
}

template <bool kInt4, int S, int NJ, int T, bool kSplit>
inline void tile8(const uint8_t* const* blk, int64_t stride, int64_t kb_n, int64_t kb_per_wg,
                  int64_t g_n, const int8_t* a, const float* ascale, const int32_t* asum,
                  int64_t k, int64_t t0, int64_t nb0, const float* wscale, const uint8_t* wzero,
                  const float* bias, uint16_t* out, int64_t ldo) {
  const int8_t* at[T];
  const float* st[T];
  const int32_t* ss[T];
  for (int t = 0; t < T; ++t) {
    at[t] = a + (t0 + t) * k;
    st[t] = ascale + (t0 + t) * kb_n;
    ss[t] = asum + (t0 + t) * 2 * kb_n;
  }
  __m512 facc[T][4];
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < NJ; ++j) facc[t][j] = _mm512_setzero_ps();
  __m512i acc[T * NJ];
  for (int64_t kb = 0; kb < kb_n; ++kb) {
    constexpr int64_t ahead = S == kRaw4 ? VX_PF4 : 0;
    if (ahead > 0 && T == 1)
      for (int j = 0; j < NJ; ++j)
        for (int l = 0; l < stride; l += 64)
          _mm_prefetch(reinterpret_cast<const char*>(blk[j] + (kb + ahead) * stride + l), VX_HINT);
    if (kSplit) {  // INT4 groups of 32: each half of the block with its own group
      dot8<S, NJ, T, 0>(blk, kb, stride, at, kb * 64, acc);
      add8<kInt4, NJ, T, 0>(acc, ss, st, kb, kb_per_wg, g_n, nb0, wscale, wzero, facc);
      dot8<S, NJ, T, 1>(blk, kb, stride, at, kb * 64, acc);
      add8<kInt4, NJ, T, 1>(acc, ss, st, kb, kb_per_wg, g_n, nb0, wscale, wzero, facc);
    } else {
      dot8<S, NJ, T>(blk, kb, stride, at, kb * 64, acc);
      add8<kInt4, NJ, T>(acc, ss, st, kb, kb_per_wg, g_n, nb0, wscale, wzero, facc);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < NJ; ++j) {
      const int64_t n0 = (nb0 + j) * 16;
      __m512 v = facc[t][j];
      if (!kInt4) v = _mm512_mul_ps(v, _mm512_loadu_ps(wscale + n0));
      if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + n0));
      store_bf16_row(out + (t0 + t) * ldo + n0, v);
    }
}

template <bool kInt4, int S, int T, bool kSplit>
inline void tile8_nj(int nj, const uint8_t* const* blk, int64_t stride, int64_t kb_n,
                     int64_t kb_per_wg, int64_t g_n, const int8_t* a, const float* ascale,
                     const int32_t* asum, int64_t k, int64_t t0, int64_t nb0, const float* wscale,
                     const uint8_t* wzero, const float* bias, uint16_t* out, int64_t ldo) {
#define VX_TILE8(NJ)                                                                         \
  tile8<kInt4, S, NJ, T, kSplit>(blk, stride, kb_n, kb_per_wg, g_n, a, ascale, asum, k, t0, nb0, \
                                 wscale, \
                         wzero, bias, out, ldo)
  switch (nj) {
    case 1: VX_TILE8(1); break;
    case 2: VX_TILE8(2); break;
    case 3: VX_TILE8(3); break;
    default: VX_TILE8(4); break;
  }
#undef VX_TILE8
}

// Tokens per tile (the int32 sums of 4 tokens x 4 channel blocks are 16 zmm).
#ifndef VX_A8_TOKENS
#define VX_A8_TOKENS 4
#endif

// The last m % VX_A8_TOKENS tokens in one tile of their own size.
template <bool kInt4, int S, bool kSplit>
inline void tail8(int64_t rest, int nj, const uint8_t* const* blk, int64_t stride, int64_t kb_n,
                  int64_t kb_per_wg, int64_t g_n, const int8_t* a, const float* ascale,
                  const int32_t* asum, int64_t k, int64_t t0, int64_t nb0, const float* wscale,
                  const uint8_t* wzero, const float* bias, uint16_t* out, int64_t ldo) {
#define VX_TAIL8(T)                                                                            \
  tile8_nj<kInt4, S, T, kSplit>(nj, blk, stride, kb_n, kb_per_wg, g_n, a, ascale, asum, k, t0, \
                                nb0, wscale, \
                        wzero, bias, out, ldo)
  switch (rest) {
    case 0: break;
    case 1: VX_TAIL8(1); break;
    case 2: VX_TAIL8(2); break;
    default: VX_TAIL8(3); break;
  }
#undef VX_TAIL8
}

// Every token of channel blocks nb0 .. nb0 + nj - 1: tiles of VX_A8_TOKENS, then the tail.
template <bool kInt4, int S, bool kSplit>
inline void tiles8(int64_t m, int nj, const uint8_t* const* blk, int64_t stride, int64_t kb_n,
                   int64_t kb_per_wg, int64_t g_n, const int8_t* a, const float* ascale,
                   const int32_t* asum, int64_t k, int64_t nb0, const float* wscale,
                   const uint8_t* wzero, const float* bias, uint16_t* out, int64_t ldo) {
  constexpr int kT = VX_A8_TOKENS;
  static_assert(kT == 4, "tail8 takes the last 1 to 3 tokens");
  int64_t t0 = 0;
  for (; t0 + kT <= m; t0 += kT)
    tile8_nj<kInt4, S, kT, kSplit>(nj, blk, stride, kb_n, kb_per_wg, g_n, a, ascale, asum, k, t0,
                                   nb0, wscale, wzero, bias, out, ldo);
  tail8<kInt4, S, kSplit>(m - t0, nj, blk, stride, kb_n, kb_per_wg, g_n, a, ascale, asum, k, t0, nb0,
                  wscale, wzero, bias, out, ldo);
}

template <bool kInt4>
void gemm_a8(const int8_t* a, const float* ascale, const int32_t* asum, int64_t m, int64_t k,
             int64_t group, const void* w, const float* wscale, const uint8_t* wzero,
             const float* bias, uint16_t* out, int64_t ldo, int64_t nb_begin, int64_t nb_end) {
  const int64_t kb_n = k / 64, g_n = kInt4 ? k / group : 1;
  const bool split = kInt4 && group == 32;  // two weight groups a block (eighths of a step)
  const int64_t kb_per_wg = split ? 1 : kInt4 ? group / 64 : kb_n;
  constexpr int64_t kBlock = kInt4 ? 512 : 1024;
  const auto* wb = static_cast<const uint8_t*>(w);
  const bool expand = kInt4 && m >= VX_EXPAND_ROWS_A8;
  uint8_t* bytes = expand ? expand_buffer(kb_n) : nullptr;
  // One row (VLLM_X86_QUANT_A8_ROWS=1): one channel block at a time, so the weights are
  // read in memory order as one stream (as dot_one does with 16-bit activations);
  // 4 blocks side by side were slower than 16-bit activations at one row.
  const int64_t unit = m == 1 ? 1 : 4;
  for (int64_t nb0 = nb_begin; nb0 < nb_end; nb0 += unit) {
    const int nj = static_cast<int>(nb_end - nb0 < unit ? nb_end - nb0 : unit);
    const uint8_t* blk[4];
    const int64_t stride = block_pointers(wb, kBlock, kb_n, nb0, nj, bytes, blk);
#define VX_TILES8(S, SPLIT)                                                                 \
  tiles8<kInt4, S, SPLIT>(m, nj, blk, stride, kb_n, kb_per_wg, g_n, a, ascale, asum, k, nb0, \
                          wscale, wzero, bias, out, ldo)
    if (expand && split)
      VX_TILES8(kBytes, true);
    else if (expand)
      VX_TILES8(kBytes, false);
    else if (split)
      VX_TILES8(kRaw4, true);
    else
      VX_TILES8(kInt4 ? kRaw4 : kRaw8, false);
#undef VX_TILES8
  }
}

}  // namespace

void int8_w8a8_gemm(const int8_t* a, const float* ascale, const int32_t* asum, int64_t m,
                    int64_t k, const int8_t* w, const float* wscale, const float* bias,
                    uint16_t* out, int64_t ldo, int64_t nb_begin, int64_t nb_end) {
  gemm_a8<false>(a, ascale, asum, m, k, k, w, wscale, nullptr, bias, out, ldo, nb_begin, nb_end);
}

void int4_w4a8_gemm(const int8_t* a, const float* ascale, const int32_t* asum, int64_t m,
                    int64_t k, int64_t group, const uint8_t* w, const float* wscale,
                    const uint8_t* wzero, const float* bias, uint16_t* out, int64_t ldo,
                    int64_t nb_begin, int64_t nb_end) {
  gemm_a8<true>(a, ascale, asum, m, k, group, w, wscale, wzero, bias, out, ldo, nb_begin, nb_end);
}

void int8_w8a16_gemm(const int8_t* a, const float* xscale, int64_t m, int64_t k, const int8_t* w,
                     const float* wscale, const float* bias, uint16_t* out, int64_t ldo,
                     int64_t nb_begin, int64_t nb_end) {
  gemm<false>(a, xscale, m, k, k, w, wscale, nullptr, bias, out, ldo, nb_begin, nb_end);
}

void int4_w4a16_gemm(const int8_t* a, const float* xscale, int64_t m, int64_t k, int64_t group,
                     const uint8_t* w, const float* wscale, const uint8_t* wzero,
                     const float* bias, uint16_t* out, int64_t ldo, int64_t nb_begin,
                     int64_t nb_end) {
  gemm<true>(a, xscale, m, k, group, w, wscale, wzero, bias, out, ldo, nb_begin, nb_end);
}

}  // namespace vnni
}  // namespace vllm_x86

#pragma GCC pop_options
