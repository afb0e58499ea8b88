// GPU tests of the GEMM timing harness: the graph-timed path really times graphs, and long batches with
// the power probe give energy, power and clock figures for both variants.
#include <gtest/gtest.h>

#include "bench/harness/gemm_timing.h"
#include "core/device.h"

using namespace mp::kernels;
using mp::bench::GemmTimingOptions;
using mp::bench::time_gemm;

namespace {
bool have_hopper() {
  auto g = mp::query_gpu();
  return g && mp::gpu_is_hopper(*g);
}
}  // namespace

// It must really time captured graphs (not fall back to direct launches) and give positive times for both.
TEST(SM90_GemmTiming, TimesThroughGraphs) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  for (b_layout bl : {b_layout::kn, b_layout::nk}) {
    GemmTimingOptions opt;
    opt.samples = 3;
    opt.graphs = true;
    opt.batch_ms = 2;  // a graph of ~2 ms of these small launches (the default 200 ms would be thousands)
    auto t = time_gemm(128, 1024, 1024, bl, out_type::bf16, opt);  // split-K: the workspace path too
    EXPECT_EQ(t.timing_method, "CUDA graphs");
    EXPECT_GT(t.ours_ms, 0);
    EXPECT_GT(t.cublas_ms, 0);
  }
}

// The batch holds the launches asked for, and where NVML is present both variants get energy, power and
// clock figures.
TEST(SM90_GemmTiming, LongBatchesWithPower) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  GemmTimingOptions opt;
  opt.samples = 4;
  opt.batch_ms = 100;  // the energy counter advances in steps: batches of ~100 ms keep the error small
  opt.power = true;
  const int s = 2048;
  auto t = time_gemm(s, s, s, b_layout::nk, out_type::bf16, opt);
  EXPECT_EQ(t.batch_launches, int(100e-3 / (2.0 * s * s * s / 700e12)));  // 100 ms at 700 TFLOP/s
  EXPECT_GT(t.ours_ms, 0);
  EXPECT_EQ(t.timing_method, "direct launches");
  if (!t.power_note.empty()) GTEST_SKIP() << "no power figures: " << t.power_note;
  for (const auto& p : {t.ours_power, t.cublas_power}) {
    EXPECT_GT(p.mj_per_launch, 0);
    EXPECT_GT(p.watts, 50);    // a busy H200 draws hundreds of watts
    EXPECT_LT(p.watts, 1500);  // and not kilowatts
    EXPECT_GT(p.sm_mhz, 100);
  }
}
