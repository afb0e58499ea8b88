// Time the tile GEMM against cuBLAS in the same process: the timing and power harness that bench_gemm and
// `metapipe gemm` share (the correctness check is the kernel library's, kernels/gemm_check.h). Needs no
// CUDA headers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/gemm.h"

namespace mp::bench {

struct GemmTimingOptions {
  int samples = 20;  // per variant; the median is taken
  uint64_t seed = 1;
  kernels::GemmSchedule schedule{};
  bool cublas = true;  // also time cuBLAS, interleaved with ours
  // Time each sample's batch of launches as one CUDA graph (captured once per variant, then replayed),
  // so that the host's launch pace cannot set the time of kernels as short as its launch overhead
  // (M = 128: ~15 us). Falls back to direct launches, and says so in timing_method, where a capture
  // fails.
  bool graphs = false;
  // Work per sample, in ms at 700 TFLOP/s: each sample is a batch of launches this long (at least one
  // launch, at most 20000), and the two variants alternate by sample. The H200 runs large GEMMs at its
  // power cap (700 W), where the SM clock follows the power drawn with a delay: with 2 ms batches each
  // sample ran partly at the clock the other variant's sample left behind, which favoured whichever kernel
  // draws more power, by up to 4 % (8192^3: 1.042x at 2 ms batches, 0.999x at 100 ms; bench/RESULTS.md,
  // GEMM). 200 ms batches come close to the clock each settles to; bench_gemm's tables take 1 s.
  double batch_ms = 200.0;
  // Read the GPU's energy counter and SM clock (NVML, power.h) around and during each sample. Where NVML
  // is absent the figures stay 0 (power_note says why). Meaningful with batches of tens of ms and more
  // (the counter advances in steps), and even then the counter's lag moves part of one batch's energy
  // into the next (the other variant's), so the two energies come out closer to each other than they
  // are; the clock readings have no such lag.
  bool power = false;
  // Diagnostic: after the timing, one more launch (after a launch of the same GEMM, as in the timed
  // batches) records the kernel's timeline (GemmSchedule::trace; builds with MP_PIPELINE_TRACE).
  bool trace = false;
};

struct GemmTiming {
  double ours_ms = 0, cublas_ms = 0;  // medians per launch
  double ours_tflops = 0, cublas_tflops = 0;
  // With GemmTimingOptions::power: energy per launch (mJ), mean power over the batches (W), and the mean
  // SM clock read while the batches ran (MHz); 0 where not measured.
  struct Power {
    double mj_per_launch = 0, watts = 0, sm_mhz = 0;
  };
  Power ours_power, cublas_power;
  std::string power_note;     // why the power figures are missing, if they are
  int batch_launches = 0;     // launches per timed sample
  std::string timing_method;  // "direct launches" or "CUDA graphs" (how the samples were launched)
  // With GemmTimingOptions::trace: per launched block, gemm_trace_points values (ns, the SM last).
  std::vector<unsigned long long> trace;
  double ratio() const { return ours_ms > 0 ? cublas_ms / ours_ms : 0; }  // > 1: ours is faster
};

// Random bf16 inputs (input copies rotated so that one pass exceeds the L2 several times over), 10 warm-up
// launches of each, then `samples` batches of each, interleaved (ours, cuBLAS, ours, ...) so that both
// see the same temperature and power state; CUDA events around each batch. Throws mp::user_error for bad
// shapes or options, mp::not_supported without CUDA, and on CUDA errors.
GemmTiming time_gemm(int m, int n, int k, kernels::b_layout bl, kernels::out_type out,
                     const GemmTimingOptions& opt = {});

}  // namespace mp::bench
