// Extreme and malformed inputs to `metapipe systolic`: each ends fast with exit 1 (bad input) or 2 (bad
// usage) and one line naming the input and the range or limit, and nothing is written to -p OUTDIR.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/run_cli.h"

namespace {

namespace fs = std::filesystem;
const std::string kData = MP_SYSTOLIC_TEST_DATA;

struct Tmp {
  fs::path dir = fs::temp_directory_path() / ("mp_systolic_extreme_" + std::to_string(getpid()));
  Tmp() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Tmp() { fs::remove_all(dir); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  }
};

// A CALC config of the given array; `extra` lines go into [architecture_presets].
std::string config(int64_t rows, int64_t cols, const std::string& extra = "") {
  return "[general]\nrun_name = x\n[architecture_presets]\nArrayHeight: " + std::to_string(rows) +
         "\nArrayWidth: " + std::to_string(cols) +
         "\nIfmapSramSzkB: 64\nFilterSramSzkB: 64\nOfmapSramSzkB: 64\nIfmapOffset: 0\n"
         "FilterOffset: 10000000\nOfmapOffset: 20000000\nDataflow: ws\n" +
         extra + "[run_presets]\nInterfaceBandwidth: CALC\n";
}

// Runs `metapipe systolic ARGS -p OUT` and checks the exit status, that the output is the one line holding
// `expect`, that it took at most a few seconds, and that OUT was not created.
void expect_error(const Tmp& t, const std::string& args, int status, const std::string& expect) {
  const fs::path out = t.dir / "out";
  const auto t0 = std::chrono::steady_clock::now();
  auto r = mp::test::run_cli("systolic " + args + " -p " + out.string());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status, status) << args << "\n" << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_NE(r.out.find(expect), std::string::npos) << "expected '" << expect << "' in: " << r.out;
  EXPECT_LT(secs, 5.0) << args;
  EXPECT_FALSE(fs::exists(out)) << args;
}

TEST(SystolicExtreme, HugeArrayInCycleModeIsRefusedByTheWorkLimit) {
  Tmp t;
  const std::string cfg = t.write("big.cfg", config(65536, 65536));
  expect_error(t, "-c " + cfg + " -t " + kData + "/gemm64.csv -i gemm --mode cycle", 1,
               "PE updates and memory-model steps, above the limit 2e+10; shrink the layer or the array, "
               "or raise --max-work");
  // The same input within a raised limit is not refused by the estimate (it would then run for a long
  // time, so only the limit's syntax is exercised here).
  expect_error(t, "-c " + cfg + " -t " + kData + "/gemm64.csv -i gemm --mode cycle --max-work 1x", 2,
               "--max-work expects a positive integer with an optional suffix");
}

TEST(SystolicExtreme, WorkAndMemoryLimitsCanBeLowered) {
  Tmp t;
  // gemm64.csv on a 32x32 array is tiny; a limit of 1k steps refuses it, naming the layer.
  expect_error(t, "-c " + kData + "/gemm_32x32_ws.cfg -t " + kData + "/gemm64.csv -i gemm --max-work 1k", 1,
               "above the limit 1000; shrink the layer or the array, or raise --max-work");
  expect_error(t, "-c " + kData + "/gemm_32x32_ws.cfg -t " + kData + "/gemm64.csv -i gemm --max-memory 1KiB",
               1, "of memory, above the limit 1.0 KiB; shrink the layer, or raise --max-memory");
  // and a raised limit lets the run through
  auto r = mp::test::run_cli("systolic -c " + kData + "/gemm_32x32_ws.cfg -t " + kData +
                             "/gemm64.csv -i gemm --max-work 1G --max-memory 1GiB --quiet");
  EXPECT_EQ(r.status, 0) << r.out;
}

TEST(SystolicExtreme, GemmTopologyOfTwoToThe24OnEveryAxis) {
  Tmp t;
  const std::string csv = t.write("huge.csv", "Layer, M, N, K,\ng, 16777216, 16777216, 16777216,\n");
  expect_error(t, "-c " + kData + "/gemm_32x32_ws.cfg -t " + csv + " -i gemm", 1,
               "huge.csv:2: layer 'g' is too large: M x K x N (multiply-accumulates) exceeds 2^56");
  // within the product limits but far beyond the work limit
  const std::string big = t.write("big.csv", "Layer, M, N, K,\ng, 65536, 65536, 65536,\n");
  expect_error(t, "-c " + kData + "/gemm_32x32_ws.cfg -t " + big + " -i gemm", 1,
               "layer 'g' (M x K x N = 65536 x 65536 x 65536 on a 32x32 array, ws) needs about");
  const std::string over = t.write("over.csv", "Layer, M, N, K,\ng, 16777217, 4, 4,\n");
  expect_error(t, "-c " + kData + "/gemm_32x32_ws.cfg -t " + over + " -i gemm", 1,
               "over.csv:2: column 2 (M) must be at most 2^24 = 16777216, got 16777217");
}

TEST(SystolicExtreme, ConvLayers) {
  Tmp t;
  const std::string dp =
      t.write("dp.csv",
              "Layer, IFMAP H, IFMAP W, Filter H, Filter W, Channels, Num Filter, Stride,\n"
              "DP1, 8, 8, 3, 3, 16777216, 1, 1,\n");
  expect_error(t, "-c " + kData + "/conv_6x4_ws.cfg -t " + dp, 1,
               "dp.csv:2: depthwise layer 'DP1' has 16777216 channels and would expand to one layer per "
               "channel; a topology holds at most 65536 layers");
  // a 2^24 x 2^24 IFMAP fits the products but not the work limit
  const std::string ifmap =
      t.write("ifmap.csv",
              "Layer, IFMAP H, IFMAP W, Filter H, Filter W, Channels, Num Filter, Stride,\n"
              "c1, 16777216, 16777216, 3, 3, 3, 8, 1,\n");
  expect_error(t, "-c " + kData + "/conv_6x4_ws.cfg -t " + ifmap, 1,
               "layer 'c1' (M x K x N = 281474909601796 x 27 x 8 on a 6x4 array, ws) needs about 2.81e+16 "
               "memory-model steps, above the limit 2e+10");
  const std::string deep =
      t.write("deep.csv",
              "Layer, IFMAP H, IFMAP W, Filter H, Filter W, Channels, Num Filter, Stride,\n"
              "c2, 16777216, 16777216, 1, 1, 16777216, 8, 1,\n");
  expect_error(t, "-c " + kData + "/conv_6x4_ws.cfg -t " + deep, 1,
               "deep.csv:2: layer 'c2' is too large: IFMAP height x width x channels exceeds 2^56");
  const std::string filter =
      t.write("filter.csv",
              "Layer, IFMAP H, IFMAP W, Filter H, Filter W, Channels, Num Filter, Stride,\n"
              "c4, 16777216, 16777216, 16777216, 16777216, 16777216, 8, 1,\n");
  expect_error(t, "-c " + kData + "/conv_6x4_ws.cfg -t " + filter, 1,
               "filter.csv:2: layer 'c4' is too large: filter height x width x channels (K) exceeds 2^56");
  // within the work limit on a 1x1 array (one output pixel, a 2^31-word window), but its address tables
  // and buffer stamps would not fit the memory limit
  const std::string window =
      t.write("window.csv",
              "Layer, IFMAP H, IFMAP W, Filter H, Filter W, Channels, Num Filter, Stride,\n"
              "c3, 32768, 32768, 32768, 32768, 2, 1, 1,\n");
  expect_error(t, "-c " + t.write("one.cfg", config(1, 1)) + " -t " + window, 1,
               "layer 'c3' (M x K x N = 1 x 2147483648 x 1 on a 1x1 array, ws) needs about 48.0 GiB of "
               "memory, above the limit 8.0 GiB; shrink the layer, or raise --max-memory");
}

TEST(SystolicExtreme, ConfigRangesAndDuplicates) {
  Tmp t;
  const std::string topo = " -t " + kData + "/gemm64.csv -i gemm";
  expect_error(t, "-c " + t.write("a.cfg", config(65537, 8)) + topo, 1,
               "a.cfg:4: ArrayHeight must be in [1, 65536], got 65537");
  expect_error(
      t, "-c " + t.write("b.cfg", config(8, 8, "IfmapOffset: 9223372036854775807\n")) + topo, 1,
      "b.cfg:13: key IfmapOffset in [architecture_presets] is given twice (first on line 9); keep one");
  std::string c = config(8, 8);
  c.replace(c.find("IfmapSramSzkB: 64"), 17, "IfmapSramSzkB: 9223372036854775807");
  expect_error(t, "-c " + t.write("c.cfg", c) + topo, 1,
               "c.cfg:6: IfmapSramSzkB must be in [1, 1073741824], got 9223372036854775807");
  c = config(8, 8);
  c.replace(c.find("IfmapOffset: 0"), 14, "IfmapOffset: 9223372036854775807");
  expect_error(t, "-c " + t.write("d.cfg", c) + topo, 1,
               "d.cfg:9: IfmapOffset must be in [0, 281474976710656], got 9223372036854775807");
  expect_error(t, "-c " + t.write("e.cfg", config(8, 8) + "[general]\nx = 1\n") + topo, 1,
               "e.cfg:15: section [general] is given twice (first on line 1); merge the two");
  c = config(8, 8, "Bandwidth: 1099511627776\n");
  c.replace(c.find("CALC"), 4, "USER");
  expect_error(t, "-c " + t.write("f.cfg", c) + topo, 1,
               "f.cfg:13: Bandwidth must be a comma-separated list of integers in [1, 1048576]");
}

}  // namespace
