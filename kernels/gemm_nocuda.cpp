// The GEMM entry points in a build without CUDA: they say so.
#include "core/error.h"
#include "kernels/gemm.h"
#include "kernels/gemm_check.h"

namespace mp::kernels {

void gemm_bf16(const void*, const void*, void*, int m, int n, int k, b_layout, out_type, CUstream_st*,
               const GemmSchedule&) {
  check_gemm_shape(m, n, k);
  throw not_supported("the tile GEMM in a build without CUDA (nvcc was not found at configure time)");
}
void gemm_bf16_cublas(const void*, const void*, void*, int, int, int, b_layout, out_type, CUstream_st*) {
  throw not_supported("cuBLAS in a build without CUDA (nvcc was not found at configure time)");
}
std::string GemmCheckResult::summary() const { return "skipped: no CUDA in this build"; }
GemmCheckResult check_gemm(int m, int n, int k, b_layout, out_type, const GemmCheckOptions&) {
  check_gemm_shape(m, n, k);
  throw not_supported("the GEMM check in a build without CUDA (nvcc was not found at configure time)");
}
GemmCheckResult check_gemm_chain(int m, int n, int, b_layout, const GemmSchedule&) {
  check_gemm_shape(m, n, n);
  throw not_supported("the GEMM check in a build without CUDA (nvcc was not found at configure time)");
}
void fill_random_bf16(void*, size_t, uint64_t) {
  throw not_supported("device buffers in a build without CUDA (nvcc was not found at configure time)");
}
std::string describe_gemm(int, int, int, b_layout, out_type, const GemmSchedule&) {
  return "no CUDA in this build";
}

}  // namespace mp::kernels
