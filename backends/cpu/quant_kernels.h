// Internal to the quantized matmul: the 8-bit activation blocks and the table of per-ISA kernels that
// quant_matmul.cpp dispatches to. Each ISA's kernels live in their own .cpp, compiled for that ISA only.
#pragma once
#include <cstdint>

namespace mp::cpu::qk {

// Activations for Q4_0 / Q4_1 / Q8_0 weights: 32 elements x = d * q, and s = d * sum(q) (the term that the
// Q4_1 min multiplies).
struct BlockQ8 {
  float d, s;
  int8_t qs[32];
};
// Activations for K-quant weights: 256 elements x = d * q, with the sums of each 16 q (for the K-quant mins
// and Q6_K's offset of 32).
struct BlockQ8K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};

// One dot product of a weight row (`nb` blocks of its type) with an activation row in the format the type
// pairs with (BlockQ8, BlockQ8K or float).
using DotFn = float (*)(const void* w, const void* a, int64_t nb);

// One weight row against 4 token rows of activations `astride` bytes apart: out[t] = dot(row, token t),
// each bit-identical to the DotFn of that token.
using Dot4Fn = void (*)(const void* w, const void* a, int64_t astride, int64_t nb, float* out);

struct Kernels {
  const char* name;
  void (*quantize_q8)(const float* x, BlockQ8* out, int64_t nb);
  void (*quantize_q8k)(const float* x, BlockQ8K* out, int64_t nb);
  DotFn dot_q4_0, dot_q4_1, dot_q8_0, dot_q4_k, dot_q6_k, dot_f32, dot_f16, dot_bf16;
  Dot4Fn dot4_q4_0 = nullptr, dot4_q4_1 = nullptr, dot4_q8_0 = nullptr;  // nullptr: 4 calls of the DotFn
};

const Kernels& kernels_scalar();
const Kernels* kernels_avx2();    // nullptr when not compiled in
const Kernels* kernels_avx512();  // nullptr when not compiled in

}  // namespace mp::cpu::qk
