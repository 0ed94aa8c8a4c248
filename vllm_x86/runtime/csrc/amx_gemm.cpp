// INT8- and INT4-weight GEMMs on AMX-INT8 with 16-bit activations (W8A16, W4A16):
//   out = x @ W^T (+ bias), x bf16 [M, K], W the dequantized weight [N, K].
//
// Weights stay int8 (or int4) in memory and go into the tile multiply as bytes, with no
// widening to bf16. Each activation row is rounded to 16-bit integers with its own scale
// (amax / 32639: 256 times finer than the 8-bit activations of W8A8, and finer than
// bf16's 8-bit significand for every value above amax / 128) and split into two signed
// bytes, a = 256 * hi + lo with lo in [-128, 127]. The two bytes of a token are two rows
// of the A tile (row 2t: hi, row 2t + 1: lo), so one tdpbssd gives both partial sums
// of 8 tokens; the epilogue forms (256 * sum_hi + sum_lo) * xscale * scale + bias in
// float32. The int32 sums are exact.
//
// INT8 layout ("vllm-x86-int8-w8a16-amx-1", pack_int8_w8a16 in vllm_x86/runtime/quant/methods.py):
// blocks of 16 output channels x 64 input channels, 1 KiB each, ordered [N/16][K/64];
// inside a block, row r (0..15) holds for output channel n (0..15) the four inputs
// k = 4r..4r+3: [r][n][4]. That is AMX's VNNI order for the B tile, so a block is loaded
// as it is stored. One float32 scale per channel.
//
// INT4 layout ("vllm-x86-int4-w4a16-amx-1", pack_int4_w4a16): the same blocks in 512
// bytes, byte b of 64-byte vector v (0..7) holding B-tile row v in its low nibble and
// row v + 8 in its high one. Codes minus the channel's zero point (-15..15) go into the
// tile product as int8; each group of 64 or 128 inputs accumulates in int32 on its own
// and is added to float32 accumulators times its scale. Scales (float32) and zero-point
// codes (uint8) are [N/16][K/group][16]. Groups of 32 (a block's low nibbles are one
// group, its high nibbles the next) hold zero points in eighths of a step: the tile
// product takes 8 c - z (-120..120) and the packed scale is the step / 8, so a zero
// point between two codes (as a GGUF Q4_1 or Q4_K block has) is kept to 1/16 step.
//
// GCC before 13.2 miscompiles its AMX intrinsics (the tile-config load covers only 8
// of its 64 bytes, tile loads have no memory clobber), so every AMX instruction here is
// inline assembly with a full 64-byte config operand and memory clobbers.
//
// Whether this code may run (AMX-INT8 and Linux's permission to use the tiles) is
// vllm_x86/runtime/hardware.py's answer, which also asks Linux for the tile state;
// ops.cpp calls in here only when told "amx".
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "amx_gemm.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

#include "bf16_store.h"

namespace vllm_x86 {
namespace amx {

namespace {

struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64, "tile config is 64 bytes");

// Every tile used is 16 rows x 64 bytes: C tiles 16x16 int32 (tmm0-3), A tiles 16 rows
// (8 tokens x hi/lo) x 64 inputs (tmm4, tmm6), B tiles 16 quads x 16 channels (tmm5, tmm7).
const TileConfig kConfig = [] {
  TileConfig c;
  std::memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  return c;
}();
// INT4 groups of 32: each product covers half a block, 32 inputs: A tiles 16 rows x 32
// bytes, B tiles 8 quads (the block's low or high nibbles) x 16 channels.
const TileConfig kConfig32 = [] {
  TileConfig c = kConfig;
  c.colsb[4] = c.colsb[6] = 32;
  c.rows[5] = c.rows[7] = 8;
  return c;
}();

constexpr int64_t kPrefetch = 16;  // weight blocks fetched ahead of the one multiplied
constexpr float kAmax = 32639.f;   // largest |a| whose hi byte (a + 128) >> 8 fits int8

inline void tile_config(bool half) {
  if (half)
    asm volatile("ldtilecfg %0" ::"m"(kConfig32) : "memory");
  else
    asm volatile("ldtilecfg %0" ::"m"(kConfig) : "memory");
}
inline void tile_release() { asm volatile("tilerelease" ::: "memory"); }

#define VX_TZERO(t) asm volatile("tilezero %%tmm" #t ::: "memory")
#define VX_TLOAD(t, p, s) \
  asm volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(p), "r"((int64_t)(s)) : "memory")
#define VX_TSTORE(t, p, s) \
  asm volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(p), "r"((int64_t)(s)) : "memory")
// c += a . b, signed bytes
#define VX_TDP(c, a, b) asm volatile("tdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")

// Tile numbers must be immediates, hence the small switches.
inline void tzero4() {
  VX_TZERO(0);
  VX_TZERO(1);
  VX_TZERO(2);
  VX_TZERO(3);
}
inline void tstore(int c, void* p) {
  switch (c) {
    case 0: VX_TSTORE(0, p, 64); break;
    case 1: VX_TSTORE(1, p, 64); break;
    case 2: VX_TSTORE(2, p, 64); break;
    default: VX_TSTORE(3, p, 64); break;
  }
}
// A tile i -> tmm4 (even) / tmm6 (odd); B tile j -> tmm5 (even) / tmm7 (odd)
inline void tload_a(int i, const void* p, int64_t s) {
  if (i & 1) VX_TLOAD(6, p, s); else VX_TLOAD(4, p, s);
}
inline void tload_b(int j, const void* p) {
  if (j & 1) VX_TLOAD(7, p, 64); else VX_TLOAD(5, p, 64);
}
inline void tdp(int c, int i, int j) {
  switch (c * 4 + (i & 1) * 2 + (j & 1)) {
    case 0: VX_TDP(0, 4, 5); break;
    case 1: VX_TDP(0, 4, 7); break;
    case 2: VX_TDP(0, 6, 5); break;
    case 3: VX_TDP(0, 6, 7); break;
    case 4: VX_TDP(1, 4, 5); break;
    case 5: VX_TDP(1, 4, 7); break;
    case 6: VX_TDP(1, 6, 5); break;
    case 7: VX_TDP(1, 6, 7); break;
    case 8: VX_TDP(2, 4, 5); break;
    case 9: VX_TDP(2, 4, 7); break;
    case 10: VX_TDP(2, 6, 5); break;
    case 11: VX_TDP(2, 6, 7); break;
    case 12: VX_TDP(3, 4, 5); break;
    case 13: VX_TDP(3, 4, 7); break;
    case 14: VX_TDP(3, 6, 5); break;
    default: VX_TDP(3, 6, 7); break;
  }
}

inline void prefetch(const void* p, int bytes) {
  for (int l = 0; l < bytes; l += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p) + l, _MM_HINT_T0);
}

// INT4 codes of one block, times 2^shift, minus their channels' zero points -> the
// block's int8 B tile. Rows 0-7 (low nibbles: inputs 0-31) take z_lo, rows 8-15 (high
// nibbles: inputs 32-63) z_hi: the same zero points, or with groups of 32 two groups'
// (shift 3: zero points in eighths of a step, 8 c - z in -120..120).
inline void expand_int4_block(const uint8_t* src, __m512i z_lo, __m512i z_hi, int shift,
                              int8_t* dst) {
  const __m512i mask = _mm512_set1_epi8(0x0f);
  const __m128i sh = _mm_cvtsi32_si128(shift);
  for (int v = 0; v < 8; ++v) {
    __m512i b = _mm512_loadu_si512(src + 64 * v);
    // a nibble shifted by up to 3 stays inside its byte
    __m512i lo = _mm512_sub_epi8(_mm512_sll_epi16(_mm512_and_si512(b, mask), sh), z_lo);
    __m512i hi = _mm512_sub_epi8(
        _mm512_sll_epi16(_mm512_and_si512(_mm512_srli_epi16(b, 4), mask), sh), z_hi);
    _mm512_store_si512(dst + 64 * v, lo);
    _mm512_store_si512(dst + 64 * (v + 8), hi);
  }
}

// 16 zero-point codes, one per channel -> each repeated in the 4 bytes of its lane
inline __m512i lane_zeros(const uint8_t* z) {
  __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(z)));
  return _mm512_mullo_epi32(d, _mm512_set1_epi32(0x01010101));
}

// The shared loop. A step covers up to 4 output tiles: 1 A tile x 4 weight blocks when
// one A tile holds every token (decode, up to 8 tokens), else 2 x 2. Sums of each group
// of `group` inputs (all of K for INT8) are scaled into float32 accumulators.
// INT4 with more than one step of rows (prefill) expands each weight block once into
// `scratch` (4 * k * 16 bytes) instead of once per step. INT4 groups of 32 multiply
// half blocks (kConfig32): a block's low nibbles are one group, its high nibbles the next.
template <bool kInt4>
void gemm(const int8_t* a, const float* xscale, int64_t a_rows, int64_t m, int64_t k,
          int64_t group, const void* w, const float* wscale, const uint8_t* wzero,
          const float* bias, uint16_t* out, int64_t ldo, int64_t nb_begin, int64_t nb_end,
          int8_t* scratch) {
  const int64_t mt_all = a_rows / 16;
  const int nt = mt_all == 1 ? 4 : 2;
  const int mt_step = 4 / nt;
  const bool half = kInt4 && group == 32;
  const int shift = half ? 3 : 0;
  const int64_t sub = half ? 32 : 64;  // inputs per tile product
  const int64_t kb_n = k / 64, g_n = k / group, sb_per_g = group / sub;
  constexpr int64_t kBlock = kInt4 ? 512 : 1024;  // bytes of weights per block
  const auto* wb = static_cast<const uint8_t*>(w);
  alignas(64) int32_t cbuf[16 * 16];
  alignas(64) int8_t bbuf[4][1024];
  alignas(64) float facc[4][8 * 16];  // per output tile: 8 tokens x 16 channels
  const __m512 k256 = _mm512_set1_ps(256.f);
  // the zero points of block kb's low and high nibbles, channel block jb
  auto block_zeros = [&](int64_t jb, int64_t kb, __m512i* zl, __m512i* zh) {
    const int64_t g0 = half ? 2 * kb : kb * 64 / group;
    *zl = lane_zeros(wzero + (jb * g_n + g0) * 16);
    *zh = half ? lane_zeros(wzero + (jb * g_n + g0 + 1) * 16) : *zl;
  };
  tile_config(half);
  for (int64_t nb0 = nb_begin; nb0 < nb_end; nb0 += nt) {
    const int nj = static_cast<int>(nb_end - nb0 < nt ? nb_end - nb0 : nt);
    const bool expanded = kInt4 && scratch != nullptr && mt_all > mt_step;
    if (expanded)
      for (int j = 0; j < nj; ++j)
        for (int64_t kb = 0; kb < kb_n; ++kb) {
          __m512i zl, zh;
          block_zeros(nb0 + j, kb, &zl, &zh);
          expand_int4_block(wb + ((nb0 + j) * kb_n + kb) * kBlock, zl, zh, shift,
                            scratch + (j * kb_n + kb) * 1024);
        }
    for (int64_t mt0 = 0; mt0 < mt_all; mt0 += mt_step) {
      const int mi_n = static_cast<int>(mt_all - mt0 < mt_step ? mt_all - mt0 : mt_step);
      std::memset(facc, 0, sizeof facc);
      const uint8_t* blk[4];  // block kb of each channel block (a group of 32 uses half)
      for (int64_t g = 0; g < g_n; ++g) {
        tzero4();
        for (int64_t sb = g * sb_per_g; sb < (g + 1) * sb_per_g; ++sb) {
          const int64_t kb = sb * sub / 64;
          const int hb = half ? static_cast<int>(sb & 1) : 0;
          if (hb == 0)
            for (int j = 0; j < nj; ++j) {
              if (expanded) {
                blk[j] = reinterpret_cast<const uint8_t*>(scratch + (j * kb_n + kb) * 1024);
                continue;
              }
              blk[j] = wb + ((nb0 + j) * kb_n + kb) * kBlock;
              // the weights stream from memory once: fetch a few blocks ahead
              if (mt0 == 0 && kb + kPrefetch < kb_n) prefetch(blk[j] + kPrefetch * kBlock, kBlock);
              if (kInt4) {
                __m512i zl, zh;
                block_zeros(nb0 + j, kb, &zl, &zh);
                expand_int4_block(blk[j], zl, zh, shift, bbuf[j]);
                blk[j] = reinterpret_cast<const uint8_t*>(bbuf[j]);
              }
            }
          for (int i = 0; i < mi_n; ++i) {
            tload_a(i, a + (mt0 + i) * 16 * k + sb * sub, k);
            for (int j = 0; j < nj; ++j) {
              if (i == 0) tload_b(j, blk[j] + hb * 512);  // 2x2: B tiles stay loaded for i = 1
              tdp(i * nj + j, i, j);
            }
          }
        }
        // this group's sums (rows 2t: hi, 2t + 1: lo) times its scales
        for (int i = 0; i < mi_n; ++i) {
          const int64_t tok0 = (mt0 + i) * 8;
          if (tok0 >= m) break;
          const int toks = static_cast<int>(m - tok0 < 8 ? m - tok0 : 8);
          for (int j = 0; j < nj; ++j) {
            tstore(i * nj + j, cbuf);
            const float* sp = kInt4 ? wscale + ((nb0 + j) * g_n + g) * 16 : wscale + (nb0 + j) * 16;
            const __m512 s = _mm512_loadu_ps(sp);
            float* f = facc[i * nj + j];
            for (int t = 0; t < toks; ++t) {
              __m512 h = _mm512_cvtepi32_ps(_mm512_load_si512(cbuf + 32 * t));
              __m512 l = _mm512_cvtepi32_ps(_mm512_load_si512(cbuf + 32 * t + 16));
              __m512 v = _mm512_mul_ps(_mm512_add_ps(_mm512_mul_ps(h, k256), l), s);
              _mm512_store_ps(f + 16 * t, _mm512_add_ps(_mm512_load_ps(f + 16 * t), v));
            }
          }
        }
      }
      for (int i = 0; i < mi_n; ++i) {
        const int64_t tok0 = (mt0 + i) * 8;
        if (tok0 >= m) break;
        const int toks = static_cast<int>(m - tok0 < 8 ? m - tok0 : 8);
        for (int j = 0; j < nj; ++j) {
          const int64_t n0 = (nb0 + j) * 16;
          const __m512 b = bias ? _mm512_loadu_ps(bias + n0) : _mm512_setzero_ps();
          const float* f = facc[i * nj + j];
          for (int t = 0; t < toks; ++t) {
            __m512 v = _mm512_mul_ps(_mm512_load_ps(f + 16 * t), _mm512_set1_ps(xscale[tok0 + t]));
            store_bf16_row(out + (tok0 + t) * ldo + n0, _mm512_add_ps(v, b));
          }
        }
      }
    }
  }
  tile_release();
}

}  // namespace

void split_rows(const uint16_t* x, int64_t ldx, int64_t k, int64_t r_begin, int64_t r_end,
                int8_t* a, float* xscale) {
  for (int64_t r = r_begin; r < r_end; ++r) {
    const uint16_t* xr = x + r * ldx;
    __m512 amax = _mm512_setzero_ps();
    __mmask16 nan = 0;
    for (int64_t c = 0; c < k; c += 16) {
      __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + c));
      __m512 f = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
      amax = _mm512_max_ps(amax, _mm512_abs_ps(f));
      nan |= _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    }
    const float m = nan ? NAN : _mm512_reduce_max_ps(amax);  // max_ps drops NaNs
    const float s = m > 0.f && m < INFINITY ? m / kAmax : 1.f;
    // a row holding NaN or infinity gives NaN, as a float matmul would
    xscale[r] = m < INFINITY ? s : NAN;
    const __m512 inv = _mm512_set1_ps(1.f / s);
    const __m512 lim = _mm512_set1_ps(kAmax);
    int8_t* hi = a + 2 * r * k;
    int8_t* lo = hi + k;
    for (int64_t c = 0; c < k; c += 16) {
      __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + c));
      __m512 f = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
      f = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(f, inv), -lim), lim);
      __m512i q = _mm512_cvtps_epi32(f);  // round to nearest even
      __m512i h = _mm512_srai_epi32(_mm512_add_epi32(q, _mm512_set1_epi32(128)), 8);
      __m512i l = _mm512_sub_epi32(q, _mm512_slli_epi32(h, 8));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(hi + c), _mm512_cvtepi32_epi8(h));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + c), _mm512_cvtepi32_epi8(l));
    }
  }
}

void int8_w8a16_gemm(const int8_t* a, const float* xscale, int64_t a_rows, int64_t m,
                     int64_t k, const int8_t* w, const float* wscale, const float* bias,
                     uint16_t* out, int64_t ldo, int64_t nb_begin, int64_t nb_end) {
  gemm<false>(a, xscale, a_rows, m, k, k, w, wscale, nullptr, bias, out, ldo, nb_begin, nb_end,
              nullptr);
}

void int4_w4a16_gemm(const int8_t* a, const float* xscale, int64_t a_rows, int64_t m,
                     int64_t k, int64_t group, const uint8_t* w, const float* wscale,
                     const uint8_t* wzero, const float* bias, uint16_t* out, int64_t ldo,
                     int64_t nb_begin, int64_t nb_end, int8_t* scratch) {
  gemm<true>(a, xscale, a_rows, m, k, group, w, wscale, wzero, bias, out, ldo, nb_begin,
             nb_end, scratch);
}

}  // namespace amx
}  // namespace vllm_x86

#pragma GCC pop_options
