// The W8A16 and W4A16 GEMMs of amx_gemm.cpp for CPUs with AVX-512 VNNI and no AMX
// (AMD Zen 4 and later, Intel Ice Lake / Cascade Lake): same packed weights, same
// activation split (split_rows: 16-bit integers as a signed hi and lo byte per input),
// same int32 sums and the same float32 epilogue in the same order, so the output is
// bit-identical to the AMX kernel's.
//
// The packed block row [16 channels][4 inputs] (64 bytes) is one zmm in the order
// vpdpbusd wants: lane n gets the dot product of its channel's 4 weights with 4 inputs
// broadcast to every lane. vpdpbusd multiplies UNSIGNED bytes by signed bytes, so the
// weights go in as unsigned and the activations as signed:
//   INT8: w + 128 (w xor 0x80): sum a (w + 128) = sum a w + 128 sum a
//   INT4: the code c (0..15):   sum a c = sum a (c - z) + z sum a
// and the per-token sums of a (one per group of inputs) take the extra term back out.
// Every sum is exact in int32 (|a| <= 128, weights <= 255, K < 2^16), so the corrected
// sums equal AMX's tdpbssd sums exactly.
//
// A step takes up to 4 blocks of 16 channels (the caller's unit of work) and 2 tokens:
// 2 accumulators (hi, lo) per token and block, 16 zmm. A single token (decode of one
// request, or the last of an odd count) goes one block at a time, so the weights stream
// in memory order (one token, 4 blocks side by side read 20 GB/s on one core; block by
// block 30-35). With more than 2 tokens (prefill), INT4 blocks are first expanded to
// bytes once into a per-thread buffer and every pair of tokens reads them there (L2).
#include <immintrin.h>

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
  const int64_t g_n = k / group;
  for (int64_t t = 0; t < m; ++t)
    for (int h = 0; h < 2; ++h) {
      const int8_t* row = a + (2 * t + h) * k;
      for (int64_t g = 0; g < g_n; ++g) {
        __m512i acc = _mm512_setzero_si512();
        for (int64_t c = g * group; c < (g + 1) * group; c += 64)
          acc = _mm512_dpbusd_epi32(acc, ones, _mm512_loadu_si512(row + c));
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
// block j; `stride`: bytes from one input block to the next.
template <int S, int NJ, int T>
inline void dot(const uint8_t* const* blk, int64_t stride, int64_t nkb, const int8_t* const* hi,
                int64_t koff, __m512i* out, int64_t k) {
  __m512i acc[T * NJ * 2];
  for (int i = 0; i < T * NJ * 2; ++i) acc[i] = _mm512_setzero_si512();
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
              c = _mm512_dpbusd_epi32(c, w1, x1[t][h]);
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
              __m512i& c = acc[(t * NJ + j) * 2 + h];
              c = _mm512_dpbusd_epi32(c, w, x[t][h]);
            }
        }
      }
    }
  }
  for (int i = 0; i < T * NJ * 2; ++i) out[i] = acc[i];
}

// One token and one channel block at a time: the weights are read in memory order (one
// stream), with the hi and lo sums split over even and odd rows (4 independent chains).
template <int S>
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
    } else {
      for (int r = 0; r < 16; r += 2) {
        __m512i w0 = _mm512_loadu_si512(b0 + 64 * r);
        __m512i w1 = _mm512_loadu_si512(b0 + 64 * (r + 1));
        if (S == kRaw8) {
          w0 = _mm512_xor_si512(w0, flip);
          w1 = _mm512_xor_si512(w1, flip);
        }
        h0 = _mm512_dpbusd_epi32(h0, w0, bcast4(hi + c0 + 4 * r));
        l0 = _mm512_dpbusd_epi32(l0, w0, bcast4(lo + c0 + 4 * r));
        h1 = _mm512_dpbusd_epi32(h1, w1, bcast4(hi + c0 + 4 * (r + 1)));
        l1 = _mm512_dpbusd_epi32(l1, w1, bcast4(lo + c0 + 4 * (r + 1)));
      }
    }
  }
  out[0] = _mm512_add_epi32(h0, h1);
  out[1] = _mm512_add_epi32(l0, l1);
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

template <bool kInt4>
void gemm(const int8_t* a, const float* xscale, int64_t m, int64_t k, int64_t group,
          const void* w, const float* wscale, const uint8_t* wzero, const float* bias,
          uint16_t* out, int64_t ldo, int64_t nb_begin, int64_t nb_end) {
  const int64_t kb_n = k / 64, g_n = k / group, kb_per_g = group / 64;
  constexpr int64_t kBlock = kInt4 ? 512 : 1024;
  const auto* wb = static_cast<const uint8_t*>(w);
  const bool expand = kInt4 && m > 2;
  thread_local std::vector<int32_t> sums_buf;
  thread_local std::vector<uint8_t> bytes_buf;
  if (sums_buf.size() < static_cast<size_t>(m * g_n * 2)) sums_buf.resize(m * g_n * 2);
  int32_t* sums = sums_buf.data();
  group_sums(a, m, k, group, sums);
  uint8_t* bytes = nullptr;
  if (expand) {
    const size_t need = static_cast<size_t>(4 * kb_n * 1024 + 64);
    if (bytes_buf.size() < need) bytes_buf.resize(need);
    auto addr = reinterpret_cast<uintptr_t>(bytes_buf.data());
    bytes = reinterpret_cast<uint8_t*>((addr + 63) & ~static_cast<uintptr_t>(63));
  }
  const __m512 k256 = _mm512_set1_ps(256.f);
  const __m512i k128 = _mm512_set1_epi32(128);
  alignas(64) float facc[2][4][16];
  __m512i acc[2 * 4 * 2];
  for (int64_t nb0 = nb_begin; nb0 < nb_end; nb0 += 4) {
    const int nj = static_cast<int>(nb_end - nb0 < 4 ? nb_end - nb0 : 4);
    const uint8_t* blk0[4];
    for (int j = 0; j < nj; ++j) {
      if (expand) {
        for (int64_t kb = 0; kb < kb_n; ++kb)
          expand_int4_block(wb + ((nb0 + j) * kb_n + kb) * kBlock, bytes + (j * kb_n + kb) * 1024);
        blk0[j] = bytes + j * kb_n * 1024;
      } else {
        blk0[j] = wb + (nb0 + j) * kb_n * kBlock;
      }
    }
    const int64_t stride = expand ? 1024 : kBlock;
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
          h = _mm512_sub_epi32(h, _mm512_mullo_epi32(z, _mm512_set1_epi32(st[0])));
          l = _mm512_sub_epi32(l, _mm512_mullo_epi32(z, _mm512_set1_epi32(st[1])));
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
      if (nt == 1) {
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

bool init() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                         __builtin_cpu_supports("avx512vnni");
  return ok;
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
