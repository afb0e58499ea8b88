// Matrix-vector and matrix-matrix products on weights that stay in their GGML quantized format (the CPU
// path of a GGUF model): the activations are quantized to 8-bit blocks once per call and every row is an
// integer dot product (AVX-512 VNNI, AVX2 or scalar, chosen at run time); F32/F16/BF16 weights use float
// dot products.
#pragma once
#include <cstdint>
#include <vector>

#include "core/quant.h"
#include "core/thread_pool.h"

namespace mp::cpu {

// A weight matrix of `rows` rows of `cols` elements each, stored row after row in GGML format `type`
// (row stride quant::row_bytes(type, cols)); F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K.
struct QMatrix {
  quant::QType type;
  const void* data;
  int64_t rows, cols;
};

// y[r] = sum_c W[r][c] * x[c] for r in [0, rows). The output must not overlap the input (user_error).
void matvec(const QMatrix& W, const float* x, float* y, ThreadPool& pool);
// Y[t][r] = sum_c W[r][c] * X[t][c], X is n x cols (row-major), Y is n x rows: prefill of n tokens
void matmul(const QMatrix& W, const float* X, int64_t n, float* Y, ThreadPool& pool);
const char* kernel_isa();  // "avx512-vnni", "avx2", "scalar": what the run-time dispatch chose

namespace detail {
// Test and benchmark hook: makes every later call use the given path ("avx512-vnni", "avx2", "scalar"),
// or the run-time choice again with "auto". user_error for a name this CPU cannot run.
void force_isa(const char* isa);
// The paths this CPU can run, best first, ending with "scalar".
std::vector<const char*> available_isas();
}  // namespace detail

}  // namespace mp::cpu
