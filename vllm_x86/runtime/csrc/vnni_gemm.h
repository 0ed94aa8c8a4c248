// AVX-512 VNNI versions of the AMX W8A16/W4A16 GEMMs (vnni_gemm.cpp): same arguments,
// same packed weights, bit-identical output. Nothing here depends on an ISA.
#pragma once

#include <cstdint>

namespace vllm_x86 {
namespace vnni {

// Callers make sure the CPU has AVX-512 F/BW/VL/DQ and VNNI (ops.cpp runs these only
// when vllm_x86/runtime/hardware.py's answer, passed to it, says "avx512_vnni").

// As amx::int8_w8a16_gemm (amx_gemm.h): a is amx::split_rows' output (rows 2t: hi,
// 2t + 1: lo, k bytes each; only the first 2 m rows are read), output channel blocks
// [nb_begin, nb_end) of 16.
void int8_w8a16_gemm(const int8_t* a, const float* xscale, int64_t m, int64_t k, const int8_t* w,
                     const float* wscale, const float* bias, uint16_t* out, int64_t ldo,
                     int64_t nb_begin, int64_t nb_end);

// As amx::int4_w4a16_gemm; keeps its own per-thread buffer for prefill (m >= VX_EXPAND_ROWS, 16).
void int4_w4a16_gemm(const int8_t* a, const float* xscale, int64_t m, int64_t k, int64_t group,
                     const uint8_t* w, const float* wscale, const uint8_t* wzero,
                     const float* bias, uint16_t* out, int64_t ldo, int64_t nb_begin,
                     int64_t nb_end);

// 8-bit activations (A8) with a scale per token and group of 64 inputs: bf16 rows
// [r_begin, r_end) of x (row stride ldx) -> int8 rows of a [m, k], scales [m, k / 64]
// and sums per 32 inputs [m, k / 32]. Not bit-identical to the 16-bit kernels (the
// activations are rounded to 8 bits); the float32 reference of the same rounding is
// ops/reference.py's a8_activations.
void quant_rows_a8(const uint16_t* x, int64_t ldx, int64_t k, int64_t r_begin, int64_t r_end,
                   int8_t* a, float* ascale, int32_t* asum);

// The W8A16/W4A16 GEMMs above with quant_rows_a8's activations: one vpdpbusd per 4
// inputs instead of two, for batches (from about 8 rows the 16-bit kernels are
// compute-bound on this ISA).
void int8_w8a8_gemm(const int8_t* a, const float* ascale, const int32_t* asum, int64_t m,
                    int64_t k, const int8_t* w, const float* wscale, const float* bias,
                    uint16_t* out, int64_t ldo, int64_t nb_begin, int64_t nb_end);
void int4_w4a8_gemm(const int8_t* a, const float* ascale, const int32_t* asum, int64_t m,
                    int64_t k, int64_t group, const uint8_t* w, const float* wscale,
                    const uint8_t* wzero, const float* bias, uint16_t* out, int64_t ldo,
                    int64_t nb_begin, int64_t nb_end);

}  // namespace vnni
}  // namespace vllm_x86
