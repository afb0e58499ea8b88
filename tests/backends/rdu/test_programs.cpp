// The registry programs compiled and lowered onto the simulated accelerator, on small grids: a program
// that does not fit becomes several kernel calls with the same results, what cannot be split yet says so,
// and bad tiles are rejected by the passes before anything reaches the simulator.
#include <gtest/gtest.h>

#include "backends/rdu/arch.h"
#include "core/error.h"
#include "core/random.h"
#include "tests/backends/rdu/compiled.h"

using namespace mp;
using mp::test::compiled;
using mp::test::run_functional;

namespace {

rdu::Arch small_grid(int rows, int cols) {
  rdu::Arch a = rdu::load_arch("plasticine");
  rdu::apply_override(a, "grid.rows=" + std::to_string(rows));
  rdu::apply_override(a, "grid.cols=" + std::to_string(cols));
  return a;
}

}  // namespace

// TPC-H Q6 needs 6 PMUs at once on a 2 x 5 grid (5 PMUs), the dot product 4 on a 2 x 3 one (3): each
// becomes two kernel calls, the running sum crossing between them through off-chip memory, and the
// results stay those of the reference.
TEST(RduPrograms, FunctionalResultsSurviveSplittingIntoKernelCalls) {
  const uint64_t seed = fresh_seed();
  struct Case {
    const char* program;
    int rows, cols;
  };
  for (const Case& c : {Case{"tpchq6", 2, 5}, Case{"dotproduct", 2, 3}}) {
    const rdu::Arch a = small_grid(c.rows, c.cols);
    rdu::Graph g = compiled(c.program);
    const rdu::RunResult whole = rdu::run(rdu::load_arch("plasticine"), g);
    rdu::RunResult r = run_functional(a, c.program, {}, seed);
    EXPECT_GT(r.kernel_calls, 1) << c.program;
    ASSERT_FALSE(r.split_reasons.empty()) << c.program;
    EXPECT_NE(r.split_reasons[0].find("does not fit"), std::string::npos) << r.split_reasons[0];
    EXPECT_EQ(whole.kernel_calls, 1) << c.program;
    EXPECT_GT(r.bytes_written, whole.bytes_written) << c.program << ": what crosses a call goes off chip";
    EXPECT_GE(r.cycles, whole.cycles + (r.kernel_calls - 1) * a.config_cycles) << c.program;
  }
}

TEST(RduPrograms, LoopCarriedBuffersAreNotSplitAcrossKernelCalls) {
  for (const char* name : {"kmeans", "gda", "gemm"}) {
    rdu::Graph g = compiled(name);
    try {
      rdu::run(small_grid(4, 4), g);
      FAIL() << name << " does not fit 8 PCUs and 8 PMUs in one call";
    } catch (const not_supported& e) {
      EXPECT_NE(std::string(e.what()).find("splitting the loop-carried buffer"), std::string::npos)
          << e.what();
    }
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
