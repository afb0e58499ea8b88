// The benchmark programs: functional simulation equals the naive reference on both presets (also when the
// program is split into several kernel calls), and the published BlackScholes figure is reproduced.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/rdu/arch.h"
#include "backends/rdu/programs.h"
#include "backends/rdu/rdu.h"
#include "core/compare.h"
#include "core/error.h"
#include "core/random.h"

using namespace mp::rdu;

namespace {

// Runs functionally with poisoned outputs and compares every output tensor with the reference.
void check_functional(const Arch& a, const GraphProgram& p, const Params& prm, uint64_t seed,
                      int* calls = nullptr, bool place = true) {
  Graph g = p.build(prm, true, seed);
  auto ref = p.reference(g, prm);
  for (auto& [name, want] : ref)
    for (auto& t : g.tensors)
      if (t.name == name) t.host.assign(want.size(), std::nanf(""));
  RunOptions o;
  o.functional = true;
  o.place = place;
  auto r = run(a, g, o);
  if (calls) *calls = r.kernel_calls;
  for (auto& [name, want] : ref)
    for (auto& t : g.tensors)
      if (t.name == name) {
        ASSERT_EQ(t.host.size(), want.size()) << p.name << " " << name;
        auto c = mp::compare(std::span<const float>(t.host), std::span<const double>(want), 1e-4, 1e-3);
        EXPECT_TRUE(c.ok) << p.name << " on " << a.name << " (seed " << seed << "): " << name << ": "
                          << c.summary();
      }
}

}  // namespace

TEST(RduPrograms, FunctionalSimulationMatchesTheReferenceOnBothPresets) {
  const uint64_t seed = mp::fresh_seed();
  for (const char* an : {"plasticine", "sn40l"}) {
    Arch a = load_arch(an);
    // values do not depend on placement; the SN40L's 2,080-unit grid is placed in the other tests
    for (auto& p : graph_programs())
      check_functional(a, p, resolve_params(p, {}, true), seed, nullptr, a.name != "sn40l");
  }
}

TEST(RduPrograms, FunctionalResultsSurviveSplittingIntoKernelCalls) {
  Arch a = load_arch("plasticine");
  apply_override(a, "grid.rows=2");
  apply_override(a, "grid.cols=4");
  const uint64_t seed = mp::fresh_seed();
  for (const char* name : {"gda", "gemm"}) {
    const GraphProgram* p = find_graph_program(name);
    int calls = 0;
    check_functional(a, *p, resolve_params(*p, {"par=1"}, true), seed, &calls);
    if (std::string(name) == "gda") {
      EXPECT_GT(calls, 1);
    }
  }
}

TEST(RduPrograms, LoopCarriedBuffersAreNotSplitAcrossKernelCalls) {
  Arch a = load_arch("plasticine");
  apply_override(a, "grid.rows=2");
  apply_override(a, "grid.cols=4");
  const GraphProgram* p = find_graph_program("kmeans");
  Graph g = p->build(resolve_params(*p, {"par=1"}, true), false, 1);
  try {
    run(a, g);
    FAIL() << "kmeans does not fit 4 PCUs";
  } catch (const mp::not_supported& e) {
    EXPECT_NE(std::string(e.what()).find("loop-carried buffer 'centroids'"), std::string::npos) << e.what();
  }
}

TEST(RduPrograms, TilesThatDoNotDivideAreRejected) {
  const GraphProgram* p = find_graph_program("blackscholes");
  try {
    p->build(resolve_params(*p, {"N=1000", "ts=300"}, false), false, 1);
    FAIL();
  } catch (const mp::user_error& e) {
    EXPECT_NE(std::string(e.what()).find("ts=300 does not divide N=1000"), std::string::npos) << e.what();
  }
  EXPECT_THROW(resolve_params(*p, {"Q=3"}, false), mp::user_error);
}

// Spatial (Koeplinger et al., PLDI 2018) reports BlackScholes with 960,000 options on a 16 x 8 Plasticine
// with one DDR3-1600 channel (12.8 GB/s) at 2.33 ms, using 77.4 % of the load bandwidth. The model: 24 bytes
// loaded and 4 stored per option share the one channel; DRAM refresh, row misses and read/write turnarounds
// cost what the JEDEC timings in plasticine.arch say. No constant is fitted to the figure.
TEST(RduPrograms, BlackScholesReproducesTheSpatialFigure) {
  Arch a = load_arch("plasticine");
  apply_override(a, "memory.ddr.channels=1");
  const GraphProgram* p = find_graph_program("blackscholes");
  Graph g = p->build(p->defaults, false, 1);
  ASSERT_EQ(p->defaults.at("N"), 960000);
  auto r = run(a, g);
  const double ms = r.seconds * 1e3;
  EXPECT_NEAR(ms, 2.33, 0.15 * 2.33) << ms << " ms";
  EXPECT_NEAR(r.load_bw_pct, 77.4, 0.15 * 77.4) << r.load_bw_pct << " %";
  EXPECT_EQ(r.bytes_read, 960000LL * 24);
  EXPECT_EQ(r.bytes_written, 960000LL * 4);
  EXPECT_EQ(r.kernel_calls, 1);
}
