// The rank launcher of tensor-parallel runs, without a GPU: every rank started with its environment,
// rank 0's standard output kept and the others' dropped, a failing rank stopping the rest, and the
// unique-id file's exchange and time limit.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "backends/cuda/tp_launch.h"
#include "tests/support/expect_user_error.h"

namespace mp::cuda::tp {
namespace {

std::string read(const std::string& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

struct TempDir {
  std::string path;
  TempDir() {
    std::string t = std::filesystem::temp_directory_path() / "mp-tp-test-XXXXXX";
    path = mkdtemp(t.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

TEST(TpLaunch, EveryRankRunsWithItsEnvironment) {
  TempDir d;
  // Each rank writes its variables to a file of its own.
  const std::string script =
      "echo \"$MP_TP_RANK $MP_TP_SIZE $MP_TP_ID_FILE\" > " + d.path + "/rank$MP_TP_RANK";
  EXPECT_EQ(run_ranks({"/bin/sh", "-c", script}, 3), 0);
  std::string id_file;
  for (int r = 0; r < 3; ++r) {
    std::string line = read(d.path + "/rank" + std::to_string(r));
    ASSERT_EQ(line.rfind(std::to_string(r) + " 3 ", 0), 0u) << line;
    std::string f = line.substr(4, line.size() - 5);
    if (r == 0) id_file = f;
    EXPECT_EQ(f, id_file);  // one unique-id file for all ranks
  }
  EXPECT_NE(id_file.find("/nccl-id"), std::string::npos) << id_file;
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(id_file).parent_path())) << "not removed";
}

TEST(TpLaunch, OnlyRankZeroPrints) {
  testing::internal::CaptureStdout();
  EXPECT_EQ(run_ranks({"/bin/sh", "-c", "echo printed-by-$MP_TP_RANK"}, 2), 0);
  const std::string out = testing::internal::GetCapturedStdout();
  // The ranks inherit the captured descriptor 1; rank 1's is replaced by /dev/null.
  EXPECT_NE(out.find("printed-by-0"), std::string::npos) << out;
  EXPECT_EQ(out.find("printed-by-1"), std::string::npos) << out;
}

TEST(TpLaunch, AFailingRankStopsTheOthers) {
  const auto t0 = std::chrono::steady_clock::now();
  testing::internal::CaptureStderr();
  // Rank 1 fails at once; rank 0 would sleep for a minute.
  const int rc = run_ranks({"/bin/sh", "-c", "if [ $MP_TP_RANK = 1 ]; then exit 3; fi; sleep 60"}, 2, 1.0);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 3);
  EXPECT_NE(err.find("metapipe: --tp: rank 1 of 2 exited with status 3; stopping the other ranks"),
            std::string::npos)
      << err;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
}

TEST(TpLaunch, AMissingProgramIsAFailure) {
  testing::internal::CaptureStderr();
  EXPECT_EQ(run_ranks({"/nonexistent/metapipe"}, 1), 127);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("cannot run /nonexistent/metapipe"), std::string::npos) << err;
  EXPECT_USER_ERROR(run_ranks({"/bin/true"}, 0), "--tp 0 must be in [1, 64]");
}

TEST(TpLaunch, UniqueIdExchange) {
  TempDir d;
  const std::string f = d.path + "/id";
  std::vector<uint8_t> id(128);
  for (size_t i = 0; i < id.size(); ++i) id[i] = uint8_t(i * 7 + 1);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    write_id(f, id);
  });
  EXPECT_EQ(read_id(f, 128, 30), id);  // waits for the writer
  writer.join();
  EXPECT_USER_ERROR(read_id(f, 64, 1),
                    "--tp: the unique-id file '" + f + "' holds more than 64 bytes; 64 expected");
  EXPECT_USER_ERROR(read_id(d.path + "/none", 128, 0.2), "--tp: rank 0 wrote no unique id to '" + d.path +
                                                             "/none' within 0.2 s (did rank 0 fail? "
                                                             "its error comes first)");
}

TEST(TpLaunch, RankEnvironment) {
  unsetenv(kRankEnv), unsetenv(kSizeEnv), unsetenv(kIdFileEnv);
  EXPECT_FALSE(rank_env().has_value());
  setenv(kRankEnv, "1", 1), setenv(kSizeEnv, "2", 1), setenv(kIdFileEnv, "/x/id", 1);
  auto e = rank_env();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->rank, 1);
  EXPECT_EQ(e->size, 2);
  EXPECT_EQ(e->id_file, "/x/id");
  setenv(kRankEnv, "2", 1);
  EXPECT_USER_ERROR(rank_env(),
                    "tensor-parallel rank environment: MP_TP_RANK='2', MP_TP_SIZE='2', "
                    "MP_TP_ID_FILE='/x/id' must give a rank below the size and a file (unset all "
                    "three to run alone)");
  unsetenv(kRankEnv), unsetenv(kSizeEnv), unsetenv(kIdFileEnv);
}

}  // namespace
}  // namespace mp::cuda::tp
