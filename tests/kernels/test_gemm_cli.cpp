// `metapipe gemm` as a user runs it: the help lists what a user needs and no more, usage and shape errors
// are one line, --schedule overrides reach the plan and bad ones name what is wrong, --plan needs no GPU,
// and without a GPU the command says so.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "core/device.h"
#include "tests/support/run_cli.h"

namespace {
using Result = mp::test::CliResult;
Result run(const std::string& args) { return mp::test::run_cli(args); }
bool one_line(const std::string& s) { return !s.empty() && s.find('\n') == s.size() - 1; }
}  // namespace

// The options a user needs (shape, layout, output type, plan, samples and batch length, graphs, SM count,
// schedule overrides), each explained, and at most 14 of them.
TEST(GemmCli, HelpListsTheUsersOptions) {
  auto r = run("gemm --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out.rfind("usage: metapipe gemm M N K", 0), 0u) << r.out;
  for (const char* option : {"--bt", "--out", "--plan", "--sms", "--samples", "--batch-ms", "--graphs",
                             "--schedule", "--no-time"})
    EXPECT_NE(r.out.find("\n  " + std::string(option) + " "), std::string::npos) << option << " not explained:\n"
                                                                                 << r.out;
  int options = 0;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("  --", 0) == 0) ++options;
  EXPECT_LE(options, 14) << r.out;
  for (const char* key : {"block_m=", "split_k=", "stream_k=", "epilogue=", "l2="})  // the schedule keys
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " not in the help:\n" << r.out;
  for (const char* tuning : {"--trace", "--power", "--cluster", "--mma-pending", "--prefetch", "--pdl"})
    EXPECT_EQ(r.out.find(tuning), std::string::npos) << tuning << " is bench tooling:\n" << r.out;
}

TEST(GemmCli, BadShapeIsAUserError) {
  auto r = run("gemm 100 64 64");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("M=100 is not a multiple of 16"), std::string::npos) << r.out;
  EXPECT_TRUE(one_line(r.out)) << r.out;
}

TEST(GemmCli, BadUsageIsOneLine) {
  for (auto [args, says] : {std::pair<const char*, const char*>{"gemm 64 64", "three sizes"},
                            {"gemm 64 64 64 --out f16", "--out is bf16 or f32"},
                            {"gemm 64 x 64", "'x' is not a size"},
                            {"gemm 64 64 64 --samples 0", "--samples is 1 to 10000"},
                            {"gemm 64 64 64 --batch-ms 0", "--batch-ms"},
                            {"gemm 64 64 64 --batch-ms 5000", "--batch-ms"},
                            {"gemm 64 64 64 --batch-ms 2x", "--batch-ms"},
                            {"gemm 64 64 64 --cluster 2", "--cluster"},  // an option that is gone
                            {"gemm 128 4096 4096 --sms 100", "--sms goes with --plan"},
                            {"gemm 128 4096 4096 --plan --sms 0", "--sms is 1 to 1024"}}) {
    auto r = run(args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << args << ": " << r.out;
    EXPECT_TRUE(one_line(r.out)) << args << ": " << r.out;
    EXPECT_EQ(r.out.find("metapipe gemm: error: metapipe gemm"), std::string::npos) << "named twice: " << r.out;
  }
}

// Every malformed --schedule is a usage error (status 2) that names the pair and what it may be.
TEST(GemmCli, BadScheduleSaysWhatIsWrong) {
  for (auto [schedule, says] : {std::pair<const char*, const char*>{"zigzag", "'zigzag' is not key=value"},
                                {"tile=64", "unknown key 'tile'"},
                                {"block_m=32", "block_m=32 must be 0, 64 or 128"},
                                {"block_n=96", "block_n=96 must be 0, 128 or 256"},
                                {"split_k=-1", "split_k=-1 is not a whole number"},
                                {"group_m=0", "group_m=0 is not a whole number from 1"},
                                {"stream_k=2", "stream_k=2 must be auto, 0 or 1"},
                                {"epilogue=deferred", "epilogue=deferred must be auto, immediate or whole"},
                                {"l2=keep", "l2=keep must be auto or none"},
                                {"persistent=yes", "persistent=yes must be 0 or 1"},
                                {"block_m=64,", "'' is not key=value"}}) {
    auto r = run(std::string("gemm 128 4096 4096 --plan --schedule ") + schedule);
    EXPECT_EQ(r.status, 2) << schedule << ": " << r.out;
    EXPECT_NE(r.out.find("--schedule: "), std::string::npos) << schedule << ": " << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << schedule << ": " << r.out;
    EXPECT_TRUE(one_line(r.out)) << schedule << ": " << r.out;
  }
  // well-formed, but a combination the library cannot run: a user error naming the conflict
  auto r = run("gemm 128 4096 4096 --plan --schedule block_m=64,stream_k=1");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("stream-K runs on 128-row tiles"), std::string::npos) << r.out;
  r = run("gemm 4096 4096 4096 --plan --out f32 --schedule epilogue=whole");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("whole-tile epilogue runs bf16 output"), std::string::npos) << r.out;
}

// --plan prints the schedule a shape gets, computed on the host, with or without a GPU, and --schedule
// overrides reach it.
TEST(GemmCli, PlanNeedsNoGpuAndFollowsTheSchedule) {
  auto r = run("gemm 128 4096 4096 --bt --plan --sms 132");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("planned for 132 SMs (--sms)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("plan:   64x128x64 tiles, 64 tiles, split-K 2 (lead 3 K steps), persistent grid, L2 A "
                       "last B first C first"),
            std::string::npos)
      << r.out;
  r = run("gemm 128 4096 4096 --plan --sms 132 --schedule block_m=128,split_k=4,l2=none");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("plan:   128x128x64 tiles, 32 tiles, split-K 4 (lead 2 K steps), persistent grid\n"),
            std::string::npos)
      << r.out;
  r = run("gemm 4096 4096 4096 --plan --sms 132");
  EXPECT_NE(r.out.find("128x256x64 tiles, 512 tiles, split-K 1, persistent grid, whole-tile epilogue"),
            std::string::npos)
      << r.out;
  r = run("gemm 4096 4096 4096 --plan --sms 132 --schedule epilogue=immediate,persistent=0");
  EXPECT_NE(r.out.find("128x256x64 tiles, 512 tiles, split-K 1, one-block-per-tile grid, L2"), std::string::npos)
      << r.out;
  r = run("gemm 8192 8192 8192 --plan --sms 132 --schedule stream_k=0");
  EXPECT_EQ(r.out.find("stream-K"), std::string::npos) << r.out;
  r = run("gemm 8192 8192 8192 --plan --sms 132");
  EXPECT_NE(r.out.find("stream-K over the last 68"), std::string::npos) << r.out;
}

TEST(GemmCli, WithoutAGpuSaysSo) {
  auto g = mp::query_gpu();
  if (g && mp::gpu_is_hopper(*g)) GTEST_SKIP() << "a Hopper GPU is present";
  auto r = run("gemm 64 64 64");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("needs a Hopper GPU"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("'--plan' shows the schedule without one"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("metapipe gemm: error: metapipe gemm"), std::string::npos) << r.out;  // named once
}
