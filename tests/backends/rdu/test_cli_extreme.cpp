// Extreme and malformed inputs to `metapipe sim` and `metapipe run`: architecture keys out of range,
// non-finite or given twice, program parameters beyond their range, and work or memory beyond the
// limits. Each ends fast with exit 1 (bad input) or 2 (bad usage) and one line naming the input.
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

void expect_error(const std::string& args, int status, const std::string& expect) {
  const auto t0 = std::chrono::steady_clock::now();
  auto r = mp::test::run_cli(args);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status, status) << args << "\n" << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_NE(r.out.find(expect), std::string::npos) << "expected '" << expect << "' in: " << r.out;
  EXPECT_LT(secs, 5.0) << args;
}

std::string arch_file(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / (name + "_" + std::to_string(getpid()) + ".arch");
  std::ofstream(p) << text;
  return p.string();
}
const char* kMinimalArch = "memory.ddr.channels = 4\nmemory.ddr.channel_gbs = 12.8\n";

TEST(RduExtreme, ArchKeysOutOfRange) {
  expect_error("sim matmul --set grid.rows=3000000000", 1,
               "key 'grid.rows' expects an integer in [1, 1024], got '3000000000'");
  const std::string grid =
      arch_file("grid", std::string(kMinimalArch) + "grid.rows = 100000\ngrid.cols = 100000\n");
  expect_error("sim matmul --arch " + grid, 1,
               ":3: key 'grid.rows' expects an integer in [1, 1024], got '100000'");
  fs::remove(grid);
  expect_error("sim matmul --set pmu.bank_kb=9223372036854775807", 1,
               "key 'pmu.bank_kb' expects an integer in [1, 1048576], got '9223372036854775807'");
  expect_error("sim matmul --set clock_ghz=1e-300", 1,
               "key 'clock_ghz' expects a number in [0.001, 100], got '1e-300'");
  expect_error("sim matmul --set memory.ddr.latency_ns=1e300", 1,
               "key 'memory.ddr.latency_ns' expects a number in [0, 1e+06], got '1e300'");
  expect_error("sim matmul --set memory.ddr.channel_gbs=1e300", 1,
               "key 'memory.ddr.channel_gbs' expects a number in [0.001, 100000], got '1e300'");
  expect_error("sim matmul --set memory.ddr.channel_gbs=nan", 1,
               "key 'memory.ddr.channel_gbs' expects a number in [0.001, 100000], got 'nan'");
  expect_error("sim matmul --set memory.ddr.refresh_postpone=9", 1,
               "key 'memory.ddr.refresh_postpone' expects an integer in [0, 8], got '9'");
  expect_error(
      "sim matmul --set memory.ddr.refresh_ns=8000", 1,
      "key 'memory.ddr.refresh_ns' (8000) must be shorter than memory.ddr.refresh_interval_ns (7800)");
}

TEST(RduExtreme, DuplicateArchKeyNamesBothLines) {
  const std::string dup = arch_file("dup", std::string(kMinimalArch) + "pcu.lanes = 16\n\npcu.lanes = 32\n");
  expect_error("sim matmul --arch " + dup, 1,
               ":5: key 'pcu.lanes' is given twice (first on line 3); keep one");
  fs::remove(dup);
}

TEST(RduExtreme, ExtremeTimingStillSimulatesQuickly) {
  // the ends of the ranges: the slowest clock with the longest latency, the fastest clock with the
  // shortest refresh interval; the event loop must still finish (exit 0) in a moment
  for (const char* sets : {"--set clock_ghz=0.001 --set memory.ddr.latency_ns=1e6",
                           "--set clock_ghz=100 --set memory.ddr.refresh_ns=0.5 "
                           "--set memory.ddr.refresh_interval_ns=1 --set memory.ddr.latency_ns=1e6"}) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = mp::test::run_cli(std::string("sim dotproduct ") + sets);
    EXPECT_EQ(r.status, 0) << sets << "\n" << r.out;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0) << sets;
  }
}

TEST(RduExtreme, ProgramParametersOutOfRange) {
  expect_error("sim dotproduct --set N=1099511627776", 1,
               "parameter N=1099511627776 is out of range: it must be an integer in [0, 2147483647]");
  expect_error("run matmul --set M=1000000000000", 1,
               "parameter M=1000000000000 is out of range: it must be an integer in [0, 2147483647]");
  expect_error("run matmul --set M=9223372036854775807", 1,
               "parameter M=9223372036854775807 is out of range");
  expect_error("run matmul --set budget_kib=9223372036854775807", 1,
               "parameter budget_kib=9223372036854775807 is out of range: it must be an integer in [1, "
               "1073741824]");
  expect_error("run llama_decoder --set eps=nan", 1, "parameter eps=nan must be a finite number");
  expect_error("run llama_decoder --set theta=-1", 1,
               "parameter theta=-1 is out of range: it must be an integer in [2, 1000000000]");
  expect_error("run flash_attention --set p_drop=inf", 1, "parameter p_drop=inf must be a finite number");
}

TEST(RduExtreme, WorkAndMemoryLimits) {
  // within the parameter ranges, beyond what the engines are allowed to take by default
  expect_error(
      "sim dotproduct --set N=1073741824", 1,
      "needs about 6.46e+08 simulation events (stage iterations and memory bursts), above the limit 5e+08");
  expect_error("sim dotproduct --max-work 1k", 1,
               "above the limit 1000; make its sizes smaller (--set), or "
               "raise --max-work");
  expect_error("run matmul --set M=1048576 --set N=1048576", 1,
               "of host memory (largest tensor 'C': 1.1e+12 elements), above the limit 8.0 GiB");
  expect_error("sim matmul --functional --max-memory 1k", 1, "above the limit 1000 B");
  expect_error("run matmul --max-memory lots", 2, "--max-memory expects a positive integer");
  auto r = mp::test::run_cli("sim dotproduct --max-work 1G");
  EXPECT_EQ(r.status, 0) << r.out;
}

}  // namespace
