// `metapipe systolic` as a user runs it: SCALE-Sim's reports written under OUTDIR/RUN_NAME, one-line errors
// naming the bad file, and nothing written when the input is bad.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/support/run_cli.h"

namespace {

namespace fs = std::filesystem;
const std::string kData = MP_SYSTOLIC_TEST_DATA;

using Result = mp::test::CliResult;
Result run(const std::string& args) { return mp::test::run_cli(args); }

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("mp_systolic_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  return d;
}

TEST(SystolicCli, WritesScaleSimReports) {
  const fs::path out = fresh_dir("reports");
  auto r = run("systolic -c " + kData + "/gemm_32x32_os.cfg -t " + kData + "/gemm64.csv -i gemm -p " +
               out.string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("503"), std::string::npos) << r.out;
  for (const char* f : {"COMPUTE_REPORT.csv", "BANDWIDTH_REPORT.csv", "DETAILED_ACCESS_REPORT.csv"})
    EXPECT_EQ(slurp(out / "gemm_32x32_os" / f), slurp(fs::path(kData) / "expected" / "gemm_32x32_os" / f))
        << f;
  fs::remove_all(out);
}

TEST(SystolicCli, CycleModeChecksProductAndCyclesAndPlots) {
  const fs::path out = fresh_dir("cycle");
  fs::create_directories(out);
  const fs::path svg = out / "plot.svg";
  auto r = run("systolic -c " + kData + "/conv_6x4_ws.cfg -t " + kData +
               "/conv_small.csv --mode cycle --plot " + svg.string());
  ASSERT_EQ(r.status, 0) << r.out;
  // 3,503 is SCALE-Sim's total for conv_a (data/expected/conv_6x4_ws), which has no stalls.
  EXPECT_NE(r.out.find("ok: 3,503 cycles (analytical 3,503)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
  const std::string s = slurp(svg);
  EXPECT_EQ(s.rfind("<svg", 0), 0u);
  EXPECT_NE(s.find("output stationary"), std::string::npos);
  EXPECT_NE(s.find("conv_b"), std::string::npos);
  fs::remove_all(out);
}

TEST(SystolicCli, HelpStartsWithUsage) {
  auto r = run("systolic --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out.rfind("usage: metapipe systolic", 0), 0u) << r.out;
}

// Bad input: exit 1, one line naming the file and what is wrong, and OUTDIR not created.
TEST(SystolicCli, BadInputIsOneLineAndWritesNothing) {
  const fs::path tmp = fresh_dir("bad");
  fs::create_directories(tmp);
  std::ofstream(tmp / "bad.cfg") << "[general]\nrun_name = x\n[run_presets]\nInterfaceBandwidth: "
                                    "CALC\n[architecture_presets]\nArrayHeight: 8\n";
  std::ofstream(tmp / "bad.csv") << "Layer, M, N, K,\ng, 4, zero, 4,\n";
  const fs::path out = tmp / "out";
  struct BadCase {
    std::string args, expect;
  } cases[] = {
      {"-c " + (tmp / "bad.cfg").string() + " -t " + kData + "/gemm64.csv -i gemm",
       "bad.cfg: missing key ArrayWidth in [architecture_presets]"},
      {"-c " + kData + "/gemm_32x32_ws.cfg -t " + (tmp / "bad.csv").string() + " -i gemm",
       "bad.csv:2: column 3 (N) must be an integer, got 'zero'"},
      {"-c " + kData + "/gemm_32x32_ws.cfg -t " + kData + "/gemm64.csv -i gemm --plot x.png",
       "not supported yet: PNG plots"},
      {"-c " + kData + "/gemm_32x32_ws.cfg -t " + kData + "/gemm64.csv -i matrix",
       "-i/--input-type must be conv or gemm"},
      {"-c " + kData + "/missing.cfg -t " + kData + "/gemm64.csv",
       "missing.cfg: cannot open the config file"},
  };
  for (const auto& c : cases) {
    auto r = run("systolic " + c.args + " -p " + out.string());
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(out)) << c.args;
  }
  fs::remove_all(tmp);
}

}  // namespace
