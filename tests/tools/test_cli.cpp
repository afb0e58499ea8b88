// The CLI frame, run as a user runs it: exit codes, one-line errors, --help everywhere, demo and info.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <thread>

#include "core/device.h"
#include "tests/support/run_cli.h"

namespace {

using Result = mp::test::CliResult;
Result run(const std::string& args) { return mp::test::run_cli(args); }

int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace

TEST(Cli, UnknownCommandIsOneLineError) {
  auto r = run("nonsense");
  EXPECT_NE(r.status, 0);
  EXPECT_EQ(lines(r.out), 1) << r.out;
  EXPECT_NE(r.out.find("unknown command 'nonsense'"), std::string::npos) << r.out;
}

TEST(Cli, UnknownOptionIsOneLineError) {
  auto r = run("demo --nonsense");
  EXPECT_NE(r.status, 0);
  EXPECT_EQ(lines(r.out), 1) << r.out;
  EXPECT_NE(r.out.find("unknown option '--nonsense'"), std::string::npos) << r.out;
}

// The commands the overview lists are exactly those with a tools/metapipe/cmd_NAME.cpp (one file per
// subcommand), and each answers --help with its usage line.
TEST(Cli, EverySubcommandHasHelp) {
  std::set<std::string> files;
  for (auto& e : std::filesystem::directory_iterator(std::string(MP_SOURCE_DIR) + "/tools/metapipe")) {
    std::string stem = e.path().stem().string();
    if (e.path().extension() == ".cpp" && stem.rfind("cmd_", 0) == 0) files.insert(stem.substr(4));
  }
  ASSERT_FALSE(files.empty());
  auto overview = run("--help");
  ASSERT_EQ(overview.status, 0);
  // Each command line in the overview is "  NAME  summary".
  size_t pos = overview.out.find("commands:\n");
  ASSERT_NE(pos, std::string::npos);
  std::set<std::string> listed;
  for (size_t p = overview.out.find('\n', pos) + 1; p < overview.out.size();) {
    size_t e = overview.out.find('\n', p);
    std::string line = overview.out.substr(p, e - p);
    p = e + 1;
    if (line.size() < 3) continue;
    std::string name = line.substr(2, line.find(' ', 2) - 2);
    auto h = run(name + " --help");
    EXPECT_EQ(h.status, 0) << name;
    EXPECT_NE(h.out.find("usage: metapipe " + name), std::string::npos) << name << ": " << h.out;
    listed.insert(name);
  }
  EXPECT_EQ(listed, files);
}

// What info says about this machine: the CPU's hardware threads, and the GPU as the device query sees
// it (its name and SM count, or the reason there is none).
TEST(Cli, InfoDescribesThisMachine) {
  auto r = run("info");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.rfind("metapipe ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("cpu     always present (" + std::to_string(std::thread::hardware_concurrency()) +
                       " hardware threads)"),
            std::string::npos)
      << r.out;
  if (auto g = mp::query_gpu()) {
    EXPECT_NE(r.out.find("cuda    " + g->name + " (sm_"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(std::to_string(g->sm_count) + " SMs"), std::string::npos) << r.out;
  } else {
    EXPECT_NE(r.out.find("cuda    absent: " + mp::gpu_absent_reason()), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("; 0 GPUs visible\n"), std::string::npos) << r.out;
  }
  EXPECT_NE(r.out.find("tensor parallelism (generate --tp):\n  NCCL "), std::string::npos) << r.out;
}

TEST(Cli, DemoRunsAndChecks) {
  auto r = run("demo --quick");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("matmul-blocked"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("all checks passed"), std::string::npos) << r.out;
  // The filtered JSON run only runs the providers whose rows can pass the filter.
  auto j = run("demo --quick --json --target systolic");
  EXPECT_EQ(j.status, 0) << j.out;
  EXPECT_NE(j.out.find("\"ok\": true"), std::string::npos) << j.out;
  EXPECT_NE(j.out.find("\"target\": \"systolic"), std::string::npos) << j.out;
  EXPECT_EQ(j.out.find("\"target\": \"cpu"), std::string::npos) << j.out;
}

TEST(Cli, BadIntegerOptionNamesTheOption) {
  auto r = run("demo --target");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--target needs a value"), std::string::npos) << r.out;
}
