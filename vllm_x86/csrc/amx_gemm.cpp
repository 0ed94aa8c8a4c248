// INT8-weight GEMM on AMX-INT8 with 16-bit activations (W8A16):
//   out = x @ (q * wscale)^T (+ bias), x bf16 [M, K], q int8 [N, K].
//
// Weights stay int8 in memory (half the bytes of bf16) and go into the tile multiply as
// they are, with no widening. Each activation row is rounded to a 16-bit integer with
// its own scale (amax / 32767: 256 times finer than the 8-bit activations of W8A8, and
// finer than bf16's 8-bit significand for every value above amax / 128) and split into
// a signed high byte and an unsigned low byte, a = 256 * hi + lo. Two AMX-INT8 tile
// products per block (tdpbssd for hi, tdpbusd for lo) accumulate exact int32 sums;
// the epilogue forms (256 * sum_hi + sum_lo) * xscale[m] * wscale[n] + bias[n] in float32.
//
// Packed weight layout ("vllm-x86-int8-w8a16-amx-1"), built by pack_int8_w8a16 in
// vllm_x86/quant/methods.py: blocks of 16 output channels x 64 input channels, 1 KiB
// each, ordered [N/16][K/64]; inside a block, row r (0..15) holds for output channel n
// (0..15) the four inputs k = 4r..4r+3: [r][n][4]. That is AMX's VNNI order for the B
// tile, so a block is loaded as it is stored.
//
// GCC before 13.2 miscompiles its AMX intrinsics (the tile-config load covers only 8
// of its 64 bytes, tile loads have no memory clobber), so every AMX instruction here is
// inline assembly with a full 64-byte config operand and memory clobbers.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "amx_gemm.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

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
// x 64 bytes of activations (tmm4, tmm6), B tiles 16 quads x 16 channels (tmm5, tmm7).
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

inline void tile_config() {
  asm volatile("ldtilecfg %0" ::"m"(kConfig) : "memory");
}
inline void tile_release() { asm volatile("tilerelease" ::: "memory"); }

#define VX_TZERO(t) asm volatile("tilezero %%tmm" #t ::: "memory")
#define VX_TLOAD(t, p, s) \
  asm volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(p), "r"((int64_t)(s)) : "memory")
#define VX_TSTORE(t, p, s) \
  asm volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(p), "r"((int64_t)(s)) : "memory")
// c += a (signed bytes) . b (signed bytes);  c += a (unsigned bytes) . b (signed bytes)
#define VX_SS(c, a, b) asm volatile("tdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")
#define VX_US(c, a, b) asm volatile("tdpbusd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")

// Tiles: C (int32 16x16) tmm0-3 as pairs (hi, lo) for up to two output tiles; A: the
// high bytes of 16 activation rows in tmm4, the low bytes in tmm6; B: weight blocks in
// tmm5 and tmm7. Tile numbers must be immediates, hence the small switches.
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
inline void tload_b(int j, const void* p) {
  if (j & 1) VX_TLOAD(7, p, 64); else VX_TLOAD(5, p, 64);
}
// output tile t (0 or 1) with B tile j: hi into C 2t, lo into C 2t+1
inline void tdp_pair(int t, int j) {
  switch (t * 2 + (j & 1)) {
    case 0: VX_SS(0, 4, 5); VX_US(1, 6, 5); break;
    case 1: VX_SS(0, 4, 7); VX_US(1, 6, 7); break;
    case 2: VX_SS(2, 4, 5); VX_US(3, 6, 5); break;
    default: VX_SS(2, 4, 7); VX_US(3, 6, 7); break;
  }
}

}  // namespace

bool init() {
  static bool ok = [] {
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-int8") ||
        !__builtin_cpu_supports("avx512bw"))
      return false;
    // Linux hands out the tile state only on request (ARCH_REQ_XCOMP_PERM, XTILEDATA).
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  }();
  return ok;
}

void split_rows(const uint16_t* x, int64_t ldx, int64_t k, int64_t r_begin, int64_t r_end,
                int8_t* hi, uint8_t* lo, float* xscale) {
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
    const float s = m > 0.f && m < INFINITY ? m / 32767.f : 1.f;
    // a row holding NaN or infinity gives NaN, as a float matmul would
    xscale[r] = m < INFINITY ? s : NAN;
    const __m512 inv = _mm512_set1_ps(1.f / s);
    const __m512 lim = _mm512_set1_ps(32767.f);
    for (int64_t c = 0; c < k; c += 16) {
      __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + c));
      __m512 f = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
      f = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(f, inv), -lim), lim);
      __m512i a = _mm512_cvtps_epi32(f);  // round to nearest even
      __m512i h = _mm512_srai_epi32(a, 8);
      __m512i l = _mm512_and_si512(a, _mm512_set1_epi32(255));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(hi + r * k + c), _mm512_cvtepi32_epi8(h));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + r * k + c), _mm512_cvtepi32_epi8(l));
    }
  }
}

void int8_w8a16_gemm(const int8_t* hi, const uint8_t* lo, const float* xscale, int64_t m_pad,
                     int64_t m, int64_t k, const int8_t* w, const float* wscale,
                     const float* bias, uint16_t* out, int64_t ldo, int64_t nb_begin,
                     int64_t nb_end) {
  // One 16-row tile of activations (decode) runs two output tiles side by side (1x2);
  // more rows run two row tiles against one weight block (2x1).
  const int64_t mt_all = m_pad / 16;
  const int nt = mt_all == 1 ? 2 : 1;
  const int mt_step = 2 / nt;
  const int64_t kb_n = k / 64;
  constexpr int64_t kPrefetch = 16;
  alignas(64) int32_t chi[16 * 16], clo[16 * 16];
  tile_config();
  for (int64_t nb0 = nb_begin; nb0 < nb_end; nb0 += nt) {
    const int nj = static_cast<int>(nb_end - nb0 < nt ? nb_end - nb0 : nt);
    for (int64_t mt0 = 0; mt0 < mt_all; mt0 += mt_step) {
      const int mi_n = static_cast<int>(mt_all - mt0 < mt_step ? mt_all - mt0 : mt_step);
      tzero4();
      for (int64_t kb = 0; kb < kb_n; ++kb) {
        for (int i = 0; i < mi_n; ++i) {
          const int64_t off = (mt0 + i) * 16 * k + kb * 64;
          VX_TLOAD(4, hi + off, k);
          VX_TLOAD(6, lo + off, k);
          for (int j = 0; j < nj; ++j) {
            if (i == 0) {
              const int8_t* blk = w + ((nb0 + j) * kb_n + kb) * 1024;
              // the weights stream from memory once: fetch a few blocks ahead
              if (kb + kPrefetch < kb_n)
                for (int l = 0; l < 1024; l += 64)
                  _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetch * 1024 + l),
                               _MM_HINT_T0);
              tload_b(j, blk);
            }
            tdp_pair(i + j, j);  // output tile: i (2x1) or j (1x2)
          }
        }
      }
      for (int t = 0; t < mi_n * nj; ++t) {
        const int i = nt == 1 ? t : 0, j = nt == 1 ? 0 : t;
        const int64_t row0 = (mt0 + i) * 16;
        if (row0 >= m) continue;
        const int rows = static_cast<int>(m - row0 < 16 ? m - row0 : 16);
        tstore(2 * t, chi);
        tstore(2 * t + 1, clo);
        const int64_t n0 = (nb0 + j) * 16;
        const __m512 ws = _mm512_loadu_ps(wscale + n0);
        const __m512 b = bias ? _mm512_loadu_ps(bias + n0) : _mm512_setzero_ps();
        const __m512 k256 = _mm512_set1_ps(256.f);
        for (int r = 0; r < rows; ++r) {
          __m512 h = _mm512_cvtepi32_ps(_mm512_load_si512(chi + 16 * r));
          __m512 l = _mm512_cvtepi32_ps(_mm512_load_si512(clo + 16 * r));
          __m512 acc = _mm512_add_ps(_mm512_mul_ps(h, k256), l);
          __m512 v = _mm512_mul_ps(_mm512_mul_ps(acc, _mm512_set1_ps(xscale[row0 + r])), ws);
          v = _mm512_add_ps(v, b);
          // float32 -> bf16, round to nearest even (NaN kept quiet)
          __m512i u = _mm512_castps_si512(v);
          __m512i rnd = _mm512_add_epi32(
              _mm512_set1_epi32(0x7fff),
              _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
          __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
          __m512i r16 = _mm512_srli_epi32(_mm512_add_epi32(u, rnd), 16);
          r16 = _mm512_mask_or_epi32(r16, nan, _mm512_srli_epi32(u, 16),
                                     _mm512_set1_epi32(0x40));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (row0 + r) * ldo + n0),
                              _mm512_cvtepi32_epi16(r16));
        }
      }
    }
  }
  tile_release();
}

}  // namespace amx
}  // namespace vllm_x86

#pragma GCC pop_options
