// Architecture files: the figures derived from the presets are the published ones, derived quantities
// follow their keys, a changed key moves the simulated cycles the expected way, and bad files name the key
// and what is expected.
#include <gtest/gtest.h>

#include "backends/rdu/arch.h"
#include "core/error.h"
#include "tests/backends/rdu/compiled.h"

using namespace mp::rdu;

namespace {

std::string error_of(const std::string& text) {
  try {
    parse_arch(text, "bad.arch");
  } catch (const mp::user_error& e) {
    return e.what();
  }
  return "(no error)";
}

const char* kMinimal =
    "name = tiny\ngrid.rows = 2\ngrid.cols = 2\nmemory.ddr.channels = 1\nmemory.ddr.channel_gbs = 12.8\n";

}  // namespace

// The figures the model derives from a preset's keys (units from the grid, peak flops from units x lanes
// x stages, off-chip bandwidth from channels x per-channel rate, on-chip memory from units x banks x bank
// size) against the figures the papers publish; no key is read back as written.
TEST(RduArch, DerivedFiguresOfThePresetsAreThePublishedOnes) {
  Arch p = load_arch("plasticine");  // ISCA 2017: 64 PCUs, 64 PMUs, 12.3 TFLOPS, 16 MiB, 51.2 GB/s
  EXPECT_EQ(p.pcus(), 64);
  EXPECT_EQ(p.pmus(), 64);
  EXPECT_NEAR(p.peak_flops_per_cycle() * p.clock_ghz / 1e3, 12.3, 0.05);  // TFLOPS
  EXPECT_NEAR(p.pmus() * double(p.pmu_bytes()) / (1024.0 * 1024), 16, 1e-9);
  EXPECT_NEAR(p.memory().peak_gbs(), 51.2, 1e-9);
  Arch s = load_arch("sn40l");  // slide 47: 1,040 PCUs and PMUs, 638 TFLOPS bf16, 520 MB SRAM
  EXPECT_EQ(s.pcus(), 1040);
  EXPECT_EQ(s.pmus(), 1040);
  EXPECT_NEAR(s.pmus() * double(s.pmu_bytes()) / (1024.0 * 1024), 520, 0.5);
  EXPECT_NEAR(s.peak_flops_per_cycle() * s.clock_ghz / 1e3, 638, 1.0);
  EXPECT_EQ(s.memory().name, "hbm");  // program tensors live in HBM, the DDR tier behind it
}

TEST(RduArch, PeakBandwidthIsChannelsTimesThePerChannelRate) {
  for (int channels : {1, 3, 8})
    for (double gbs : {12.8, 25.6, 51.2}) {
      Arch a = parse_arch(kMinimal, "tiny.arch");
      apply_override(a, "memory.ddr.channels=" + std::to_string(channels));
      apply_override(a, "memory.ddr.channel_gbs=" + std::to_string(gbs));
      EXPECT_NEAR(a.memory().peak_gbs(), channels * gbs, 1e-9) << channels << " x " << gbs;
    }
}

TEST(RduArch, PeakFlopsScaleWithUnitsLanesAndStagesAndTakeTheSystolicModeWhenLarger) {
  Arch a = parse_arch(kMinimal, "tiny.arch");  // 2 x 2 grid: 2 PCUs
  const double base = a.peak_flops_per_cycle();
  EXPECT_DOUBLE_EQ(base, 2.0 * a.pcu_lanes * a.pcu_stages * 2);  // FMA = 2 flops
  apply_override(a, "pcu.lanes=" + std::to_string(2 * a.pcu_lanes));
  EXPECT_DOUBLE_EQ(a.peak_flops_per_cycle(), 2 * base);
  apply_override(a, "grid.cols=4");  // 4 x 2 grid: 4 PCUs
  EXPECT_EQ(a.pcus(), 4);
  EXPECT_DOUBLE_EQ(a.peak_flops_per_cycle(), 4 * base);
  // a systolic array of 8 x 8 MACs per PCU is below 32 lanes x 6 stages = 192 FMAs; 32 x 16 is above
  apply_override(a, "pcu.systolic=true");
  apply_override(a, "pcu.systolic_rows=8");
  apply_override(a, "pcu.systolic_cols=8");
  EXPECT_DOUBLE_EQ(a.peak_flops_per_cycle(), 4 * base);
  apply_override(a, "pcu.systolic_rows=32");
  apply_override(a, "pcu.systolic_cols=16");
  EXPECT_DOUBLE_EQ(a.peak_flops_per_cycle(), 4.0 * 32 * 16 * 2);
}

// A changed key moves the simulated time the way the model says: the dot product streams its inputs
// (memory-bound: channels, per-channel rate and latency matter, PCU width does not; DRAM timing is in ns,
// so a faster clock means more cycles for the same time), the slide-51 matmul is paced by its matmul stage
// (compute-bound: pipeline stages and lanes per PCU matter).
TEST(RduArch, AChangedKeyMovesTheCyclesTheExpectedWay) {
  auto result = [](const std::string& program, const std::vector<std::string>& sets,
                   const std::vector<std::string>& keys) {
    Arch a = load_arch("plasticine");
    for (auto& k : keys) apply_override(a, k);
    Graph g = mp::test::compiled(program, sets);
    return run(a, g);
  };
  const std::vector<std::string> dot = {"N=262144", "TS=8192"};
  const RunResult d = result("dotproduct", dot, {});
  EXPECT_GT(result("dotproduct", dot, {"memory.ddr.channels=1"}).cycles, 3 * d.cycles);
  EXPECT_LT(result("dotproduct", dot, {"memory.ddr.channel_gbs=25.6"}).cycles, 0.7 * d.cycles);
  EXPECT_GT(result("dotproduct", dot, {"memory.ddr.latency_ns=500"}).cycles, d.cycles);
  // PCU width barely matters; what moves is where the channels' postponed refreshes fall: they are
  // issued in stretches with an empty queue, which shift with the compute's timing (14 or 3 of 20).
  EXPECT_NEAR(result("dotproduct", dot, {"pcu.lanes=32"}).cycles, d.cycles, 0.025 * d.cycles);
  const RunResult d2 = result("dotproduct", dot, {"clock_ghz=2"});
  EXPECT_NEAR(d2.cycles / d.cycles, 2.0, 0.1);
  EXPECT_NEAR(d2.seconds, d.seconds, 0.05 * d.seconds);

  const std::vector<std::string> mm = {"M=256", "N=256", "K=256", "MM=64", "NN=32"};
  const RunResult m = result("matmul", mm, {});
  const double half_stages = result("matmul", mm, {"pcu.stages=3"}).cycles / m.cycles;
  EXPECT_GT(half_stages, 1.6);  // the matmul's initiation interval doubles
  EXPECT_LE(half_stages, 2.0);
  EXPECT_LT(result("matmul", mm, {"pcu.lanes=32"}).cycles, m.cycles);
  EXPECT_LT(result("matmul", mm, {"clock_ghz=2"}).seconds, m.seconds);
}

TEST(RduArch, MinimalFileAndOverrides) {
  Arch a = parse_arch(kMinimal, "tiny.arch");
  EXPECT_EQ(a.pcus() + a.pmus(), 4);
  apply_override(a, "pcu.lanes=32");
  EXPECT_EQ(a.pcu_lanes, 32);
  apply_override(a, "memory.ddr.channels = 3");
  EXPECT_EQ(a.memory().channels, 3);
}

TEST(RduArch, BadFilesNameTheKeyAndWhatIsExpected) {
  std::string base = kMinimal;
  EXPECT_NE(error_of(base + "pcu.lanez = 4\n").find("unknown key 'pcu.lanez'"), std::string::npos);
  EXPECT_NE(error_of(base + "pcu.lanes = four\n")
                .find("key 'pcu.lanes' expects an integer in [1, 4096], got 'four'"),
            std::string::npos);
  EXPECT_NE(error_of(base + "pcu.lanes = -2\n").find("pcu.lanes"), std::string::npos);
  EXPECT_NE(error_of(base + "clock_ghz = 0\n").find("key 'clock_ghz' expects a number in [0.001, 100]"),
            std::string::npos);
  EXPECT_NE(error_of(base + "grid.layout = hexagonal\n").find("checkerboard"), std::string::npos);
  EXPECT_NE(error_of(base + "pcu.systolic = maybe\n").find("true or false"), std::string::npos);
  EXPECT_NE(error_of(base + "memory.ddr.speed = 3\n").find("unknown memory field 'speed'"),
            std::string::npos);
  EXPECT_NE(error_of(base + "grid.rows\n").find("bad.arch:6: expected 'key = value'"), std::string::npos);
  EXPECT_NE(error_of("grid.rows = 2\n").find("no off-chip memory"), std::string::npos);
  EXPECT_NE(error_of(base + "program_memory = hbm\n").find("'program_memory' names 'hbm'"),
            std::string::npos);
  EXPECT_NE(error_of(base + "memory.ddr.row_bytes = 100\n").find("multiple of memory.ddr.burst_bytes"),
            std::string::npos);
  Arch a = parse_arch(kMinimal, "tiny.arch");
  EXPECT_THROW(apply_override(a, "pcu.lanes"), mp::user_error);
  EXPECT_THROW(load_arch("no-such-preset"), mp::user_error);
}
