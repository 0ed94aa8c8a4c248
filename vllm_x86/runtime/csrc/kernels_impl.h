// Kernel bodies of vllm-x86, compiled once per ISA.
//
// Include this file only from an isa_*.cpp file, after every system and torch header
// and after that file's `#pragma GCC target(...)`, inside its ISA namespace: all code
// here then has internal linkage and that ISA, and nothing compiled for AVX-512 can be
// picked by the linker for a machine without it. That file defines VX_AVX512 and
// VX_AVX512BF16 as its ISA allows (C++ does not see the macros a target pragma implies).
//
// Rounding contract (see docs/kernels.md): every op reproduces the rounding points of
// its reference (vLLM's forward_native / vLLM IR native implementation): where the
// reference rounds an intermediate to bf16/fp16, the kernel rounds it too, using
// round-to-nearest-even like torch. The build uses -ffp-contract=off so the compiler
// never fuses a multiply and an add that the reference rounds separately. Differences
// that remain come from the order of additions in reductions (RMSNorm's mean of
// squares) and from exp/erf/tanh approximations (activations), within the tolerances
// the tests document.

namespace {

#if defined(VX_AVX512)
constexpr int W = 16;
using vf = __m512;
inline vf v_set1(float a) { return _mm512_set1_ps(a); }
inline vf v_zero() { return _mm512_setzero_ps(); }
inline vf v_add(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf v_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline vf v_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf v_div(vf a, vf b) { return _mm512_div_ps(a, b); }
inline vf v_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline vf v_max(vf a, vf b) { return _mm512_max_ps(a, b); }
inline vf v_min(vf a, vf b) { return _mm512_min_ps(a, b); }
inline vf v_abs(vf a) { return _mm512_abs_ps(a); }
inline vf v_neg(vf a) {
  return _mm512_castsi512_ps(
      _mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x80000000u)));
}
inline vf v_copysign(vf mag, vf sgn) {
  const __m512i m = _mm512_set1_epi32(0x80000000u);
  return _mm512_castsi512_ps(_mm512_or_si512(
      _mm512_andnot_si512(m, _mm512_castps_si512(mag)),
      _mm512_and_si512(m, _mm512_castps_si512(sgn))));
}
inline float v_hsum(vf a) { return _mm512_reduce_add_ps(a); }
inline vf v_loadf(const float* p) { return _mm512_loadu_ps(p); }
inline void v_storef(float* p, vf v) { _mm512_storeu_ps(p, v); }
inline vf v_load_bf16(const uint16_t* p) {
  __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
// Round to nearest even, as c10::BFloat16 does. Intermediate roundings stay in 32-bit
// lanes (add the rounding bias, clear the low half: ALU ops only); a quiet NaN stays a
// NaN. Stores narrow to 16 bits; without AVX512-BF16 a NaN is stored as torch's 0x7fc0.
inline vf v_round_bf16(vf v) {
  __m512i u = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32(0xffff0000u)));
}
inline void v_store_bf16(uint16_t* p, vf v) {
#if defined(VX_AVX512BF16)
  _mm256_storeu_si256((__m256i*)p, (__m256i)_mm512_cvtneps_pbh(v));
#else
  __m512i r = _mm512_srli_epi32(_mm512_castps_si512(v_round_bf16(v)), 16);
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_blend_epi32(nan, r, _mm512_set1_epi32(0x7fc0));
  _mm256_storeu_si256((__m256i*)p, _mm512_cvtepi32_epi16(r));
#endif
}
inline vf v_load_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
}
inline __m256i v_f16_bits(vf v) {
  return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline void v_store_f16(uint16_t* p, vf v) { _mm256_storeu_si256((__m256i*)p, v_f16_bits(v)); }
inline vf v_round_f16(vf v) { return _mm512_cvtph_ps(v_f16_bits(v)); }
// 2^n for integral-valued n in [-126, 127]
inline vf v_pow2i(vf n) {
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_castsi512_ps(e);
}
inline vf v_roundint(vf a) {
  return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
// bit i set where a[i] >= b[i] (ordered: false for NaN)
inline unsigned v_ge_mask(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
#else  // AVX2 + FMA + F16C
constexpr int W = 8;
using vf = __m256;
inline vf v_set1(float a) { return _mm256_set1_ps(a); }
inline vf v_zero() { return _mm256_setzero_ps(); }
inline vf v_add(vf a, vf b) { return _mm256_add_ps(a, b); }
inline vf v_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
inline vf v_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf v_div(vf a, vf b) { return _mm256_div_ps(a, b); }
inline vf v_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf v_max(vf a, vf b) { return _mm256_max_ps(a, b); }
inline vf v_min(vf a, vf b) { return _mm256_min_ps(a, b); }
inline vf v_abs(vf a) {
  return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}
inline vf v_neg(vf a) { return _mm256_xor_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x80000000u))); }
inline vf v_copysign(vf mag, vf sgn) {
  const vf m = _mm256_castsi256_ps(_mm256_set1_epi32(0x80000000u));
  return _mm256_or_ps(_mm256_andnot_ps(m, mag), _mm256_and_ps(m, sgn));
}
inline float v_hsum(vf a) {
  __m128 lo = _mm256_castps256_ps128(a), hi = _mm256_extractf128_ps(a, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline vf v_loadf(const float* p) { return _mm256_loadu_ps(p); }
inline void v_storef(float* p, vf v) { _mm256_storeu_ps(p, v); }
inline vf v_load_bf16(const uint16_t* p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline vf v_round_bf16(vf v) {
  __m256i u = _mm256_castps_si256(v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  u = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  return _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32(0xffff0000u)));
}
inline void v_store_bf16(uint16_t* p, vf v) {
  __m256i r = _mm256_srli_epi32(_mm256_castps_si256(v_round_bf16(v)), 16);
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
  __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128((__m128i*)p, packed);
}
inline vf v_load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
inline __m128i v_f16_bits(vf v) {
  return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline void v_store_f16(uint16_t* p, vf v) { _mm_storeu_si128((__m128i*)p, v_f16_bits(v)); }
inline vf v_round_f16(vf v) { return _mm256_cvtph_ps(v_f16_bits(v)); }
inline vf v_pow2i(vf n) {
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_castsi256_ps(e);
}
inline vf v_roundint(vf a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline unsigned v_ge_mask(vf a, vf b) {
  return static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GE_OQ)));
}
#endif

// ---------------------------------------------------------------- element types
struct F32 {
  using T = float;
  static inline vf load(const T* p) { return v_loadf(p); }
  static inline void store(T* p, vf v) { v_storef(p, v); }
  static inline vf round(vf v) { return v; }
};
struct BF16 {
  using T = uint16_t;
  static inline vf load(const T* p) { return v_load_bf16(p); }
  static inline void store(T* p, vf v) { v_store_bf16(p, v); }
  static inline vf round(vf v) { return v_round_bf16(v); }
};
struct F16 {
  using T = uint16_t;
  static inline vf load(const T* p) { return v_load_f16(p); }
  static inline void store(T* p, vf v) { v_store_f16(p, v); }
  static inline vf round(vf v) { return v_round_f16(v); }
};

// Load / store n < W elements through a zero-padded buffer, so tails run the same
// vector arithmetic as full vectors.
template <class E>
inline vf load_n(const typename E::T* p, int64_t n) {
  alignas(64) typename E::T buf[W] = {};
  for (int64_t i = 0; i < n; ++i) buf[i] = p[i];
  return E::load(buf);
}
template <class E>
inline void store_n(typename E::T* p, vf v, int64_t n) {
  alignas(64) typename E::T buf[W];
  E::store(buf, v);
  for (int64_t i = 0; i < n; ++i) p[i] = buf[i];
}
template <class E>
inline vf load_any(const typename E::T* p, int64_t n) {
  return n >= W ? E::load(p) : load_n<E>(p, n);
}
template <class E>
inline void store_any(typename E::T* p, vf v, int64_t n) {
  if (n >= W)
    E::store(p, v);
  else
    store_n<E>(p, v, n);
}

// ---------------------------------------------------------------- math
// exp(x): Cody-Waite range reduction and a degree-6 polynomial; < 2 ulp on
// [-87.3, 88.7], +inf above, 0 below.
inline vf v_exp(vf x) {
  const vf hi = v_set1(88.72283935546875f), lo = v_set1(-87.33654022216797f);
  vf xc = v_min(v_max(x, lo), hi);
  vf n = v_roundint(v_mul(xc, v_set1(1.44269504088896341f)));
  vf r = v_fma(n, v_set1(-0.693359375f), xc);
  r = v_fma(n, v_set1(2.12194440e-4f), r);
  vf p = v_set1(1.9875691500e-4f);
  p = v_fma(p, r, v_set1(1.3981999507e-3f));
  p = v_fma(p, r, v_set1(8.3334519073e-3f));
  p = v_fma(p, r, v_set1(4.1665795894e-2f));
  p = v_fma(p, r, v_set1(1.6666665459e-1f));
  p = v_fma(p, r, v_set1(5.0000001201e-1f));
  vf r2 = v_mul(r, r);
  p = v_fma(p, r2, v_add(r, v_set1(1.0f)));
  // 2^n split in two factors so n = 128 (x near 88.7) does not overflow the exponent
  vf n1 = v_roundint(v_mul(n, v_set1(0.5f)));
  vf res = v_mul(v_mul(p, v_pow2i(n1)), v_pow2i(v_sub(n, n1)));
#if defined(VX_AVX512)
  __mmask16 over = _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ);
  __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  res = _mm512_mask_blend_ps(over, res, v_set1(__builtin_inff()));
  res = _mm512_mask_blend_ps(under, res, v_zero());
  __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  res = _mm512_mask_blend_ps(nan, res, x);
#else
  res = _mm256_blendv_ps(res, v_set1(__builtin_inff()), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
  res = _mm256_blendv_ps(res, v_zero(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
  res = _mm256_blendv_ps(res, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
#endif
  return res;
}

// erfc(a) for a >= 0: Abramowitz & Stegun 7.1.26, t * P(t) * exp(-a^2), t = 1/(1+p a);
// absolute error below 1.5e-7. Used as erfc directly (no 1 - erf cancellation).
inline vf v_erfc_pos(vf a) {
  vf t = v_div(v_set1(1.0f), v_fma(v_set1(0.3275911f), a, v_set1(1.0f)));
  vf p = v_set1(1.061405429f);
  p = v_fma(p, t, v_set1(-1.453152027f));
  p = v_fma(p, t, v_set1(1.421413741f));
  p = v_fma(p, t, v_set1(-0.284496736f));
  p = v_fma(p, t, v_set1(0.254829592f));
  return v_mul(v_mul(p, t), v_exp(v_neg(v_mul(a, a))));
}

// tanh(x) = sign(x) * (1 - 2 / (exp(2|x|) + 1)), |error| < 3e-7 absolute
inline vf v_tanh(vf x) {
  vf e = v_exp(v_mul(v_set1(2.0f), v_abs(x)));
  vf t = v_sub(v_set1(1.0f), v_div(v_set1(2.0f), v_add(e, v_set1(1.0f))));
  return v_copysign(t, x);
}

inline vf v_silu(vf a) { return v_div(a, v_add(v_set1(1.0f), v_exp(v_neg(a)))); }
// gelu(a) = a/2 * (1 + erf(a/sqrt2)) = a/2 * (a >= 0 ? 2 - erfc(|x|) : erfc(|x|))
inline vf v_gelu_erf(vf a) {
  vf e = v_erfc_pos(v_abs(v_mul(a, v_set1(0.70710678118654752f))));
#if defined(VX_AVX512)
  vf one_plus_erf = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, v_zero(), _CMP_GE_OQ), e,
                                         v_sub(v_set1(2.0f), e));
#else
  vf one_plus_erf =
      _mm256_blendv_ps(e, v_sub(v_set1(2.0f), e), _mm256_cmp_ps(a, v_zero(), _CMP_GE_OQ));
#endif
  return v_mul(v_mul(a, v_set1(0.5f)), one_plus_erf);
}
inline vf v_gelu_tanh(vf a) {
  vf a3 = v_mul(v_mul(a, a), a);
  vf inner = v_mul(v_set1(0.7978845608028654f), v_add(a, v_mul(v_set1(0.044715f), a3)));
  return v_mul(v_mul(a, v_set1(0.5f)), v_add(v_set1(1.0f), v_tanh(inner)));
}

// ---------------------------------------------------------------- RMSNorm
// Sum of a float row in exactly the order torch 2.13 sums a contiguous row on CPU
// (ATen SumKernel: 8-lane vectors, four interleaved accumulators, a four-level
// cascade of 16-vector blocks, then the scalar tail and the lanes in order). The
// reference's `x.pow(2).mean(-1)` is that sum divided by n; matching it bit for bit
// makes RMSNorm's result identical to the reference's, not just close.
// tests/unit/test_ops.py checks this against torch itself.
constexpr int kTorchLanes = 8;

inline int64_t torch_ceil_log2(int64_t x) {
  if (x <= 2) return 1;
  return 64 - __builtin_clzll(static_cast<unsigned long long>(x - 1));
}

// 8 elements as floats (every ISA here has 256-bit AVX2 vectors)
template <class E>
inline __m256 load8(const typename E::T* p);
template <>
inline __m256 load8<F32>(const float* p) {
  return _mm256_loadu_ps(p);
}
template <>
inline __m256 load8<BF16>(const uint16_t* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
template <>
inline __m256 load8<F16>(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
}
template <class E>
inline float to_float(typename E::T v);
template <>
inline float to_float<F32>(float v) {
  return v;
}
template <>
inline float to_float<BF16>(uint16_t v) {
  return __builtin_bit_cast(float, static_cast<uint32_t>(v) << 16);
}
template <>
inline float to_float<F16>(uint16_t v) {
  return _cvtsh_ss(v);
}
template <class E>
inline __m256 sq8(const typename E::T* p) {
  __m256 v = load8<E>(p);
  return _mm256_mul_ps(v, v);
}

// sum(x[i]^2) over a row, each square rounded to float, added in the order torch 2.13
// sums a contiguous float row on CPU (ATen SumKernel: 8-lane vectors, four interleaved
// accumulators, a four-level cascade over blocks of 16, then the scalar tail and the
// lanes in order). The reference's `x.pow(2).mean(-1)` is that sum divided by n, so
// RMSNorm's result is identical to the reference's, not only close.
// tests/unit/test_ops.py checks it against torch itself.
template <class E>
inline float sum_squares(const typename E::T* x, int64_t n) {
  constexpr int L = kTorchLanes;
  constexpr int ilp = 4;
  if (n < L) {  // ATen's scalar path: four interleaved accumulators
    float acc[ilp] = {0.f, 0.f, 0.f, 0.f};
    const int64_t groups = n / ilp;
    for (int64_t i = 0; i < groups; ++i)
      for (int k = 0; k < ilp; ++k) {
        float v = to_float<E>(x[i * ilp + k]);
        acc[k] += v * v;
      }
    for (int64_t i = groups * ilp; i < n; ++i) {
      float v = to_float<E>(x[i]);
      acc[0] += v * v;
    }
    for (int k = 1; k < ilp; ++k) acc[0] += acc[k];
    return acc[0];
  }
  const int64_t vec_size = n / L;
  const int64_t size = vec_size / ilp;  // groups of ilp vectors
  const int64_t lp_raw = torch_ceil_log2(size) / 4;
  const int64_t level_power = lp_raw > 4 ? lp_raw : 4;
  const int64_t level_step = int64_t{1} << level_power;
  const int64_t level_mask = level_step - 1;
  __m256 a0[ilp], a1[ilp], a2[ilp], a3[ilp];
  for (int k = 0; k < ilp; ++k)
    a0[k] = a1[k] = a2[k] = a3[k] = _mm256_setzero_ps();
  int64_t i = 0;
  while (i + level_step <= size) {
    for (int64_t j = 0; j < level_step; ++j, ++i)
      for (int k = 0; k < ilp; ++k) a0[k] = _mm256_add_ps(a0[k], sq8<E>(x + (i * ilp + k) * L));
    for (int k = 0; k < ilp; ++k) {
      a1[k] = _mm256_add_ps(a1[k], a0[k]);
      a0[k] = _mm256_setzero_ps();
    }
    if ((i & (level_mask << level_power)) != 0) continue;
    for (int k = 0; k < ilp; ++k) {
      a2[k] = _mm256_add_ps(a2[k], a1[k]);
      a1[k] = _mm256_setzero_ps();
    }
    if ((i & (level_mask << (2 * level_power))) != 0) continue;
    for (int k = 0; k < ilp; ++k) {
      a3[k] = _mm256_add_ps(a3[k], a2[k]);
      a2[k] = _mm256_setzero_ps();
    }
  }
  for (; i < size; ++i)
    for (int k = 0; k < ilp; ++k) a0[k] = _mm256_add_ps(a0[k], sq8<E>(x + (i * ilp + k) * L));
  for (int k = 0; k < ilp; ++k) {
    a0[k] = _mm256_add_ps(a0[k], a1[k]);
    a0[k] = _mm256_add_ps(a0[k], a2[k]);
    a0[k] = _mm256_add_ps(a0[k], a3[k]);
  }
  // remaining whole vectors go to the first accumulator, then the four are combined
  for (int64_t r = size * ilp; r < vec_size; ++r) a0[0] = _mm256_add_ps(a0[0], sq8<E>(x + r * L));
  for (int k = 1; k < ilp; ++k) a0[0] = _mm256_add_ps(a0[0], a0[k]);
  float total = 0.f;
  for (int64_t r = vec_size * L; r < n; ++r) {
    float v = to_float<E>(x[r]);
    total += v * v;
  }
  alignas(32) float lanes[L];
  _mm256_store_ps(lanes, a0[0]);
  for (int l = 0; l < L; ++l) total += lanes[l];
  return total;
}

inline float inv_rms(float sum_sq, int64_t n, float eps) {
  float var = sum_sq / static_cast<float>(n);
  return 1.0f / __builtin_sqrtf(var + eps);
}

// y = round(x * inv) [* w, rounded]: the reference's `x.to(weight.dtype) * weight`
template <class E>
inline vf norm_scale(vf x, vf inv, const typename E::T* w, int64_t j, int64_t n) {
  vf y = v_mul(x, inv);
  if (w != nullptr) y = v_mul(E::round(y), load_any<E>(w + j, n - j));
  return y;
}

template <class E>
void rms_norm_rows(void* out_, Rows2 o, const void* x_, Rows2 xr, const void* w_,
                   int64_t hidden, float eps, int64_t rb, int64_t re, float* scratch) {
  using T = typename E::T;
  T* out = static_cast<T*>(out_);
  const T* x = static_cast<const T*>(x_);
  const T* w = static_cast<const T*>(w_);
  for (int64_t r = rb; r < re; ++r) {
    const T* xp = x + (r / xr.n1) * xr.s0 + (r % xr.n1) * xr.s1;
    T* op = out + (r / o.n1) * o.s0 + (r % o.n1) * o.s1;
    vf inv = v_set1(inv_rms(sum_squares<E>(xp, hidden), hidden, eps));
    for (int64_t j = 0; j < hidden; j += W) {
      int64_t n = hidden - j;
      store_any<E>(op + j, norm_scale<E>(load_any<E>(xp + j, n), inv, w, j, hidden), n);
    }
  }
}

template <class E>
void fused_add_rms_norm_rows(void* x_, int64_t xs, void* r_, int64_t rs, const void* w_,
                             int64_t hidden, float eps, int64_t rb, int64_t re,
                             float* scratch) {
  using T = typename E::T;
  T* x = static_cast<T*>(x_);
  T* res = static_cast<T*>(r_);
  const T* w = static_cast<const T*>(w_);
  for (int64_t r = rb; r < re; ++r) {
    T* xp = x + r * xs;
    T* rp = res + r * rs;
    for (int64_t j = 0; j < hidden; j += W) {
      int64_t n = hidden - j;
      vf s = v_add(load_any<E>(xp + j, n), load_any<E>(rp + j, n));
      store_any<E>(rp + j, s, n);
      store_any<F32>(scratch + j, s, n);
    }
    vf inv = v_set1(inv_rms(sum_squares<F32>(scratch, hidden), hidden, eps));
    for (int64_t j = 0; j < hidden; j += W) {
      int64_t n = hidden - j;
      vf s = n >= W ? v_loadf(scratch + j) : load_n<F32>(scratch + j, n);
      store_any<E>(xp + j, norm_scale<E>(s, inv, w, j, hidden), n);
    }
  }
}

// The same with the residual kept in float32 (VLLM_X86_FP32_RESIDUAL): s = x + res in
// float32, res = s (not rounded), x = round(round(s * inv) * w). No scratch: the
// residual row itself holds s.
template <class E>
void fused_add_rms_norm_f32res_rows(void* x_, int64_t xs, float* res, int64_t rs,
                                    const void* w_, int64_t hidden, float eps, int64_t rb,
                                    int64_t re) {
  using T = typename E::T;
  T* x = static_cast<T*>(x_);
  const T* w = static_cast<const T*>(w_);
  for (int64_t r = rb; r < re; ++r) {
    T* xp = x + r * xs;
    float* rp = res + r * rs;
    for (int64_t j = 0; j < hidden; j += W) {
      int64_t n = hidden - j;
      vf s = v_add(load_any<E>(xp + j, n), load_any<F32>(rp + j, n));
      store_any<F32>(rp + j, s, n);
    }
    vf inv = v_set1(inv_rms(sum_squares<F32>(rp, hidden), hidden, eps));
    for (int64_t j = 0; j < hidden; j += W) {
      int64_t n = hidden - j;
      store_any<E>(xp + j, norm_scale<E>(load_any<F32>(rp + j, n), inv, w, j, hidden), n);
    }
  }
}

// ---------------------------------------------------------------- RoPE
template <class A, class B>
struct same_type {
  static constexpr bool value = false;
};
template <class A>
struct same_type<A, A> {
  static constexpr bool value = true;
};
// cos/sin as the reference uses them: converted to the query's dtype
template <class E, class C>
inline vf cache_load(const typename C::T* p, int64_t n) {
  vf v = load_any<C>(p, n);
  return same_type<E, C>::value ? v : E::round(v);
}
// cos|sin of one position as floats, converted to the query's dtype as the reference
// does (`cos.to(x.dtype)`); done once per token, shared by all its heads.
template <class E, class C>
inline void load_cos_sin(const typename C::T* row, int rot, float* cs) {
  for (int j = 0; j < rot; j += W) {
    int64_t n = rot - j;
    store_any<F32>(cs + j, cache_load<E, C>(row + j, n), n);
  }
}

// One head, in place: neox rotates halves (x[j], x[j + rot/2]); gptj rotates pairs
// (x[2i], x[2i+1]). o1 = R(R(x1 c) - R(x2 s)), o2 = R(R(x2 c) + R(x1 s)).
template <class E>
inline void rope_head(typename E::T* x, const float* cs, int rot, bool neox) {
  const int half = rot / 2;
  const float* cosp = cs;
  const float* sinp = cs + half;
  if (neox) {
    for (int j = 0; j < half; j += W) {
      int64_t n = half - j;
      vf c = load_any<F32>(cosp + j, n);
      vf s = load_any<F32>(sinp + j, n);
      vf x1 = load_any<E>(x + j, n), x2 = load_any<E>(x + half + j, n);
      vf o1 = v_sub(E::round(v_mul(x1, c)), E::round(v_mul(x2, s)));
      vf o2 = v_add(E::round(v_mul(x2, c)), E::round(v_mul(x1, s)));
      store_any<E>(x + j, o1, n);
      store_any<E>(x + half + j, o2, n);
    }
    return;
  }
  alignas(64) typename E::T b1[W], b2[W];
  for (int j = 0; j < half; j += W) {
    int n = half - j < W ? half - j : W;
    for (int i = 0; i < n; ++i) {
      b1[i] = x[2 * (j + i)];
      b2[i] = x[2 * (j + i) + 1];
    }
    vf c = load_any<F32>(cosp + j, n);
    vf s = load_any<F32>(sinp + j, n);
    vf x1 = load_any<E>(b1, n), x2 = load_any<E>(b2, n);
    vf o1 = v_sub(E::round(v_mul(x1, c)), E::round(v_mul(x2, s)));
    vf o2 = v_add(E::round(v_mul(x2, c)), E::round(v_mul(x1, s)));
    store_any<E>(b1, o1, n);
    store_any<E>(b2, o2, n);
    for (int i = 0; i < n; ++i) {
      x[2 * (j + i)] = b1[i];
      x[2 * (j + i) + 1] = b2[i];
    }
  }
}

template <class E, class C>
void rotary_tokens(const int64_t* pos, void* q_, int64_t qs, int nq, void* k_, int64_t ks,
                   int nk, int head, int rot, bool neox, const void* cache_, int64_t cache_s,
                   int64_t tb, int64_t te) {
  using T = typename E::T;
  T* q = static_cast<T*>(q_);
  T* k = static_cast<T*>(k_);
  const typename C::T* cache = static_cast<const typename C::T*>(cache_);
  alignas(64) float cs[1024];  // rot <= head_size; ops.cpp checks rot <= 1024
  for (int64_t t = tb; t < te; ++t) {
    load_cos_sin<E, C>(cache + pos[t] * cache_s, rot, cs);
    for (int h = 0; h < nq; ++h) rope_head<E>(q + t * qs + h * head, cs, rot, neox);
    if (k != nullptr)
      for (int h = 0; h < nk; ++h) rope_head<E>(k + t * ks + h * head, cs, rot, neox);
  }
}

// ---------------------------------------------------------------- activations
template <class E, int ACT>
void act_and_mul_rows(void* out_, int64_t os, const void* x_, int64_t xs, int64_t d,
                      int64_t rb, int64_t re) {
  using T = typename E::T;
  T* out = static_cast<T*>(out_);
  const T* x = static_cast<const T*>(x_);
  for (int64_t r = rb; r < re; ++r) {
    const T* a = x + r * xs;
    const T* b = a + d;
    T* o = out + r * os;
    for (int64_t j = 0; j < d; j += W) {
      int64_t n = d - j;
      vf av = load_any<E>(a + j, n);
      vf y = ACT == 0 ? v_silu(av) : ACT == 1 ? v_gelu_erf(av) : v_gelu_tanh(av);
      store_any<E>(o + j, v_mul(E::round(y), load_any<E>(b + j, n)), n);
    }
  }
}

// ---------------------------------------------------------------- split + norm + rope
template <class E, class C>
void split_norm_rope_neox_tokens(void* q_out_, void* k_out_, void* v_out_, const void* qkv_,
                                 int64_t qkv_s, const int64_t* pos, const void* qw_,
                                 const void* kw_, const void* cache_, int64_t cache_s, int nq,
                                 int nk, int head, int rot, float eps, int64_t tb,
                                 int64_t te, float* scratch) {
  using T = typename E::T;
  T* q_out = static_cast<T*>(q_out_);
  T* k_out = static_cast<T*>(k_out_);
  T* v_out = static_cast<T*>(v_out_);
  const T* qkv = static_cast<const T*>(qkv_);
  const T* qw = static_cast<const T*>(qw_);
  const T* kw = static_cast<const T*>(kw_);
  const typename C::T* cache = static_cast<const typename C::T*>(cache_);
  for (int64_t t = tb; t < te; ++t) {
    const T* row = qkv + t * qkv_s;
    alignas(64) float cs[1024];
    load_cos_sin<E, C>(cache + pos[t] * cache_s, rot, cs);
    for (int h = 0; h < nq + nk; ++h) {
      const bool is_q = h < nq;
      const T* src = row + static_cast<int64_t>(h) * head;
      T* dst = is_q ? q_out + (t * nq + h) * head : k_out + (t * nk + (h - nq)) * head;
      const T* w = is_q ? qw : kw;
      // the same RMSNorm as rms_norm_rows (same reduction), written rounded to E
      vf inv = v_set1(inv_rms(sum_squares<E>(src, head), head, eps));
      for (int64_t j = 0; j < head; j += W) {
        int64_t n = head - j;
        store_any<E>(dst + j, norm_scale<E>(load_any<E>(src + j, n), inv, w, j, head), n);
      }
      rope_head<E>(dst, cs, rot, true);
    }
    const T* v = row + static_cast<int64_t>(nq + nk) * head;
    T* vo = v_out + t * nk * head;
    for (int64_t j = 0; j < static_cast<int64_t>(nk) * head; ++j) vo[j] = v[j];
  }
}

// ---------------------------------------------------------------- decode attention
// vLLM CPU's paged KV cache layouts: kv_layout.h.

// Scores of GN query heads (q scaled, float32, hd apart) against the n tokens of one
// (block, KV head) at kb: sc[g * L + t] for t < n. Accumulators stay in registers.
template <class E, int GN>
inline void decode_scores(int layout, const typename E::T* kb, int64_t bs, int64_t hd,
                          int64_t n, const float* qg, float* sc, int64_t L) {
  if (layout == 0) {
    for (int64_t t0 = 0; t0 < n; t0 += W) {
      vf acc[GN];
      for (int g = 0; g < GN; ++g) acc[g] = v_zero();
      for (int64_t d = 0; d < hd; ++d) {
        const vf kv = E::load(kb + d * bs + t0);
        for (int g = 0; g < GN; ++g) acc[g] = v_fma(v_set1(qg[g * hd + d]), kv, acc[g]);
      }
      for (int g = 0; g < GN; ++g) store_any<F32>(sc + g * L + t0, acc[g], n - t0);
    }
    return;
  }
#if defined(VX_AVX512)
  if constexpr (std::is_same<E, BF16>::value) {
    const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    for (int64_t t0 = 0; t0 < n; t0 += 16) {
      const uint16_t* kt = kb + (t0 / 16) * 16 * hd;
      vf acc[GN], acc2[GN];
      for (int g = 0; g < GN; ++g) acc[g] = acc2[g] = v_zero();
      for (int64_t p = 0; p < hd / 2; ++p) {
        const __m512i x = _mm512_loadu_si512(kt + p * 32);
        const vf ev = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
        const vf od = _mm512_castsi512_ps(_mm512_and_si512(x, hi));
        for (int g = 0; g < GN; ++g) {
          acc[g] = v_fma(v_set1(qg[g * hd + 2 * p]), ev, acc[g]);
          acc2[g] = v_fma(v_set1(qg[g * hd + 2 * p + 1]), od, acc2[g]);
        }
      }
      for (int g = 0; g < GN; ++g)
        store_any<F32>(sc + g * L + t0, v_add(acc[g], acc2[g]), n - t0);
    }
  }
#endif
}

// o[c * W ..] += sum over the n tokens of one (block, KV head)'s values at vb (layout 0,
// dimensions d0 .. d0 + CN * W) of p[t] * v[t]; two tokens at a time, two sets of
// accumulators.
template <class E, int CN>
inline void decode_values(const typename E::T* vb, int64_t hd, int64_t n, const float* p,
                          vf* o) {
  vf a[CN], b[CN];
  for (int c = 0; c < CN; ++c) {
    a[c] = o[c];
    b[c] = v_zero();
  }
  int64_t t = 0;
  for (; t + 1 < n; t += 2) {
    const vf p0 = v_set1(p[t]), p1 = v_set1(p[t + 1]);
    const typename E::T* r0 = vb + t * hd;
    const typename E::T* r1 = r0 + hd;
    for (int c = 0; c < CN; ++c) {
      a[c] = v_fma(p0, E::load(r0 + c * W), a[c]);
      b[c] = v_fma(p1, E::load(r1 + c * W), b[c]);
    }
  }
  if (t < n) {
    const vf p0 = v_set1(p[t]);
    for (int c = 0; c < CN; ++c) a[c] = v_fma(p0, E::load(vb + t * hd + c * W), a[c]);
  }
  for (int c = 0; c < CN; ++c) o[c] = v_add(a[c], b[c]);
}

// Decode attention for items [ib, ie) (item = row * kvh + KV head; one query token per
// row): the token's key and value into their cache slot (as cpu_attn_reshape_and_cache;
// none for a negative slot: ops.cpp writes them first where rows of one sequence run on
// several threads), then for each of the G query heads of the KV head
// out = softmax(scale * q K^T) V over the row's seq_len tokens, in float32, the
// output rounded once. scratch: G * (hd + max seq_len) floats.
template <class E>
void decode_attention_items(int layout, const void* q_, int64_t qs, const void* k_, int64_t ks,
                            const void* v_, int64_t vs, void* cache_, int64_t block_elems,
                            int kvh, int64_t bs, int64_t hd, int G, const int64_t* slots,
                            const int32_t* block_table, int64_t bt_s, const int32_t* seq_lens,
                            float scale, void* out_, int64_t os, int64_t ib, int64_t ie,
                            float* scratch) {
  using T = typename E::T;
  const T* q = static_cast<const T*>(q_);
  const T* k = static_cast<const T*>(k_);
  const T* v = static_cast<const T*>(v_);
  T* cache = static_cast<T*>(cache_);
  T* out = static_cast<T*>(out_);
  const int64_t head_elems = 2 * bs * hd;
  for (int64_t it = ib; it < ie; ++it) {
    const int64_t s = it / kvh;
    const int h = static_cast<int>(it % kvh);
    const int64_t L = seq_lens[s];
    const int32_t* row = block_table + s * bt_s;
    auto at = [&](int64_t block) { return cache + block * block_elems + h * head_elems; };
    const int64_t slot = slots[s];
    if (slot >= 0) {
      T* base = at(slot / bs);
      const int64_t t = slot % bs;
      const T* kr = k + s * ks + h * hd;
      const T* vr = v + s * vs + h * hd;
      for (int64_t d = 0; d < hd; ++d) {
        base[kv_key_at(layout, bs, hd, t, d)] = kr[d];
        base[kv_value_at(layout, bs, hd, t, d)] = vr[d];
      }
    }
    float* qf = scratch;
    float* sc = scratch + G * hd;
    for (int g = 0; g < G; ++g)
      for (int64_t d = 0; d < hd; d += W)
        v_storef(qf + g * hd + d,
                 v_mul(E::load(q + s * qs + (static_cast<int64_t>(h) * G + g) * hd + d),
                       v_set1(scale)));
    const int64_t nblk = (L + bs - 1) / bs;
    for (int64_t j = 0; j < nblk; ++j) {
      const T* kb = at(row[j]);
      const int64_t n = L - j * bs < bs ? L - j * bs : bs;
      for (int g0 = 0; g0 < G; g0 += 4) {
        const float* qg = qf + g0 * hd;
        float* sg = sc + g0 * L + j * bs;
        switch (G - g0 < 4 ? G - g0 : 4) {
          case 1: decode_scores<E, 1>(layout, kb, bs, hd, n, qg, sg, L); break;
          case 2: decode_scores<E, 2>(layout, kb, bs, hd, n, qg, sg, L); break;
          case 3: decode_scores<E, 3>(layout, kb, bs, hd, n, qg, sg, L); break;
          default: decode_scores<E, 4>(layout, kb, bs, hd, n, qg, sg, L); break;
        }
      }
    }
    for (int g = 0; g < G; ++g) {
      float* sg = sc + g * L;
      // softmax: max, exp and sum (full vectors, then the tail one by one)
      const int64_t full = L / W * W;
      float m = -__builtin_inff();
      if (full > 0) {
        vf mv = v_loadf(sg);
        for (int64_t i = W; i < full; i += W) mv = v_max(mv, v_loadf(sg + i));
        alignas(64) float tmp[W];
        v_storef(tmp, mv);
        for (int i = 0; i < W; ++i) m = tmp[i] > m ? tmp[i] : m;
      }
      for (int64_t i = full; i < L; ++i) m = sg[i] > m ? sg[i] : m;
      vf sv = v_zero();
      for (int64_t i = 0; i < full; i += W) {
        const vf e = v_exp(v_sub(v_loadf(sg + i), v_set1(m)));
        v_storef(sg + i, e);
        sv = v_add(sv, e);
      }
      float sum = v_hsum(sv);
      for (int64_t i = full; i < L; ++i) {
        sg[i] = std::exp(sg[i] - m);
        sum += sg[i];
      }
      const vf inv = v_set1(1.0f / sum);
      T* og = out + s * os + (static_cast<int64_t>(h) * G + g) * hd;
      if (layout == 0) {
        for (int64_t d0 = 0; d0 < hd; d0 += 4 * W) {
          const int cn = static_cast<int>((hd - d0) / W < 4 ? (hd - d0) / W : 4);
          vf acc[4] = {v_zero(), v_zero(), v_zero(), v_zero()};
          for (int64_t j = 0; j < nblk; ++j) {
            const T* vb = at(row[j]) + bs * hd + d0;
            const int64_t n = L - j * bs < bs ? L - j * bs : bs;
            switch (cn) {
              case 1: decode_values<E, 1>(vb, hd, n, sg + j * bs, acc); break;
              case 2: decode_values<E, 2>(vb, hd, n, sg + j * bs, acc); break;
              case 3: decode_values<E, 3>(vb, hd, n, sg + j * bs, acc); break;
              default: decode_values<E, 4>(vb, hd, n, sg + j * bs, acc); break;
            }
          }
          for (int c = 0; c < cn; ++c) E::store(og + d0 + c * W, v_mul(acc[c], inv));
        }
      } else {
#if defined(VX_AVX512)
        if constexpr (std::is_same<E, BF16>::value) {
          const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
          // vLLM's AMX kernel multiplies V by the probabilities rounded to bf16 (before
          // the division by their float32 sum): round them the same way (to nearest
          // even; they are finite and positive), so the output equals its bit for bit
          const __m512i half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
          int64_t i = 0;
          for (; i + 16 <= L; i += 16) {
            __m512i u = _mm512_castps_si512(_mm512_loadu_ps(sg + i));
            u = _mm512_add_epi32(u, _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
            _mm512_storeu_ps(sg + i, _mm512_castsi512_ps(_mm512_and_si512(u, hi)));
          }
          for (; i < L; ++i) {
            uint32_t u;
            __builtin_memcpy(&u, sg + i, 4);
            u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
            __builtin_memcpy(sg + i, &u, 4);
          }
          for (int64_t d0 = 0; d0 < hd / 16; d0 += 4) {
            const int cn = static_cast<int>(hd / 16 - d0 < 4 ? hd / 16 - d0 : 4);
            vf a[4] = {v_zero(), v_zero(), v_zero(), v_zero()};
            vf b[4] = {v_zero(), v_zero(), v_zero(), v_zero()};
            for (int64_t j = 0; j < nblk; ++j) {
              const uint16_t* vb = at(row[j]) + bs * hd;
              const int64_t n = L - j * bs < bs ? L - j * bs : bs;
              const float* pj = sg + j * bs;
              for (int64_t t = 0; t < n; t += 2) {
                const vf p0 = v_set1(pj[t]);
                const vf p1 = v_set1(t + 1 < n ? pj[t + 1] : 0.f);
                const __mmask16 m1 = t + 1 < n ? 0xffff : 0;
                for (int c = 0; c < cn; ++c) {
                  const __m512i x = _mm512_loadu_si512(vb + (d0 + c) * bs * 16 + (t / 2) * 32);
                  a[c] = v_fma(p0, _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)), a[c]);
                  b[c] = _mm512_mask3_fmadd_ps(
                      p1, _mm512_castsi512_ps(_mm512_and_si512(x, hi)), b[c], m1);
                }
              }
            }
            for (int c = 0; c < cn; ++c) E::store(og + (d0 + c) * 16, v_mul(v_add(a[c], b[c]), inv));
          }
        }
#endif
      }
    }
  }
}

// ---------------------------------------------------------------- refined logits
// o = the float32 dot product of K elements of w and h (+ *b)
template <class E>
inline void refine_one(const typename E::T* w, const typename E::T* h, int64_t K,
                       const typename E::T* b, float* o) {
  vf acc = v_zero();
  for (int64_t k = 0; k < K; k += W) {
    const int64_t n = K - k;
    acc = v_fma(load_any<E>(w + k, n), load_any<E>(h + k, n), acc);
  }
  float v = v_hsum(acc);
  if (b) v += v_hsum(load_n<E>(b, 1));
  *o = v;
}

// Logits rows [rb, re) of a bf16/fp16 LM head: out = float(logits); then every token
// whose value is at least best - |best| * rel (best: the row's maximum) is recomputed as
// the float32 dot product of the row's hidden state and the token's weight row (+ bias).
// A row holding NaN or +inf gets none recomputed, and one holding only -inf and finite
// values the same tokens as torch would pick (ops/reference.refine_top_logits).
template <class E>
void refine_logits_rows(const void* logits_, int64_t ls, const void* hidden_, int64_t hs,
                        const void* weight_, int64_t ws, const void* bias_, int64_t V,
                        int64_t K, float rel, float* out, int64_t os, int64_t rb, int64_t re) {
  using T = typename E::T;
  const T* logits = static_cast<const T*>(logits_);
  const T* hidden = static_cast<const T*>(hidden_);
  const T* weight = static_cast<const T*>(weight_);
  const T* bias = static_cast<const T*>(bias_);
  const int64_t full = V / W * W;
  for (int64_t r = rb; r < re; ++r) {
    const T* lr = logits + r * ls;
    float* o = out + r * os;
    vf mv = v_set1(-__builtin_inff());
    vf odd = v_zero();  // x * 0 is NaN exactly where x is NaN or infinite
    for (int64_t i = 0; i < full; i += W) {
      const vf x = E::load(lr + i);
      v_storef(o + i, x);
      mv = v_max(mv, x);
      odd = v_add(odd, v_mul(x, v_zero()));
    }
    alignas(64) float tmp[W];
    v_storef(tmp, mv);
    float best = -__builtin_inff();
    for (int i = 0; i < W; ++i) best = tmp[i] > best ? tmp[i] : best;
    bool special = v_hsum(odd) != 0.0f;  // NaN != 0
    if (full < V) {
      const vf x = load_n<E>(lr + full, V - full);
      store_n<F32>(o + full, x, V - full);
      for (int64_t i = full; i < V; ++i) {
        best = o[i] > best ? o[i] : best;
        special = special || !(o[i] * 0.0f == 0.0f);
      }
    }
    if (special) {  // torch's amax: NaN wins; then the same threshold
      best = -__builtin_inff();
      for (int64_t i = 0; i < V; ++i) {
        if (o[i] != o[i]) {
          best = o[i];
          break;
        }
        best = o[i] > best ? o[i] : best;
      }
    }
    const float thr = best - std::fabs(best) * rel;
    if (thr != thr) continue;  // NaN or +inf best: nothing compares >= NaN
    const T* h = hidden + r * hs;
    const vf tv = v_set1(thr);
    for (int64_t i0 = 0; i0 < V; i0 += W) {
      unsigned m = i0 + W <= V ? v_ge_mask(v_loadf(o + i0), tv) : 0;
      if (i0 + W > V)
        for (int64_t i = i0; i < V; ++i) m |= (o[i] >= thr ? 1u : 0u) << (i - i0);
      for (; m; m &= m - 1) {
        const int64_t i = i0 + __builtin_ctz(m);
        refine_one<E>(weight + i * ws, h, K, bias ? bias + i : nullptr, o + i);
      }
    }
  }
}

// ---------------------------------------------------------------- dtype dispatch
#define VX_DISPATCH_DT(dt, E, ...)  \
  switch (dt) {                     \
    case kF32: {                    \
      using E = F32;                \
      __VA_ARGS__;                  \
      break;                        \
    }                               \
    case kBF16: {                   \
      using E = BF16;               \
      __VA_ARGS__;                  \
      break;                        \
    }                               \
    default: {                      \
      using E = F16;                \
      __VA_ARGS__;                  \
      break;                        \
    }                               \
  }

void k_rms_norm(int dt, void* out, Rows2 o, const void* x, Rows2 xr, const void* w,
                int64_t hidden, float eps, int64_t rb, int64_t re, float* scratch) {
  VX_DISPATCH_DT(dt, E, rms_norm_rows<E>(out, o, x, xr, w, hidden, eps, rb, re, scratch));
}

void k_fused_add_rms_norm(int dt, void* x, int64_t xs, void* r, int64_t rs, const void* w,
                          int64_t hidden, float eps, int64_t rb, int64_t re, float* scratch) {
  VX_DISPATCH_DT(dt, E,
                 fused_add_rms_norm_rows<E>(x, xs, r, rs, w, hidden, eps, rb, re, scratch));
}

void k_fused_add_rms_norm_f32res(int dt, void* x, int64_t xs, float* r, int64_t rs,
                                 const void* w, int64_t hidden, float eps, int64_t rb,
                                 int64_t re) {
  VX_DISPATCH_DT(dt, E, fused_add_rms_norm_f32res_rows<E>(x, xs, r, rs, w, hidden, eps, rb, re));
}

void k_rotary(int dt, int cdt, const int64_t* pos, void* q, int64_t qs, int nq, void* k,
              int64_t ks, int nk, int head, int rot, bool neox, const void* cache,
              int64_t cache_s, int64_t tb, int64_t te) {
  VX_DISPATCH_DT(dt, E,
                 VX_DISPATCH_DT(cdt, C,
                                rotary_tokens<E, C>(pos, q, qs, nq, k, ks, nk, head, rot,
                                                    neox, cache, cache_s, tb, te)));
}

void k_act_and_mul(int dt, int act, void* out, int64_t os, const void* x, int64_t xs,
                   int64_t d, int64_t rb, int64_t re) {
  if (act == 0) {
    VX_DISPATCH_DT(dt, E, act_and_mul_rows<E, 0>(out, os, x, xs, d, rb, re));
  } else if (act == 1) {
    VX_DISPATCH_DT(dt, E, act_and_mul_rows<E, 1>(out, os, x, xs, d, rb, re));
  } else {
    VX_DISPATCH_DT(dt, E, act_and_mul_rows<E, 2>(out, os, x, xs, d, rb, re));
  }
}

void k_split_norm_rope_neox(int dt, int cdt, void* q_out, void* k_out, void* v_out,
                            const void* qkv, int64_t qkv_s, const int64_t* pos, const void* qw,
                            const void* kw, const void* cache, int64_t cache_s, int nq, int nk,
                            int head, int rot, float eps, int64_t tb, int64_t te,
                            float* scratch) {
  VX_DISPATCH_DT(dt, E,
                 VX_DISPATCH_DT(cdt, C,
                                split_norm_rope_neox_tokens<E, C>(
                                    q_out, k_out, v_out, qkv, qkv_s, pos, qw, kw, cache,
                                    cache_s, nq, nk, head, rot, eps, tb, te, scratch)));
}

void k_decode_attention(int dt, int layout, const void* q, int64_t qs, const void* k, int64_t ks,
                        const void* v, int64_t vs, void* cache, int64_t block_elems, int kvh,
                        int64_t bs, int64_t hd, int G, const int64_t* slots,
                        const int32_t* block_table, int64_t bt_s, const int32_t* seq_lens,
                        float scale, void* out, int64_t os, int64_t ib, int64_t ie,
                        float* scratch) {
  VX_DISPATCH_DT(dt, E,
                 decode_attention_items<E>(layout, q, qs, k, ks, v, vs, cache, block_elems, kvh,
                                           bs, hd, G, slots, block_table, bt_s, seq_lens, scale,
                                           out, os, ib, ie, scratch));
}

void k_refine_logits(int dt, const void* logits, int64_t ls, const void* hidden, int64_t hs,
                     const void* weight, int64_t ws, const void* bias, int64_t V, int64_t K,
                     float rel, float* out, int64_t os, int64_t rb, int64_t re) {
  VX_DISPATCH_DT(dt, E,
                 refine_logits_rows<E>(logits, ls, hidden, hs, weight, ws, bias, V, K, rel, out,
                                       os, rb, re));
}

#undef VX_DISPATCH_DT

}  // namespace

const KernelTable table = {
    VX_ISA_NAME,          k_rms_norm, k_fused_add_rms_norm, k_rotary, k_act_and_mul,
    k_split_norm_rope_neox, k_fused_add_rms_norm_f32res, k_decode_attention,
    k_refine_logits,
};
