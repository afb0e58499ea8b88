// GPU tests of the tile GEMM on Hopper: many shapes (small, large, non-square, multiples of 16 that are
// not multiples of 64 or 128, K = 16, split-K), both B layouts, both outputs, against a CPU fp64
// reference and cuBLAS on fresh random inputs with the output poisoned first.
#include <gtest/gtest.h>

#include "core/device.h"
#include "kernels/gemm_check.h"

using namespace mp::kernels;

namespace {
bool have_hopper() {
  auto g = mp::query_gpu();
  return g && mp::gpu_is_hopper(*g);
}

struct Shape {
  int m, n, k;
};

void check_all(const std::vector<Shape>& shapes, const GemmSchedule& sched = {}) {
  for (auto [m, n, k] : shapes)
    for (b_layout bl : {b_layout::kn, b_layout::nk})
      for (out_type out : {out_type::bf16, out_type::f32}) {
        GemmCheckOptions opt;
        opt.time = false;
        opt.schedule = sched;
        auto r = check_gemm(m, n, k, bl, out, opt);
        EXPECT_TRUE(r.ok) << m << "x" << n << "x" << k << (bl == b_layout::nk ? " A*B^T" : " A*B")
                          << (out == out_type::f32 ? " f32" : " bf16") << " [" << r.plan << "] seed "
                          << r.seed << ": " << r.summary();
        // Ours must be as close to fp64 as cuBLAS is (same inputs, same output precision).
        EXPECT_LE(r.rel_err, 2 * r.rel_err_cublas + 1e-6) << m << "x" << n << "x" << k << " seed " << r.seed;
      }
}
}  // namespace

TEST(SM90_Gemm, SmallAndOddMultiplesOf16) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  check_all({{16, 16, 16},
             {128, 128, 64},
             {144, 80, 16},
             {48, 272, 48},
             {208, 1040, 112},
             {1008, 400, 336},
             {64, 16, 1024}});
}

TEST(SM90_Gemm, LargeAndNonSquare) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  check_all({{512, 1024, 256}, {1024, 768, 1040}, {2048, 2048, 2048}, {4096, 4096, 4096}, {384, 12288, 512}});
}

TEST(SM90_Gemm, SplitKAndSmallM) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  check_all({{128, 4096, 4096}, {16, 2048, 8192}, {256, 1024, 3088}});
  GemmSchedule s;
  s.split_k = 3;
  check_all({{272, 528, 1008}}, s);
}

TEST(SM90_Gemm, EverySchedule) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  for (int bn : {128, 256})
    for (bool persistent : {true, false})
      for (int cluster : {1, 2}) {
        GemmSchedule s;
        s.block_n = bn;
        s.persistent = persistent;
        s.group_m = persistent ? 4 : 1;
        s.cluster = cluster;
        check_all({{1040, 784, 528}, {144, 272, 80}}, s);  // odd and even numbers of M-tiles
      }
  GemmSchedule s;
  s.cluster = 2;
  s.split_k = 2;
  check_all({{400, 512, 1024}}, s);  // split-K with clusters
}
