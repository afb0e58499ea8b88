// Storage formats of quantized weights, as GGUF files carry them (the GGML block formats): the type ids,
// block sizes and block layouts that the GGUF reader (models/) checks extents with and that the CPU
// kernels (backends/cpu/) compute on. Formats are blocks of `block_elems` consecutive elements of one
// row, each block `block_bytes` long; a row of n elements is n / block_elems blocks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace mp::quant {

// The numeric ids are GGML's (they are what a GGUF tensor info stores).
enum class QType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q8_0 = 8,
  Q4_K = 12,
  Q6_K = 14,
  BF16 = 30,
};

struct QTypeInfo {
  QType type;
  const char* name;  // "Q4_1"
  int64_t block_elems;
  int64_t block_bytes;
};

// nullopt for an id metapipe does not read (the GGUF reader turns that into a user_error naming it).
std::optional<QTypeInfo> qtype_info(uint32_t ggml_id);
const QTypeInfo& info(QType t);
const char* to_string(QType t);

// Bytes of a row of n elements; nullopt when n is not a multiple of the block or the product overflows.
std::optional<uint64_t> row_bytes(QType t, int64_t n);

// Block layouts (packed, little-endian; fp16 fields are IEEE half bits).
constexpr int64_t kQK = 32;    // elements per Q4_0 / Q4_1 / Q8_0 block
constexpr int64_t kQKK = 256;  // elements per K-quant super-block
struct BlockQ4_0 {             // x = (q - 8) * d; q of element i<16 in qs[i] low nibble, of 16+i in its high
  uint16_t d;
  uint8_t qs[kQK / 2];
};
struct BlockQ4_1 {  // x = q * d + m, nibbles as Q4_0
  uint16_t d, m;
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {  // x = q * d
  uint16_t d;
  int8_t qs[kQK];
};
struct BlockQ4_K {  // 8 sub-blocks of 32, 6-bit scales and mins packed in `scales`; x = d*sc*q - dmin*m
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[kQKK / 2];
};
struct BlockQ6_K {  // 16 sub-blocks of 16, int8 scales; q = 4 low bits (ql) | 2 high bits (qh), minus 32
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ6_K) == 210);

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K super-block's `scales` field.
void q4k_scale_min(int j, const uint8_t* scales, uint8_t& sc, uint8_t& m);

float fp16_to_float(uint16_t h);
uint16_t float_to_fp16(float f);  // round to nearest even
float bf16_to_float(uint16_t h);

// Scalar reference: n elements (a multiple of the type's block) from `src` to floats. Every optimized
// kernel is tested against this.
void dequantize_row(QType t, const void* src, float* dst, int64_t n);

}  // namespace mp::quant
