// AMX kernels of vllm-x86 (amx_gemm.cpp). Nothing here depends on an ISA.
#pragma once

#include <cstdint>

namespace vllm_x86 {
namespace amx {

// True when the CPU has AMX-INT8 and AVX-512BW and Linux granted this process the tile
// state; the first call asks for it.
bool init();

// Rows [r_begin, r_end) of bf16 x (row stride ldx, k a multiple of 16) as 16-bit
// integers a = round(x / xscale[r]), xscale[r] = amax(|x[r]|) / 32767, split as
// a = 256 * hi + lo (hi signed, lo unsigned), written to hi/lo rows of length k.
void split_rows(const uint16_t* x, int64_t ldx, int64_t k, int64_t r_begin, int64_t r_end,
                int8_t* hi, uint8_t* lo, float* xscale);

// out[r, n] = bf16((256 * hi[r] . q[n] + lo[r] . q[n]) * xscale[r] * wscale[n] + bias[n])
// for rows r < m and the output channels of 16-channel blocks [nb_begin, nb_end).
// hi/lo: m_pad rows of k bytes (m_pad: m rounded up to 16, zero rows past m); k: a
// multiple of 64; w: the packed int8 weight (layout in amx_gemm.cpp); bias may be null;
// out: bf16 rows with stride ldo.
void int8_w8a16_gemm(const int8_t* hi, const uint8_t* lo, const float* xscale, int64_t m_pad,
                     int64_t m, int64_t k, const int8_t* w, const float* wscale,
                     const float* bias, uint16_t* out, int64_t ldo, int64_t nb_begin,
                     int64_t nb_end);

}  // namespace amx
}  // namespace vllm_x86
