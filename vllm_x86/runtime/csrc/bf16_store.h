// float32 -> bf16 rows for the AVX-512 GEMM kernels (amx_gemm.cpp, vnni_gemm.cpp).
// Include it inside a region compiled for AVX-512 (#pragma GCC target).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace vllm_x86 {

// float32 -> bf16, round to nearest even (NaN kept quiet), 16 values
static inline void store_bf16_row(uint16_t* dst, __m512 v) {
  __m512i u = _mm512_castps_si512(v);
  __m512i rnd = _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                 _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  __m512i r16 = _mm512_srli_epi32(_mm512_add_epi32(u, rnd), 16);
  r16 = _mm512_mask_or_epi32(r16, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi32_epi16(r16));
}

}  // namespace vllm_x86
