// `metapipe compile --emit cuda` and `metapipe run --target cuda` as a user runs them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "backends/cuda/lower/runtime.h"
#include "tests/support/run_cli.h"

namespace {

TEST(CudaLowerCli, EmitCudaPrintsTheUnit) {
  auto r = mp::test::run_cli("compile matmul --emit cuda --set M=128");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("extern \"C\" __global__ void __launch_bounds__(512, "), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(") mp_matmul_s0(void* const* mp_t"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("// MatMul #"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("M=128"), std::string::npos) << "the parameters are recorded in the unit";
  EXPECT_EQ(r.out.find("passes:"), std::string::npos) << "only the unit goes to stdout";
}

TEST(CudaLowerCli, EmitCudaReadsTheSpeedVariables) {
  // The MP_CUDA_LOWER_* variables choose the unit --emit cuda prints, as they do for --target cuda.
  setenv("MP_CUDA_LOWER_COPY", "bulk", 1);
  auto r = mp::test::run_cli("compile dotproduct --emit cuda");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("// path: tile ring (bulk copies (TMA))"), std::string::npos) << r.out;
  setenv("MP_CUDA_LOWER_COPY", "tma", 1);
  r = mp::test::run_cli("compile dotproduct --emit cuda");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("MP_CUDA_LOWER_COPY='tma' is not cp or bulk"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  unsetenv("MP_CUDA_LOWER_COPY");
  r = mp::test::run_cli("compile dotproduct --emit cuda");
  EXPECT_NE(r.out.find("// path: tile ring (bulk copies (TMA))"), std::string::npos) << "bulk copies by default";
  setenv("MP_CUDA_LOWER_COPY", "cp", 1);
  r = mp::test::run_cli("compile dotproduct --emit cuda");
  unsetenv("MP_CUDA_LOWER_COPY");
  EXPECT_NE(r.out.find("// path: tile ring (cp.async)"), std::string::npos) << r.out;
  r = mp::test::run_cli("compile dotproduct --emit cuda");
  EXPECT_NE(r.out.find("// no producer warp: switched off (MP_CUDA_LOWER_PRODUCER=thread)."), std::string::npos)
      << "thread 0 fills the ring by default";
  EXPECT_NE(r.out.find("__launch_bounds__(512, "), std::string::npos) << r.out;
  setenv("MP_CUDA_LOWER_PRODUCER", "warp", 1);
  r = mp::test::run_cli("compile dotproduct --emit cuda");
  unsetenv("MP_CUDA_LOWER_PRODUCER");
  EXPECT_NE(r.out.find("; filled by a producer warp, up to "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("__launch_bounds__(544, "), std::string::npos) << r.out;
}

TEST(CudaLowerCli, BadEmitIsAUsageError) {
  auto r = mp::test::run_cli("compile matmul --emit ptx");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("unknown --emit 'ptx'"), std::string::npos) << r.out;
}

TEST(CudaLowerCli, BadRepeatIsAUsageError) {
  auto r = mp::test::run_cli("run dotproduct --target cuda --repeat 0");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--repeat 0 is out of range: give 1 to 10000 timed runs"), std::string::npos) << r.out;
  r = mp::test::run_cli("run dotproduct --repeat 5");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--repeat times the GPU only: add --target cuda"), std::string::npos) << r.out;
}

TEST(CudaLowerCli, RunWithoutGpuIsOneLine) {
  if (mp::cuda::available()) GTEST_SKIP() << "a CUDA GPU is present";
  auto r = mp::test::run_cli("run softmax --target cuda");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_NE(r.out.find("error: no CUDA GPU: "), std::string::npos) << r.out;
}

TEST(CudaLowerCli, DemoRowsSayWhy) {
  auto r = mp::test::run_cli("demo --quick --target cuda");
  if (mp::cuda::available()) {
    EXPECT_EQ(r.status, 0) << r.out;
  } else {
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("softmax          cuda    skipped: no CUDA GPU"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("matmul-bf16      cuda    skipped: no CUDA GPU"), std::string::npos) << r.out;  // wgmma
  }
}

}  // namespace
