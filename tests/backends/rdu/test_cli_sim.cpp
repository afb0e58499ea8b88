// `metapipe sim` end to end: help, JSON fields, functional check, architecture files and their errors, and
// the demo's rdu rows.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "tests/support/run_cli.h"

namespace {

using Out = mp::test::CliResult;
Out sh(const std::string& args) { return mp::test::run_cli(args); }

}  // namespace

TEST(RduCli, HelpStartsWithUsage) {
  auto o = sh("sim --help");
  EXPECT_EQ(o.status, 0);
  EXPECT_EQ(o.out.rfind("usage: metapipe sim", 0), 0u) << o.out;
}

TEST(RduCli, JsonReportHasTheRequiredFields) {
  auto o = sh("sim matmul --arch sn40l --json");
  ASSERT_EQ(o.status, 0) << o.out;
  for (const char* k :
       {"\"cycles\"", "\"seconds\"", "\"kernel_calls\"", "\"utilization\"", "\"bytes_read\"",
        "\"bytes_written\"", "\"load_bw_pct\"", "\"store_bw_pct\"", "\"busy_cycles\"", "\"stall_cycles\""})
    EXPECT_NE(o.out.find(k), std::string::npos) << k;
}

TEST(RduCli, FunctionalRunChecksAgainstTheReference) {
  auto o = sh("sim gda --functional");
  EXPECT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("functional check vs naive C++ reference"), std::string::npos);
  EXPECT_NE(o.out.find(": ok"), std::string::npos) << o.out;
  auto g = sh("sim kmeans --functional --arch sn40l");
  EXPECT_EQ(g.status, 0) << g.out;
}

namespace {
double number_after(const std::string& out, const std::string& key) {  // "KEY 1,234" -> 1234
  size_t at = out.find(key);
  if (at == std::string::npos) return -1;
  std::string digits;
  for (size_t i = at + key.size(); i < out.size() && (isdigit(out[i]) || out[i] == ','); ++i)
    if (out[i] != ',') digits += out[i];
  return digits.empty() ? -1 : std::stod(digits);
}
}  // namespace

// OuterProduct's default tiles (32 x 64: 256-byte rows of C, each opening an HBM row) suit Plasticine's
// DDR but not the SN40L's 32 HBM channels: left to choose, metapipe sim searches the tiles on the cycle
// model, says what it chose, and reaches 85 % of the HBM roof (1024^2 here for speed; 4096^2 gives the
// same choice, docs/rdu.md). Fixing the tiles with --set keeps them exactly, with no search.
TEST(RduCli, TilesTheUserDidNotFixAreChosenForTheArchitecture) {
  auto chosen = sh("sim outerproduct --arch sn40l --set M=1024 --set N=1024 --quiet");
  ASSERT_EQ(chosen.status, 0) << chosen.out;
  EXPECT_NE(chosen.out.find("note: tile chosen: TM="), std::string::npos) << chosen.out;
  const double cycles = number_after(chosen.out, "outerproduct on sn40l: ");
  const double roof = number_after(chosen.out, "off-chip bandwidth ");
  ASSERT_GT(cycles, 0) << chosen.out;
  EXPECT_GE(roof / cycles, 0.85) << chosen.out;
  auto fixed = sh("sim outerproduct --arch sn40l --set M=1024 --set N=1024 --set TM=32 --set TN=64 --quiet");
  ASSERT_EQ(fixed.status, 0) << fixed.out;
  EXPECT_NE(fixed.out.find(" TM=32 TN=64 "), std::string::npos) << fixed.out;
  EXPECT_EQ(fixed.out.find("tile chosen"), std::string::npos) << fixed.out;
  EXPECT_GT(number_after(fixed.out, "outerproduct on sn40l: "), 1.1 * cycles) << fixed.out;
  // one tile fixed, the other still chosen
  auto half = sh("sim outerproduct --arch sn40l --set M=1024 --set N=1024 --set TM=32 --quiet");
  ASSERT_EQ(half.status, 0) << half.out;
  EXPECT_NE(half.out.find(" TM=32 "), std::string::npos) << half.out;
}

TEST(RduCli, ArchitectureFilesOverridesAndTheirErrors) {
  const std::string dir = testing::TempDir();
  {
    std::ofstream f(dir + "/ok.arch");
    f << "name = tiny\ngrid.rows = 4\ngrid.cols = 8\nmemory.ddr.channels = 1\nmemory.ddr.channel_gbs = "
         "12.8\n";
  }
  auto o = sh("sim dotproduct --arch " + dir + "/ok.arch --set pcu.lanes=32 --svg " + dir + "/p.svg");
  EXPECT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("dotproduct on tiny"), std::string::npos) << o.out;
  std::ifstream svg(dir + "/p.svg");
  std::string first;
  std::getline(svg, first);
  EXPECT_EQ(first.rfind("<svg", 0), 0u);
  {
    std::ofstream f(dir + "/bad.arch");
    f << "grid.rows = 4\npcu.lanes = many\n";
  }
  auto b = sh("sim dotproduct --arch " + dir + "/bad.arch");
  EXPECT_EQ(b.status, 1);
  EXPECT_NE(b.out.find("bad.arch:2: key 'pcu.lanes' expects an integer in [1, 4096], got 'many'"),
            std::string::npos)
      << b.out;
  auto s = sh("sim dotproduct --set pcu.lanez=3");
  EXPECT_EQ(s.status, 1);
  EXPECT_NE(s.out.find("unknown key 'pcu.lanez'"), std::string::npos) << s.out;
  auto u = sh("sim no_such_program");
  EXPECT_EQ(u.status, 2);
  EXPECT_NE(u.out.find("unknown program 'no_such_program'"), std::string::npos) << u.out;
}

// One path per program: the demo's rdu rows are the registry programs (compiled and simulated), one row
// per program and preset, nothing else.
TEST(RduCli, DemoShowsOneRowPerProgramAndPreset) {
  auto u = sh("sim no_such_program");
  const size_t at = u.out.find("(programs: ");
  ASSERT_NE(at, std::string::npos) << u.out;
  std::set<std::string> programs;
  {
    std::string list = u.out.substr(at + 11, u.out.find(')', at) - at - 11);
    std::istringstream in(list);
    for (std::string name; std::getline(in, name, ',');)
      programs.insert(name.substr(name.find_first_not_of(' ')));
  }
  EXPECT_GE(programs.size(), 11u);
  auto d = sh("demo --quick --target rdu");
  ASSERT_EQ(d.status, 0) << d.out;
  std::map<std::string, std::multiset<std::string>> rows;  // target -> programs
  std::istringstream in(d.out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string program, target;
    words >> program >> target;
    if (target.rfind("rdu:", 0) == 0) rows[target].insert(program);
  }
  ASSERT_EQ(rows.size(), 2u) << d.out;
  for (auto& [target, names] : rows)
    EXPECT_EQ(names, std::multiset<std::string>(programs.begin(), programs.end())) << target << "\n" << d.out;
  EXPECT_EQ(d.out.find("graph:"), std::string::npos) << d.out;
}
