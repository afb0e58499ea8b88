// Check the tile GEMM against cuBLAS and a CPU fp64 reference on fresh random inputs: the correctness
// routine the CLI, the tests, the demo and the benchmark share (timing is bench/harness/gemm_timing.h's).
// Needs no CUDA headers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/gemm.h"

namespace mp::kernels {

struct GemmCheckOptions {
  uint64_t seed = 0;                           // 0: a fresh seed (printed in the result)
  long long full_reference_limit = 1ll << 31;  // M*N*K up to this: every element against CPU fp64;
                                               // above: a 64 x 64 grid of sampled elements
  GemmSchedule schedule{};
  bool cublas = true;  // also run cuBLAS (and compare against it)
};

struct GemmCheckResult {
  std::string plan;  // describe_gemm()
  uint64_t seed = 0;
  double rel_err = 0;             // ||ours - fp64 ref|| / ||fp64 ref|| (all elements or the sample)
  double rel_err_cublas = 0;      // ||cuBLAS - fp64 ref|| / ||fp64 ref||, same elements
  double max_diff_vs_cublas = 0;  // max |ours - cuBLAS| / max |ref| over the compared elements
  size_t unwritten = 0;           // output elements (all of them) still holding the NaN poison
  size_t checked = 0;             // elements compared against fp64
  bool ok = false;
  std::string summary() const;  // "ok (rel err 2.1e-03, cuBLAS 2.1e-03)" or "FAIL: ..."
};

// Throws mp::user_error for bad shapes, mp::not_supported without CUDA, and on CUDA errors.
GemmCheckResult check_gemm(int m, int n, int k, b_layout bl, out_type out, const GemmCheckOptions& opt = {});

// Back-to-back launches with a data dependency, as a model's layers run: X1 = X0 * W0, X2 = X1 * W1, ...
// (`steps` GEMMs, X: m x n bf16, W: n x n stored as `bl`), queued on one stream with no synchronisation
// between them and every X after X0 poisoned with NaN first. Each step is checked against CPU fp64 on the
// GPU's own input X_i, so a launch that read its input before the previous one had written it (or a
// workspace left dirty by the one before) fails. rel_err is the worst step's.
GemmCheckResult check_gemm_chain(int m, int n, int steps, b_layout bl, const GemmSchedule& sched = {});

// Fills n bf16 values at device pointer `p` with uniform random values in [-1, 1) from `seed` (on the
// GPU, asynchronous on the default stream); the inputs check_gemm makes.
void fill_random_bf16(void* p, size_t n, uint64_t seed);

}  // namespace mp::kernels
