// The registry programs compiled and lowered onto the simulated accelerator, on small grids: a program
// that does not fit becomes several kernel calls with the same results, what cannot be split says so, and
// bad tiles are rejected by the front end and the passes before anything reaches the simulator.
#include <gtest/gtest.h>

#include "backends/rdu/arch.h"
#include "core/error.h"
#include "core/random.h"
#include "tests/backends/rdu/compiled.h"

using namespace mp;
using mp::test::compiled;
using mp::test::run_functional;

namespace {

// 2 x 4 grid: 4 PCUs and 4 PMUs.
rdu::Arch tiny_grid() {
  rdu::Arch a = rdu::load_arch("plasticine");
  rdu::apply_override(a, "grid.rows=2");
  rdu::apply_override(a, "grid.cols=4");
  return a;
}

void one_unit_per_matmul(passes::CompileOptions& o) { o.parallelize.max_par = 1; }

}  // namespace

TEST(RduPrograms, FunctionalResultsSurviveSplittingIntoKernelCalls) {
  const rdu::Arch a = tiny_grid();
  const uint64_t seed = fresh_seed();
  for (const char* name : {"gda", "gemm"}) {
    rdu::RunResult r = run_functional(a, name, {}, seed, one_unit_per_matmul);
    EXPECT_GT(r.kernel_calls, 1) << name;
    ASSERT_FALSE(r.split_reasons.empty()) << name;
    EXPECT_NE(r.split_reasons[0].find("does not fit"), std::string::npos) << r.split_reasons[0];
  }
}

TEST(RduPrograms, LoopCarriedBuffersAreNotSplitAcrossKernelCalls) {
  rdu::Graph g = compiled("kmeans", {}, one_unit_per_matmul);
  try {
    rdu::run(tiny_grid(), g);
    FAIL() << "kmeans does not fit 4 PCUs";
  } catch (const not_supported& e) {
    EXPECT_NE(std::string(e.what()).find("splitting the loop-carried buffer"), std::string::npos) << e.what();
  }
}

TEST(RduPrograms, TilesThatDoNotDivideAreRejectedBeforeTheSimulator) {
  try {
    compiled("blackscholes", {"N=1000", "TS=300"});
    FAIL() << "TS=300 does not divide N=1000";
  } catch (const user_error& e) {
    EXPECT_NE(std::string(e.what()).find("mask=1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(compiled("blackscholes", {"Q=3"}), user_error);
}
