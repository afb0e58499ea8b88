// Check and time the tile GEMM against cuBLAS and a CPU fp64 reference on fresh random inputs: the one
// routine the CLI, the tests, the demo and the benchmark share. Needs no CUDA headers.
#pragma once
#include <cstdint>
#include <string>

#include "kernels/gemm.h"

namespace mp::kernels {

struct GemmCheckOptions {
  bool time = true;  // time ours and cuBLAS (CUDA events, warm-up, median of `samples`)
  int samples = 20;
  uint64_t seed = 0;                           // 0: a fresh seed (printed in the result)
  long long full_reference_limit = 1ll << 31;  // M*N*K up to this: every element against CPU fp64;
                                               // above: 4096 sampled elements against CPU fp64
  GemmSchedule schedule{};
  bool cublas = true;  // also run cuBLAS (check against it, time it)
};

struct GemmCheckResult {
  std::string plan;  // describe_gemm()
  uint64_t seed = 0;
  double rel_err = 0;             // ||ours - fp64 ref|| / ||fp64 ref|| (all elements or the sample)
  double rel_err_cublas = 0;      // ||cuBLAS - fp64 ref|| / ||fp64 ref||, same elements
  double max_diff_vs_cublas = 0;  // max |ours - cuBLAS| / max |ref| over the whole output
  size_t unwritten = 0;           // output elements (all of them) still holding the NaN poison
  size_t checked = 0;             // elements compared against fp64
  bool ok = false;
  double ours_ms = 0, cublas_ms = 0;  // medians
  double ours_tflops = 0, cublas_tflops = 0;
  std::string summary() const;  // "ok (rel err 2.1e-03, cuBLAS 2.1e-03)" or "FAIL: ..."
};

// Throws mp::user_error for bad shapes, mp::not_supported without CUDA, and on CUDA errors.
GemmCheckResult check_gemm(int m, int n, int k, b_layout bl, out_type out, const GemmCheckOptions& opt = {});

}  // namespace mp::kernels
