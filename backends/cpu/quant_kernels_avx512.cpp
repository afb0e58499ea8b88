// The AVX-512 VNNI kernels: vpdpbusd (u8 x s8 -> int32) on 256-bit vectors for the block formats, 512-bit
// FMA for float weights. Compiled for that ISA by a target pragma; dispatch only picks them on a CPU that
// has it (quant_matmul.cpp).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backends/cpu/quant_kernels.h"
#include "core/quant.h"

#if defined(__x86_64__) && defined(__GNUC__)
#if defined(__clang__)  // clang takes the ISA per function, not from GCC's target pragma
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#endif
// GCC 12's AVX-512 intrinsic headers build their "undefined" operands from self-initialized locals, which
// -Wall reports once the intrinsics are inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define MP_HAVE_AVX512_KERNELS 1

namespace mp::cpu::qk {
namespace {
inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
inline __m256i dot_s16(__m256i acc, __m256i a, __m256i b) { return _mm256_dpwssd_epi32(acc, a, b); }
}  // namespace
}  // namespace mp::cpu::qk

namespace mp::cpu::qk {
#include "backends/cpu/quant_kernels_x86.inc"

namespace {

// Float weights: 16 lanes, 4 independent accumulators, a masked tail for any length.
template <class Load>
float dot_float(const void* w, const float* a, int64_t n, Load load) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (int k = 0; k < 4; ++k)
      acc[k] =
          _mm512_fmadd_ps(load(w, i + 16 * k, __mmask16(0xFFFF)), _mm512_loadu_ps(a + i + 16 * k), acc[k]);
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
    acc[0] = _mm512_fmadd_ps(load(w, i, m), _mm512_maskz_loadu_ps(m, a + i), acc[0]);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

// The loaders are structs rather than lambdas: a lambda's function-pointer thunk would be compiled
// without the target and warn about the vector ABI.
struct LoadF32 {
  __m512 operator()(const void* p, int64_t i, __mmask16 m) const {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
  }
};
struct LoadF16 {
  __m512 operator()(const void* p, int64_t i, __mmask16 m) const {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i));
  }
};
struct LoadBF16 {
  __m512 operator()(const void* p, int64_t i, __mmask16 m) const {
    __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
};
float dot_f32(const void* w, const void* a, int64_t n) {
  return dot_float(w, static_cast<const float*>(a), n, LoadF32{});
}
float dot_f16(const void* w, const void* a, int64_t n) {
  return dot_float(w, static_cast<const float*>(a), n, LoadF16{});
}
float dot_bf16(const void* w, const void* a, int64_t n) {
  return dot_float(w, static_cast<const float*>(a), n, LoadBF16{});
}

constexpr Kernels kAvx512 = {"avx512-vnni", quantize_q8,   quantize_q8k,  dot_q4_0,     dot_q4_1,
                             dot_q8_0,      dot_q4_k,      dot_q6_k,      dot_f32,      dot_f16,
                             dot_bf16,      dot_q4_0_t<4>, dot_q4_1_t<4>, dot_q8_0_t<4>};
}  // namespace
}  // namespace mp::cpu::qk
#pragma GCC diagnostic pop
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

namespace mp::cpu::qk {
#ifdef MP_HAVE_AVX512_KERNELS
const Kernels* kernels_avx512() { return &kAvx512; }
#else
const Kernels* kernels_avx512() { return nullptr; }
#endif
}  // namespace mp::cpu::qk
