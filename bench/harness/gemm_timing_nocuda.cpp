// The GEMM timing in a build without CUDA: it says so.
#include "bench/harness/gemm_timing.h"
#include "core/error.h"

namespace mp::bench {

GemmTiming time_gemm(int m, int n, int k, kernels::b_layout, kernels::out_type, const GemmTimingOptions&) {
  kernels::check_gemm_shape(m, n, k);
  throw not_supported("timing the tile GEMM in a build without CUDA (nvcc was not found at configure time)");
}

}  // namespace mp::bench
