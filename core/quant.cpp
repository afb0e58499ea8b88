// GGML block formats: type table, half-precision conversions and the scalar dequantization that every
// optimized kernel is checked against.
#include "core/quant.h"

#include <bit>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace mp::quant {
namespace {

constexpr QTypeInfo kTypes[] = {
    {QType::F32, "F32", 1, 4},
    {QType::F16, "F16", 1, 2},
    {QType::Q4_0, "Q4_0", kQK, sizeof(BlockQ4_0)},
    {QType::Q4_1, "Q4_1", kQK, sizeof(BlockQ4_1)},
    {QType::Q8_0, "Q8_0", kQK, sizeof(BlockQ8_0)},
    {QType::Q4_K, "Q4_K", kQKK, sizeof(BlockQ4_K)},
    {QType::Q6_K, "Q6_K", kQKK, sizeof(BlockQ6_K)},
    {QType::BF16, "BF16", 1, 2},
};

}  // namespace

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K super-block: sub-blocks 0-3 keep theirs in the
// low 6 bits of bytes j and j+4; 4-7 split theirs over the low/high nibble of byte j+4 and the top 2 bits
// of bytes j-4 and j.
void q4k_scale_min(int j, const uint8_t* s, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

std::optional<QTypeInfo> qtype_info(uint32_t ggml_id) {
  for (const auto& t : kTypes)
    if (static_cast<uint32_t>(t.type) == ggml_id) return t;
  return std::nullopt;
}

const QTypeInfo& info(QType t) {
  for (const auto& i : kTypes)
    if (i.type == t) return i;
  fail_internal("quant::info: unknown type ", static_cast<uint32_t>(t));
}

const char* to_string(QType t) { return info(t).name; }

std::optional<uint64_t> row_bytes(QType t, int64_t n) {
  const auto& i = info(t);
  if (n < 0 || n % i.block_elems != 0) return std::nullopt;
  uint64_t blocks = static_cast<uint64_t>(n / i.block_elems);
  if (blocks > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(i.block_bytes)) return std::nullopt;
  return blocks * static_cast<uint64_t>(i.block_bytes);
}

float fp16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3FF) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  return std::bit_cast<float>(bits);
}

uint16_t float_to_fp16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t ax = x & 0x7FFFFFFF;
  if (ax >= 0x7F800000) return static_cast<uint16_t>(sign | 0x7C00 | (ax > 0x7F800000 ? 0x200 : 0));
  if (ax >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);  // rounds past the largest half
  if (ax < 0x38800000) {                                              // subnormal half (or zero)
    float v = std::bit_cast<float>(ax) * 16777216.0f;                  // * 2^24: the subnormal's integer
    uint32_t q = static_cast<uint32_t>(v);
    float rem = v - static_cast<float>(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t e = ((ax >> 23) - 127 + 15) << 10, man = ax & 0x7FFFFF;
  uint32_t h = e | (man >> 13), rest = man & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // carries into the exponent correctly
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

void dequantize_row(QType t, const void* src, float* dst, int64_t n) {
  const auto& ti = info(t);
  MP_USER_CHECK(n >= 0 && n % ti.block_elems == 0, "dequantize_row: ", n, " elements are not whole ", ti.name,
                " blocks of ", ti.block_elems);
  const int64_t nb = n / ti.block_elems;
  switch (t) {
    case QType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case QType::F16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_float(s[i]);
      return;
    }
    case QType::BF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);
      return;
    }
    case QType::Q4_0: {
      const auto* b = static_cast<const BlockQ4_0*>(src);
      for (int64_t k = 0; k < nb; ++k, dst += kQK) {
        float d = fp16_to_float(b[k].d);
        for (int i = 0; i < kQK / 2; ++i) {
          dst[i] = static_cast<float>((b[k].qs[i] & 0xF) - 8) * d;
          dst[i + kQK / 2] = static_cast<float>((b[k].qs[i] >> 4) - 8) * d;
        }
      }
      return;
    }
    case QType::Q4_1: {
      const auto* b = static_cast<const BlockQ4_1*>(src);
      for (int64_t k = 0; k < nb; ++k, dst += kQK) {
        float d = fp16_to_float(b[k].d), m = fp16_to_float(b[k].m);
        for (int i = 0; i < kQK / 2; ++i) {
          dst[i] = static_cast<float>(b[k].qs[i] & 0xF) * d + m;
          dst[i + kQK / 2] = static_cast<float>(b[k].qs[i] >> 4) * d + m;
        }
      }
      return;
    }
    case QType::Q8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t k = 0; k < nb; ++k, dst += kQK) {
        float d = fp16_to_float(b[k].d);
        for (int i = 0; i < kQK; ++i) dst[i] = static_cast<float>(b[k].qs[i]) * d;
      }
      return;
    }
    case QType::Q4_K: {
      const auto* b = static_cast<const BlockQ4_K*>(src);
      for (int64_t k = 0; k < nb; ++k) {
        float d = fp16_to_float(b[k].d), dmin = fp16_to_float(b[k].dmin);
        const uint8_t* q = b[k].qs;
        for (int j = 0; j < 8; j += 2, q += 32) {  // two sub-blocks share 32 bytes: low, then high nibbles
          uint8_t sc0, m0, sc1, m1;
          q4k_scale_min(j, b[k].scales, sc0, m0);
          q4k_scale_min(j + 1, b[k].scales, sc1, m1);
          for (int l = 0; l < 32; ++l) *dst++ = d * sc0 * static_cast<float>(q[l] & 0xF) - dmin * m0;
          for (int l = 0; l < 32; ++l) *dst++ = d * sc1 * static_cast<float>(q[l] >> 4) - dmin * m1;
        }
      }
      return;
    }
    case QType::Q6_K: {
      const auto* b = static_cast<const BlockQ6_K*>(src);
      for (int64_t k = 0; k < nb; ++k) {
        float d = fp16_to_float(b[k].d);
        const uint8_t* ql = b[k].ql;
        const uint8_t* qh = b[k].qh;
        const int8_t* sc = b[k].scales;
        for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, dst += 128) {
          for (int l = 0; l < 32; ++l) {
            int is = l / 16;
            int q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            dst[l] = d * sc[is] * static_cast<float>(q1);
            dst[l + 32] = d * sc[is + 2] * static_cast<float>(q2);
            dst[l + 64] = d * sc[is + 4] * static_cast<float>(q3);
            dst[l + 96] = d * sc[is + 6] * static_cast<float>(q4);
          }
        }
      }
      return;
    }
  }
  fail_internal("dequantize_row: unhandled type ", ti.name);
}

}  // namespace mp::quant
