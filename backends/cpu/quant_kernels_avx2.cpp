// The AVX2 kernels: maddubs + madd (u8 x s8 -> int32) for the block formats, 256-bit FMA for float
// weights. Compiled for that ISA by a target pragma; dispatch only picks them on a CPU that has it.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backends/cpu/quant_kernels.h"
#include "core/quant.h"

#if defined(__x86_64__) && defined(__GNUC__)
#if defined(__clang__)  // clang takes the ISA per function, not from GCC's target pragma
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#define MP_HAVE_AVX2_KERNELS 1

namespace mp::cpu::qk {
namespace {
// maddubs saturates its int16 pair sums; every operand pair here stays below 2 * 128 * 127 = 32512.
inline __m256i dot_s16(__m256i acc, __m256i a, __m256i b) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}
inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
}  // namespace
}  // namespace mp::cpu::qk

namespace mp::cpu::qk {
#include "backends/cpu/quant_kernels_x86.inc"

namespace {

inline const uint16_t* u16(const void* p) { return static_cast<const uint16_t*>(p); }

// Float weights: 8 lanes, 4 independent accumulators; a tail of fewer than 8 elements one by one.
template <class Load>
float dot_float(const void* w, const float* a, int64_t n, Load load) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm256_fmadd_ps(load(w, i + 8 * k), _mm256_loadu_ps(a + i + 8 * k), acc[k]);
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load(w, i), _mm256_loadu_ps(a + i), acc[0]);
  float s = hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) s += load(w, i, 0) * a[i];
  return s;
}

// The loaders are structs rather than lambdas: a lambda's function-pointer thunk would be compiled
// without the target and warn about the vector ABI.
struct F32 {
  __m256 operator()(const void* p, int64_t i) const {
    return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  }
  float operator()(const void* p, int64_t i, int) const { return static_cast<const float*>(p)[i]; }
};
struct F16 {
  __m256 operator()(const void* p, int64_t i) const {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u16(p) + i)));
  }
  float operator()(const void* p, int64_t i, int) const { return half(u16(p)[i]); }
};
struct BF16 {
  __m256 operator()(const void* p, int64_t i) const {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u16(p) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  float operator()(const void* p, int64_t i, int) const { return bf16_to_float(u16(p)[i]); }
};
float dot_f32(const void* w, const void* a, int64_t n) {
  return dot_float(w, static_cast<const float*>(a), n, F32{});
}
float dot_f16(const void* w, const void* a, int64_t n) {
  return dot_float(w, static_cast<const float*>(a), n, F16{});
}
float dot_bf16(const void* w, const void* a, int64_t n) {
  return dot_float(w, static_cast<const float*>(a), n, BF16{});
}

constexpr Kernels kAvx2 = {"avx2",   quantize_q8,   quantize_q8k,  dot_q4_0,     dot_q4_1,
                           dot_q8_0, dot_q4_k,      dot_q6_k,      dot_f32,      dot_f16,
                           dot_bf16, dot_q4_0_t<4>, dot_q4_1_t<4>, dot_q8_0_t<4>};
}  // namespace
}  // namespace mp::cpu::qk
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

namespace mp::cpu::qk {
#ifdef MP_HAVE_AVX2_KERNELS
const Kernels* kernels_avx2() { return &kAvx2; }
#else
const Kernels* kernels_avx2() { return nullptr; }
#endif
}  // namespace mp::cpu::qk
