// Architecture files: presets carry the published figures; bad files name the key and what is expected.
#include <gtest/gtest.h>

#include "backends/rdu/arch.h"
#include "core/error.h"

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

TEST(RduArch, PlasticinePresetHasTheIsca2017Figures) {
  Arch a = load_arch("plasticine");
  EXPECT_EQ(a.cols, 16);
  EXPECT_EQ(a.rows, 8);
  EXPECT_EQ(a.pcus(), 64);
  EXPECT_EQ(a.pmus(), 64);
  EXPECT_EQ(a.pcu_lanes, 16);
  EXPECT_EQ(a.pcu_stages, 6);
  EXPECT_EQ(a.pmu_bytes(), 256 * 1024);
  EXPECT_DOUBLE_EQ(a.clock_ghz, 1.0);
  EXPECT_DOUBLE_EQ(a.memory().peak_gbs(), 51.2);
  EXPECT_NEAR(a.peak_flops_per_cycle() * a.clock_ghz / 1e3, 12.3, 0.05);  // TFLOPS
}

TEST(RduArch, Sn40lPresetHasTheSlide47Figures) {
  Arch a = load_arch("sn40l");
  EXPECT_EQ(a.pcus(), 1040);
  EXPECT_EQ(a.pmus(), 1040);
  EXPECT_NEAR(a.pmus() * double(a.pmu_bytes()) / (1024.0 * 1024), 520, 0.5);
  EXPECT_NEAR(a.peak_flops_per_cycle() * a.clock_ghz / 1e3, 638, 1.0);
  EXPECT_TRUE(a.pcu_systolic);
  EXPECT_EQ(a.memory().name, "hbm");
  ASSERT_EQ(a.memories.size(), 2u);
  EXPECT_NEAR(a.memories[0].capacity_gb, 64, 1e-9);
  EXPECT_NEAR(a.memories[1].capacity_gb, 1536, 1e-9);
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
  EXPECT_NE(
      error_of(base + "pcu.lanes = four\n").find("key 'pcu.lanes' expects a positive integer, got 'four'"),
      std::string::npos);
  EXPECT_NE(error_of(base + "pcu.lanes = -2\n").find("pcu.lanes"), std::string::npos);
  EXPECT_NE(error_of(base + "clock_ghz = 0\n").find("key 'clock_ghz' expects a positive number"),
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
