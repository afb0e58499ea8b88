// `metapipe gemm` as a user runs it: help, usage errors, shape errors, and no-GPU behaviour.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include "core/device.h"
#include "tests/support/run_cli.h"

namespace {
using Result = mp::test::CliResult;
Result run(const std::string& args) { return mp::test::run_cli(args); }
}  // namespace

TEST(GemmCli, Help) {
  auto r = run("gemm --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out.rfind("usage: metapipe gemm", 0), 0u) << r.out;
  for (const char* option :
       {"--graphs", "--batch-ms", "--power", "--fixed-reducer", "--split-lead", "--cluster"})
    EXPECT_NE(r.out.find(option), std::string::npos) << option << " not in the help:\n" << r.out;
}

TEST(GemmCli, BadShapeIsAUserError) {
  auto r = run("gemm 100 64 64");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("M=100 is not a multiple of 16"), std::string::npos) << r.out;
}

TEST(GemmCli, BadUsage) {
  EXPECT_EQ(run("gemm 64 64").status, 2);
  EXPECT_EQ(run("gemm 64 64 64 --out f16").status, 2);
  EXPECT_EQ(run("gemm 64 x 64").status, 2);
  EXPECT_EQ(run("gemm 64 64 64 --schedule zigzag").status, 2);
  EXPECT_EQ(run("gemm 64 64 64 --schedule pingpong --cluster 2").status, 2);
}

// The schedule options added for tuning: each out-of-range value is a one-line usage error naming the
// option.
TEST(GemmCli, ScheduleOptionsAreChecked) {
  for (auto [args, option] : {std::pair<const char*, const char*>{"--stream-k 2", "--stream-k"},
                              {"--epilogue later", "--epilogue"},
                              {"--mma-pending 3", "--mma-pending"},
                              {"--prefetch -2", "--prefetch"},
                              {"--data-only --compute-only", "--data-only"},
                              {"--block-m 32", "--block-m"},
                              {"--block-n 96", "--block-n"},
                              {"--fixed-reducer 2", "--fixed-reducer"},
                              {"--split-lead -1", "--split-lead"},
                              {"--batch-ms 0", "--batch-ms"},
                              {"--batch-ms 5000", "--batch-ms"},
                              {"--batch-ms 2x", "--batch-ms"},
                              {"--l2 last,first", "--l2"},
                              {"--l2 last,first,first,first", "--l2"},
                              {"--l2 last,first,keep", "--l2"},
                              {"--l2 off", "--l2"}}) {
    auto r = run(std::string("gemm 64 64 64 ") + args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.out;
    EXPECT_NE(r.out.find(option), std::string::npos) << args << ": " << r.out;
    EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "not one line: " << r.out;
  }
}

TEST(GemmCli, WithoutAGpuSaysSo) {
  auto g = mp::query_gpu();
  if (g && mp::gpu_is_hopper(*g)) GTEST_SKIP() << "a Hopper GPU is present";
  auto r = run("gemm 64 64 64");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("needs a Hopper GPU"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("metapipe gemm: error: metapipe gemm"), std::string::npos) << r.out;  // named once
}

// --plan prints the schedule a shape gets, computed on the host, with or without a GPU.
TEST(GemmCli, PlanNeedsNoGpu) {
  auto r = run("gemm 128 4096 4096 --bt --plan --sms 132");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("planned for 132 SMs (--sms)"), std::string::npos) << r.out;
  EXPECT_NE(
      r.out.find("plan:   64x128x64 tiles, 64 tiles, split-K 2 (lead 3 K steps), cluster 1, persistent grid"),
      std::string::npos)
      << r.out;
  r = run("gemm 128 4096 4096 --plan --sms 132 --split-reduce cluster");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("plan:   64x128x64 tiles, 64 tiles, split-K 2 (lead 3 K steps; added in a cluster "
                       "pair), cluster 1"),
            std::string::npos)
      << r.out;
  r = run("gemm 128 4096 4096 --plan --sms 132 --split-reduce dsmem");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--split-reduce is workspace or cluster, got 'dsmem'"), std::string::npos)
      << r.out;
  r = run("gemm 128 4096 4096 --plan --sms 132 --split-reduce cluster --split-k 4");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("the cluster split-K reduction runs 64 x 128 tiles split 2 ways"), std::string::npos)
      << r.out;
  r = run("gemm 4096 4096 4096 --plan --sms 132 --schedule pingpong");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("pingpong, 64x256x64 tiles, 1024 tiles, split-K 1"), std::string::npos) << r.out;
  r = run("gemm 128 4096 4096 --plan --block-m 64 --stream-k 1");  // a combination the library rejects
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("stream-K runs on 128-row tiles"), std::string::npos) << r.out;
  r = run("gemm 128 4096 4096 --sms 100");  // --sms only with --plan
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--sms goes with --plan"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("metapipe gemm: error: metapipe gemm"), std::string::npos) << "named twice: " << r.out;
  EXPECT_EQ(run("gemm 128 4096 4096 --plan --sms 0").status, 2);
}
