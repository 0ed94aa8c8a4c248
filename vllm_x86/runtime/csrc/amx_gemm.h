// AMX kernels of vllm-x86 (amx_gemm.cpp). Nothing here depends on an ISA.
#pragma once

#include <cstdint>

namespace vllm_x86 {
namespace amx {

// Callers make sure the CPU has AMX-INT8 and AVX-512 and that Linux granted this
// process the tile state (vllm_x86/runtime/hardware.py asks; ops.cpp is told "amx").

// Rows [r_begin, r_end) of bf16 x (row stride ldx, k a multiple of 16) as 16-bit
// integers q = round(x / xscale[r]), xscale[r] = amax(|x[r]|) / 32639, split as
// q = 256 * hi + lo with both bytes signed: row 2r of `a` gets hi, row 2r + 1 gets lo
// (rows of k bytes).
void split_rows(const uint16_t* x, int64_t ldx, int64_t k, int64_t r_begin, int64_t r_end,
                int8_t* a, float* xscale);

// out[r, n] = bf16((256 * hi[r] . q[n] + lo[r] . q[n]) * xscale[r] * wscale[n] + bias[n])
// for tokens r < m and the output channels of 16-channel blocks [nb_begin, nb_end).
// a: split_rows' output, a_rows rows (2 m rounded up to 16, zero rows past 2 m); k: a
// multiple of 64; w: the packed int8 weight (layout in amx_gemm.cpp); bias may be null;
// out: bf16 rows with stride ldo.
void int8_w8a16_gemm(const int8_t* a, const float* xscale, int64_t a_rows, int64_t m,
                     int64_t k, const int8_t* w, const float* wscale, const float* bias,
                     uint16_t* out, int64_t ldo, int64_t nb_begin, int64_t nb_end);

// The same with INT4 weights: groups of `group` inputs (32, 64 or 128), a float32 scale
// and a zero-point code per group and channel (groups of 32: in eighths of a step, the
// scale a step / 8); w, wscale, wzero packed as in amx_gemm.cpp.
// scratch: 4 * k * 16 bytes, 64-byte aligned, per thread (used when m > 16), or null.
void int4_w4a16_gemm(const int8_t* a, const float* xscale, int64_t a_rows, int64_t m,
                     int64_t k, int64_t group, const uint8_t* w, const float* wscale,
                     const uint8_t* wzero, const float* bias, uint16_t* out, int64_t ldo,
                     int64_t nb_begin, int64_t nb_end, int8_t* scratch);

}  // namespace amx
}  // namespace vllm_x86
