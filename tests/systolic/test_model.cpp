// The analytical fold/skew model against SCALE-Sim v2's numbers, and the cycle-level simulation against a
// reference GEMM and against the analytical model.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "core/compare.h"
#include "core/error.h"
#include "core/random.h"
#include "systolic/systolic.h"
#include "tests/support/expect_user_error.h"

namespace mp::systolic {
namespace {

ArrayConfig array(int r, int c, Dataflow df) { return ArrayConfig{r, c, df}; }

// SCALE-Sim v2 (pip scalesim==2.0.2, InterfaceBandwidth CALC, 64 KB SRAMs): GEMM 64x64x64 on 32x32.
TEST(SystolicAnalytical, Gemm64On32x32MatchesScaleSim) {
  GemmShape g{64, 64, 64};
  EXPECT_EQ(analyze_gemm(g, array(32, 32, Dataflow::WS)).cycles, 631);
  EXPECT_EQ(analyze_gemm(g, array(32, 32, Dataflow::OS)).cycles, 503);
  EXPECT_EQ(analyze_gemm(g, array(32, 32, Dataflow::IS)).cycles, 631);
}

TEST(SystolicAnalytical, Ws8x8Gemm256x147x64MatchesScaleSim) {
  auto r = analyze_gemm({256, 147, 64}, array(8, 8, Dataflow::WS));
  EXPECT_EQ(r.cycles, 42255);
  EXPECT_EQ(r.folds, 19 * 8);
  EXPECT_NEAR(100 * r.overall_utilization, 89.059, 5e-4);
  EXPECT_NEAR(100 * r.mapping_efficiency, 96.711, 5e-4);
}

TEST(SystolicAnalytical, FoldPlanPerDataflow) {
  GemmShape g{100, 70, 40};
  auto ws = plan_gemm(g, array(16, 8, Dataflow::WS));
  EXPECT_EQ(std::tie(ws.spatial_rows, ws.spatial_cols, ws.temporal), std::make_tuple(70LL, 40LL, 100LL));
  EXPECT_EQ(ws.row_folds, 5);
  EXPECT_EQ(ws.col_folds, 5);
  EXPECT_EQ(ws.cycles_per_fold, 2 * 16 + 8 + 100 - 2);
  auto os = plan_gemm(g, array(16, 8, Dataflow::OS));
  EXPECT_EQ(std::tie(os.spatial_rows, os.spatial_cols, os.temporal), std::make_tuple(100LL, 40LL, 70LL));
  EXPECT_EQ(os.cycles_per_fold, 16 + 8 + 70 - 2);
  auto is = plan_gemm(g, array(16, 8, Dataflow::IS));
  EXPECT_EQ(std::tie(is.spatial_rows, is.spatial_cols, is.temporal), std::make_tuple(70LL, 100LL, 40LL));
}

TEST(SystolicAnalytical, RejectsNonPositiveSizes) {
  EXPECT_USER_ERROR(analyze_gemm({0, 4, 4}, array(4, 4, Dataflow::WS)),
                    "GEMM M must be a positive integer, got 0");
  EXPECT_USER_ERROR(analyze_gemm({4, 4, -2}, array(4, 4, Dataflow::WS)),
                    "GEMM N must be a positive integer, got -2");
  EXPECT_USER_ERROR(analyze_gemm({4, 4, 4}, array(4, -1, Dataflow::OS)),
                    "array columns (ArrayWidth) must be a positive integer, got -1");
  EXPECT_USER_ERROR(analyze_gemm({4, 4, 4}, array(0, 4, Dataflow::IS)),
                    "array rows (ArrayHeight) must be a positive integer, got 0");
}

std::vector<double> reference_gemm(const GemmShape& g, const std::vector<float>& I,
                                   const std::vector<float>& W) {
  std::vector<double> O(static_cast<size_t>(g.M * g.N), 0.0);
  for (std::int64_t m = 0; m < g.M; ++m)
    for (std::int64_t k = 0; k < g.K; ++k)
      for (std::int64_t n = 0; n < g.N; ++n)
        O[m * g.N + n] += double(I[m * g.K + k]) * double(W[k * g.N + n]);
  return O;
}

// Odd shapes (partial folds on both axes), square and tall arrays, every dataflow.
class SystolicCycleLevel : public ::testing::TestWithParam<std::tuple<GemmShape, int, int, Dataflow>> {};

TEST_P(SystolicCycleLevel, ComputesTheProductAndAgreesWithTheAnalyticalModel) {
  auto [g, R, C, df] = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto I = random_floats(static_cast<size_t>(g.M * g.K), seed);
  auto W = random_floats(static_cast<size_t>(g.K * g.N), seed + 1);
  auto sim = simulate_gemm(g, array(R, C, df), I, W);
  auto ref = reference_gemm(g, I, W);
  auto cmp = compare(sim.output, ref, 1e-5, 1e-5);
  EXPECT_TRUE(cmp.ok) << cmp.summary();
  auto ana = analyze_gemm(g, array(R, C, df));
  EXPECT_EQ(sim.cycles, ana.cycles);
  EXPECT_EQ(sim.mac_ops, g.M * g.K * g.N);
}

INSTANTIATE_TEST_SUITE_P(Shapes, SystolicCycleLevel,
                         ::testing::Combine(::testing::Values(GemmShape{1, 1, 1}, GemmShape{37, 19, 23},
                                                              GemmShape{64, 64, 64}, GemmShape{5, 40, 3}),
                                            ::testing::Values(8, 16), ::testing::Values(4, 8),
                                            ::testing::Values(Dataflow::WS, Dataflow::OS, Dataflow::IS)));

}  // namespace
}  // namespace mp::systolic
