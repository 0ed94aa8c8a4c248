// The kernels of vllm-x86 compiled for avx2. All headers come before the pragma, so
// only the code of kernels_impl.h (internal linkage) is built for this ISA.
// (C++ does not see the ISA macros a target pragma implies, hence the VX_* macros.)
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace vllm_x86 {
namespace avx2 {
#define VX_ISA_NAME "avx2"
#include "kernels_impl.h"
#undef VX_ISA_NAME
}  // namespace avx2
}  // namespace vllm_x86

#pragma GCC pop_options
