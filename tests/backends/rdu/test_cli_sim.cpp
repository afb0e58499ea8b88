// `metapipe sim` end to end: help, JSON fields, functional check, architecture files and their errors.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>

namespace {

struct Out {
  int status;
  std::string text;
};

Out sh(const std::string& args) {
  std::string cmd = std::string(MP_CLI_PATH) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string text;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) text.append(buf.data(), n);
  int st = pclose(p);
  return {WEXITSTATUS(st), text};
}

}  // namespace

TEST(RduCli, HelpStartsWithUsage) {
  auto o = sh("sim --help");
  EXPECT_EQ(o.status, 0);
  EXPECT_EQ(o.text.rfind("usage: metapipe sim", 0), 0u) << o.text;
}

TEST(RduCli, JsonReportHasTheRequiredFields) {
  auto o = sh("sim matmul --arch sn40l --json");
  ASSERT_EQ(o.status, 0) << o.text;
  for (const char* k :
       {"\"cycles\"", "\"seconds\"", "\"kernel_calls\"", "\"utilization\"", "\"bytes_read\"",
        "\"bytes_written\"", "\"load_bw_pct\"", "\"store_bw_pct\"", "\"busy_cycles\"", "\"stall_cycles\""})
    EXPECT_NE(o.text.find(k), std::string::npos) << k;
}

TEST(RduCli, FunctionalRunChecksAgainstTheReference) {
  auto o = sh("sim gda --functional");
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("functional check vs naive C++ reference"), std::string::npos);
  EXPECT_NE(o.text.find(": ok"), std::string::npos) << o.text;
  auto g = sh("sim graph:kmeans --functional --arch sn40l");
  EXPECT_EQ(g.status, 0) << g.text;
}

TEST(RduCli, ArchitectureFilesOverridesAndTheirErrors) {
  const std::string dir = testing::TempDir();
  {
    std::ofstream f(dir + "/ok.arch");
    f << "name = tiny\ngrid.rows = 4\ngrid.cols = 8\nmemory.ddr.channels = 1\nmemory.ddr.channel_gbs = "
         "12.8\n";
  }
  auto o = sh("sim dotproduct --arch " + dir + "/ok.arch --set pcu.lanes=32 --svg " + dir + "/p.svg");
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("dotproduct on tiny"), std::string::npos) << o.text;
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
  EXPECT_NE(b.text.find("bad.arch:2: key 'pcu.lanes' expects a positive integer, got 'many'"),
            std::string::npos)
      << b.text;
  auto s = sh("sim dotproduct --set pcu.lanez=3");
  EXPECT_EQ(s.status, 1);
  EXPECT_NE(s.text.find("unknown key 'pcu.lanez'"), std::string::npos) << s.text;
  auto u = sh("sim no_such_program");
  EXPECT_EQ(u.status, 2);
  EXPECT_NE(u.text.find("unknown program 'no_such_program'"), std::string::npos) << u.text;
}
