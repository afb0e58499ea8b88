// The portable kernels: the same integer arithmetic as the SIMD paths (8-bit activations, exact integer
// sums per block), in plain C++. They run where neither AVX2 nor AVX-512 is available.
#include <cmath>
#include <cstring>

#include "backends/cpu/quant_kernels.h"
#include "core/quant.h"

namespace mp::cpu::qk {
namespace {

using namespace mp::quant;

// Symmetric 8-bit quantization of n values: d = max|x| / 127, q = round-to-nearest-even(x / d).
float quantize_block(const float* x, int8_t* q, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < n; ++i) q[i] = static_cast<int8_t>(std::nearbyint(x[i] * id));
  return d;
}

void quantize_q8(const float* x, BlockQ8* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 32) {
    out[b].d = quantize_block(x, out[b].qs, 32);
    int sum = 0;
    for (int i = 0; i < 32; ++i) sum += out[b].qs[i];
    out[b].s = out[b].d * static_cast<float>(sum);
  }
}

void quantize_q8k(const float* x, BlockQ8K* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 256) {
    out[b].d = quantize_block(x, out[b].qs, 256);
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += out[b].qs[16 * j + i];
      out[b].bsums[j] = static_cast<int16_t>(sum);
    }
  }
}

float dot_q4_0(const void* w, const void* a, int64_t nb) {
  const auto* x = static_cast<const BlockQ4_0*>(w);
  const auto* y = static_cast<const BlockQ8*>(a);
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int sum = 0;
    for (int i = 0; i < 16; ++i)
      sum += ((x[b].qs[i] & 0xF) - 8) * y[b].qs[i] + ((x[b].qs[i] >> 4) - 8) * y[b].qs[i + 16];
    acc += fp16_to_float(x[b].d) * y[b].d * static_cast<float>(sum);
  }
  return acc;
}

float dot_q4_1(const void* w, const void* a, int64_t nb) {
  const auto* x = static_cast<const BlockQ4_1*>(w);
  const auto* y = static_cast<const BlockQ8*>(a);
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int sum = 0;
    for (int i = 0; i < 16; ++i) sum += (x[b].qs[i] & 0xF) * y[b].qs[i] + (x[b].qs[i] >> 4) * y[b].qs[i + 16];
    acc += fp16_to_float(x[b].d) * y[b].d * static_cast<float>(sum) + fp16_to_float(x[b].m) * y[b].s;
  }
  return acc;
}

float dot_q8_0(const void* w, const void* a, int64_t nb) {
  const auto* x = static_cast<const BlockQ8_0*>(w);
  const auto* y = static_cast<const BlockQ8*>(a);
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int sum = 0;
    for (int i = 0; i < 32; ++i) sum += x[b].qs[i] * y[b].qs[i];
    acc += fp16_to_float(x[b].d) * y[b].d * static_cast<float>(sum);
  }
  return acc;
}

float dot_q4_k(const void* w, const void* a, int64_t nb) {
  const auto* x = static_cast<const BlockQ4_K*>(w);
  const auto* y = static_cast<const BlockQ8K*>(a);
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* q = x[b].qs;
    const int8_t* p = y[b].qs;
    int sumq = 0, summ = 0;
    for (int j = 0; j < 8; j += 2, q += 32, p += 64) {
      uint8_t sc0, m0, sc1, m1;
      quant::q4k_scale_min(j, x[b].scales, sc0, m0);
      quant::q4k_scale_min(j + 1, x[b].scales, sc1, m1);
      int s0 = 0, s1 = 0;
      for (int l = 0; l < 32; ++l) {
        s0 += (q[l] & 0xF) * p[l];
        s1 += (q[l] >> 4) * p[l + 32];
      }
      sumq += sc0 * s0 + sc1 * s1;
      summ += m0 * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]) +
              m1 * (y[b].bsums[2 * j + 2] + y[b].bsums[2 * j + 3]);
    }
    acc += y[b].d * (fp16_to_float(x[b].d) * static_cast<float>(sumq) -
                     fp16_to_float(x[b].dmin) * static_cast<float>(summ));
  }
  return acc;
}

float dot_q6_k(const void* w, const void* a, int64_t nb) {
  const auto* x = static_cast<const BlockQ6_K*>(w);
  const auto* y = static_cast<const BlockQ8K*>(a);
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* ql = x[b].ql;
    const uint8_t* qh = x[b].qh;
    const int8_t* sc = x[b].scales;
    const int8_t* p = y[b].qs;
    int sum = 0;
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, p += 128) {
      int s[8] = {};  // per 16-element sub-block: l / 16 + 2 * quarter
      for (int l = 0; l < 32; ++l) {
        int is = l / 16;
        int q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
        int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        s[is] += q1 * p[l];
        s[is + 2] += q2 * p[l + 32];
        s[is + 4] += q3 * p[l + 64];
        s[is + 6] += q4 * p[l + 96];
      }
      for (int k = 0; k < 8; ++k) sum += sc[k] * s[k];
    }
    acc += fp16_to_float(x[b].d) * y[b].d * static_cast<float>(sum);
  }
  return acc;
}

float dot_f32(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += x[i] * y[i];
  return acc;
}

float dot_f16(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const float*>(a);
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += fp16_to_float(x[i]) * y[i];
  return acc;
}

float dot_bf16(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const float*>(a);
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += bf16_to_float(x[i]) * y[i];
  return acc;
}

constexpr Kernels kScalar = {"scalar", quantize_q8, quantize_q8k, dot_q4_0, dot_q4_1, dot_q8_0, dot_q4_k,
                             dot_q6_k, dot_f32,     dot_f16,      dot_bf16, nullptr,  nullptr,  nullptr};

}  // namespace

const Kernels& kernels_scalar() { return kScalar; }

}  // namespace mp::cpu::qk
