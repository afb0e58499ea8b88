// Check and time the tile GEMM against cuBLAS and a CPU fp64 reference on fresh random inputs: the one
// routine the CLI, the tests, the demo and the benchmark share. Needs no CUDA headers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

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
  // Time each sample's batch of launches as one CUDA graph (captured once per variant, then replayed),
  // so that the host's launch pace cannot set the time of kernels as short as its launch overhead
  // (M = 128: ~15 us). Falls back to direct launches, and says so in timing_method, where a capture
  // fails.
  bool graphs = false;
  // Work per sample, in ms at 700 TFLOP/s: each sample is a batch of launches this long (at least one
  // launch, at most 20000), and the two variants alternate by sample. The H200 runs large GEMMs at its
  // power cap (700 W), where the SM clock follows the power drawn with a delay: with 2 ms batches each
  // sample ran partly at the clock the other variant's sample left behind, which favoured whichever kernel
  // draws more power, by up to 4 % (bench/RESULTS.md, eighth session: 8192^3 1.042x at 2 ms batches,
  // 0.999x at 100 ms). 200 ms batches time each at the clock it settles to (~1.5 GHz there), which is the
  // throughput of a long run of such GEMMs. Up to the seventh session the default was 2 ms.
  double batch_ms = 200.0;
  // Read the GPU's energy counter and SM clock (NVML, core/power.h) around and during each sample, for
  // GemmCheckResult::ours_power / cublas_power. Where NVML is absent the figures stay 0 (power_note says
  // why). Meaningful with batches of tens of ms and more (the counter advances in steps), and even then
  // the counter's lag moves part of one batch's energy into the next (the other variant's), so the two
  // energies come out closer to each other than they are; the clock readings have no such lag.
  bool power = false;
  // Diagnostic: after the timing, one more launch (after a launch of the same GEMM, as in the timed
  // batches) records the kernel's timeline (GemmSchedule::trace) into GemmCheckResult::trace.
  bool trace = false;
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
  // With GemmCheckOptions::power: energy per launch (mJ), mean power over the batches (W), and the mean SM
  // clock read while the batches ran (MHz); 0 where not measured.
  struct Power {
    double mj_per_launch = 0, watts = 0, sm_mhz = 0;
  };
  Power ours_power, cublas_power;
  std::string power_note;     // why the power figures are missing, if they are
  int batch_launches = 0;     // launches per timed sample (GemmCheckOptions::batch_ms)
  std::string timing_method;  // "direct launches" or "CUDA graphs" (how the samples were launched)
  // With GemmCheckOptions::trace: per launched block, gemm_trace_points values (ns, the SM last).
  std::vector<unsigned long long> trace;
  std::string summary() const;  // "ok (rel err 2.1e-03, cuBLAS 2.1e-03)" or "FAIL: ..."
};

// Throws mp::user_error for bad shapes, mp::not_supported without CUDA, and on CUDA errors.
GemmCheckResult check_gemm(int m, int n, int k, b_layout bl, out_type out, const GemmCheckOptions& opt = {});

// Back-to-back launches with a data dependency, as a model's layers run: X1 = X0 * W0, X2 = X1 * W1, ...
// (`steps` GEMMs, X: m x n bf16, W: n x n stored as `bl`), queued on one stream with no synchronisation
// between them and every X after X0 poisoned with NaN first. Each step is checked against CPU fp64 on the
// GPU's own input X_i, so a launch that read its input before the previous one had written it fails
// (the dependent-launch wait, GemmSchedule::overlap_launch). rel_err is the worst step's.
GemmCheckResult check_gemm_chain(int m, int n, int steps, b_layout bl, const GemmSchedule& sched = {});

}  // namespace mp::kernels
