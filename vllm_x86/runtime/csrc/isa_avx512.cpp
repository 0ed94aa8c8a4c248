// The kernels of vllm-x86 compiled for avx512. All headers come before the pragma, so
// only the code of kernels_impl.h (internal linkage) is built for this ISA.
// (C++ does not see the ISA macros a target pragma implies, hence the VX_* macros.)
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

namespace vllm_x86 {
namespace avx512 {
#define VX_AVX512 1
#define VX_ISA_NAME "avx512"
#include "kernels_impl.h"
#undef VX_ISA_NAME
}  // namespace avx512
}  // namespace vllm_x86

#pragma GCC pop_options
