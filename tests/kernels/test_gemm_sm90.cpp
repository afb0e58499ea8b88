// GPU tests of the tile GEMM on Hopper: many shapes (small, large, non-square, multiples of 16 that are
// not multiples of 64 or 128, K = 16, split-K), both B layouts, both outputs, against a CPU fp64
// reference and cuBLAS on fresh random inputs with the output poisoned first.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "core/device.h"
#include "core/error.h"
#include "kernels/gemm_check.h"
#include "tests/support/watchdog.h"

using namespace mp::kernels;

namespace {
bool have_hopper() {
  auto g = mp::query_gpu();
  return g && mp::gpu_is_hopper(*g);
}

struct Shape {
  int m, n, k;
};


void check_all(const std::vector<Shape>& shapes, const GemmSchedule& sched = {},
               const std::vector<out_type>& outs = {out_type::bf16, out_type::f32}) {
  for (auto [m, n, k] : shapes)
    for (b_layout bl : {b_layout::kn, b_layout::nk})
      for (out_type out : outs) {
        GemmCheckOptions opt;
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

// Both tile heights: 128 rows (two consumer warpgroups) and 64 rows (one; 128 wide), whatever the
// shape would choose.
std::vector<GemmSchedule> tile_heights() {
  std::vector<GemmSchedule> v(3);
  v[0].block_m = 128;
  v[1].block_m = 64;
  return v;  // v[2]: chosen from the shape
}

// Small shapes, multiples of 16 that are not multiples of 64 or 128 (partial tiles in M, N and K), K = 16.
const std::vector<Shape> small_shapes = {{16, 16, 16},     {128, 128, 64},   {144, 80, 16}, {48, 272, 48},
                                         {208, 1040, 112}, {1008, 400, 336}, {64, 16, 1024}};

TEST(SM90_Gemm, SmallAndOddMultiplesOf16) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  for (const GemmSchedule& s : tile_heights()) check_all(small_shapes, s);
}

TEST(SM90_Gemm, LargeAndNonSquare) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  check_all({{512, 1024, 256}, {1024, 768, 1040}, {2048, 2048, 2048}, {4096, 4096, 4096}, {384, 12288, 512}});
}

// Launches back to back, each reading the previous one's output: the 64- and 128-row tiles and split-K
// (whose counters the next launch reuses).
TEST(SM90_Gemm, BackToBackChains) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  mp::test::Watchdog dog(300, "SM90_Gemm.BackToBackChains");
  std::vector<GemmSchedule> scheds = tile_heights();
  scheds.push_back({});
  scheds.back().split_k = 2;
  for (const GemmSchedule& s : scheds)
    for (Shape sh : std::vector<Shape>{{128, 1024, 0}, {1040, 512, 0}})
      for (b_layout bl : {b_layout::kn, b_layout::nk}) {
        auto r = check_gemm_chain(sh.m, sh.n, 6, bl, s);
        EXPECT_TRUE(r.ok) << sh.m << "x" << sh.n << " chain of 6" << (bl == b_layout::nk ? " A*B^T" : " A*B")
                          << " [" << r.plan << "] seed " << r.seed << ": rel err " << r.rel_err << ", "
                          << r.unwritten << " unwritten";
      }
}

// 64 x 128 tiles split 2 ways, the shape small-M GEMMs get.
GemmSchedule split_pairs() {
  GemmSchedule s;
  s.block_m = 64;
  s.block_n = 128;
  s.split_k = 2;
  return s;
}

// Split tiles added up through the global workspace, on the 64 x 128 tiles split 2 ways: partial tiles in
// M and N, an odd number of K steps (the halves differ), two K steps (one each), many tiles per block,
// and one block per item.
TEST(SM90_Gemm, SplitReduce) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  mp::test::Watchdog dog(300, "SM90_Gemm.SplitReduce");
  // A launch with more tile counters than the one before it, and no more partial sums: with counters and
  // partials in one allocation, such a launch would read old partials as counters.
  GemmSchedule ws = split_pairs();
  ws.split_k = 8;
  check_all({{128, 4096, 16384}}, ws);  // 64 tiles, 8 partials each
  ws.split_k = 2;
  check_all({{1024, 2048, 1024}}, ws);  // 256 tiles, 2 partials each
  for (bool persistent : {true, false}) {
    GemmSchedule s = split_pairs();
    s.persistent = persistent;
    check_all({{128, 4096, 4096}, {80, 1040, 1040}, {144, 272, 128}, {1024, 4096, 1024}, {16, 128, 144}}, s);
  }
}

// Uneven splits (GemmSchedule::split_lead): every split but the last shorter, the last the rest; both
// a lead of one and the largest a shape allows (the shorter splits one K step each), splits
// that do not divide the K steps, partial tiles.
TEST(SM90_Gemm, SplitLead) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  mp::test::Watchdog dog(300, "SM90_Gemm.SplitLead");
  for (int lead : {1, 7}) {
      GemmSchedule s = split_pairs();
      s.split_lead = lead;
      // 16 and 17 K steps: halves of 8 and 9, the shorter split 1 or 2 steps (lead 7)
      check_all({{128, 4096, 1024}, {80, 1040, 1088}, {16, 128, 1024}}, s);
    }
  GemmSchedule s;
  s.split_k = 3;
  s.split_lead = 2;  // 1008 / 64 -> 16 K steps: 4 + 4 + 8
  check_all({{272, 528, 1008}}, s);
  s.block_m = 128;
  s.split_k = 4;
  s.split_lead = 1;  // 4096 / 64 = 64 K steps: 15 x 3 + 19
  check_all({{128, 4096, 4096}}, s);
}

// Who adds a split tile up (GemmSchedule::fixed_reducer): the split with the last K range, or the last to
// arrive; even and uneven splits; more split items than blocks (a block walks several items, some of
// them reducers waiting for splits that other blocks hold); the same shape twice in a row (the tile
// counters must be back at zero after a launch); and one block per item (no persistent grid: the fixed
// reducer is then off, since not every block need be resident).
TEST(SM90_Gemm, SplitReducers) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  mp::test::Watchdog dog(300, "SM90_Gemm.SplitReducers");
  for (bool fixed : {true, false})
    for (int lead : {0, 2}) {
      GemmSchedule s;
      s.fixed_reducer = fixed;
      s.split_lead = lead;
      s.split_k = 3;  // 2048 x 2048: 64 tiles of 128 x 256, 192 items
      check_all({{2048, 2048, 2048}, {2048, 2048, 2048}, {128, 4096, 4096}}, s);
      s.block_m = 64;
      s.block_n = 128;
      s.split_k = 4;  // 512 x 4096: 256 tiles of 64 x 128, 1024 items
      check_all({{512, 4096, 1024}, {80, 1040, 1088}}, s);
      s.persistent = false;
      check_all({{512, 4096, 1024}}, s);
    }
}

TEST(SM90_Gemm, SplitKAndSmallM) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  for (GemmSchedule s : tile_heights()) {
    check_all({{128, 4096, 4096}, {16, 2048, 8192}, {256, 1024, 3088}, {4096, 128, 2048}}, s);
    s.split_k = 3;
    check_all({{272, 528, 1008}}, s);
  }
}

// Stream-K forced on (stream_k_mode::on): tile counts above the SM count and not a multiple of it, so the
// last, partial wave's tiles are shared out by K ranges shorter than a tile (2304 x 2560 x 352: 48 tiles
// of 6 K steps over 132 blocks, up to 4 parts a tile) and finished in-kernel by the block holding the
// tile's first K range (the fixed reducer, stream_k_part) or by whichever arrives last. Partial tiles in
// M, N and K, K = 16 (too few K steps to share: data-parallel), both tile widths, the same shape twice in
// a row (the tile counters must be back at zero after a launch), and the epilogues (automatic: whole-tile
// for bf16 on 128 x 256 tiles; immediate). The default (automatic) shares where the last wave is at most
// two thirds full, which other tests' shapes reach.
TEST(SM90_Gemm, StreamK) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  mp::test::Watchdog dog(600, "SM90_Gemm.StreamK");
  GemmSchedule sk;
  sk.stream_k = stream_k_mode::on;
  check_all({{2304, 2560, 352}, {2304, 2560, 352}, {2320, 2576, 400}, {2304, 2560, 16}, {4096, 4096, 1024}},
            sk);
  GemmSchedule narrow = sk;
  narrow.block_n = 128;
  check_all({{1200, 3008, 208}, {1200, 3008, 208}}, narrow);
  GemmSchedule immediate = sk;
  immediate.epilogue = epilogue_mode::immediate;
  check_all({{2304, 2560, 352}}, immediate);
  GemmSchedule last = sk;
  last.fixed_reducer = false;
  check_all({{2304, 2560, 352}, {2304, 2560, 352}, {4096, 4096, 1024}}, last);
}

// L2 eviction priorities forced where the automatic rule gives none (small shapes), both ways round, on
// both tile heights: the result must not depend on them. (The rule's own choice runs in
// LargeAndNonSquare's 4096^3.)
TEST(SM90_Gemm, L2Priorities) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  GemmSchedule s;
  s.l2_a = l2_priority::evict_last, s.l2_b = l2_priority::evict_first, s.l2_c = l2_priority::evict_first;
  check_all({{144, 80, 16}, {1008, 400, 336}, {2048, 2048, 2048}}, s);
  s.l2_a = l2_priority::evict_first, s.l2_b = l2_priority::evict_last, s.l2_c = l2_priority::evict_last;
  s.block_m = 64;
  check_all({{208, 1040, 112}, {128, 4096, 4096}}, s);
}

// The epilogues: immediate, whole (every chunk of the tile at once) and automatic (the default; whole for
// the shapes with more 128 x 256 tiles than SMs); items of one K step, many tiles per block, one tile per
// block, partial tiles.
TEST(SM90_Gemm, Epilogues) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  for (auto e : {epilogue_mode::immediate, epilogue_mode::whole, epilogue_mode::automatic}) {
    GemmSchedule s;
    s.epilogue = e;
    const std::vector<Shape> shapes = {
        {4096, 2048, 16}, {2048, 4096, 64}, {1040, 784, 528}, {128, 256, 1024}, {4112, 4880, 208}};
    if (e == epilogue_mode::whole) {  // what it is compiled for: bf16 output, 128 x 256 tiles, no split
      s.block_m = 128, s.block_n = 256, s.split_k = 1;
      check_all(shapes, s, {out_type::bf16});
      GemmCheckOptions f32;
      f32.schedule = s;
      EXPECT_THROW(check_gemm(1024, 1024, 64, b_layout::nk, out_type::f32, f32), mp::user_error);
      continue;
    }
    check_all(shapes, s);
    s.block_n = 128;
    check_all({{4096, 2048, 80}}, s);
  }
}

TEST(SM90_Gemm, EverySchedule) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  for (int bn : {128, 256})
    for (bool persistent : {true, false}) {
      GemmSchedule s;
      s.block_m = 128;
      s.block_n = bn;
      s.persistent = persistent;
      s.group_m = persistent ? 4 : 1;
      check_all({{1040, 784, 528}, {144, 272, 80}}, s);  // odd and even numbers of M-tiles
    }
  for (bool persistent : {true, false}) {  // 64-row tiles: persistent or one block per tile
    GemmSchedule small;
    small.block_m = 64;
    small.persistent = persistent;
    small.group_m = persistent ? 4 : 1;
    check_all({{1040, 784, 528}, {144, 272, 80}, {2048, 2048, 64}}, small);
  }
}

// The diagnostics (bench_gemm --data-only / --compute-only) compute nothing, but every stage must still be
// filled and released so that the launch ends: no hang (the watchdog) and no CUDA error.
TEST(SM90_Gemm, DiagnosticsRunToTheEnd) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason();
  mp::test::Watchdog dog(120, "SM90_Gemm.DiagnosticsRunToTheEnd");
  for (int which = 0; which < 2; ++which)
    for (int m : {128, 4096}) {  // 64-row tiles split 2 ways; 128 x 256 whole-tile
      GemmCheckOptions opt;
      opt.schedule.data_only = which == 0;
      opt.schedule.compute_only = which == 1;
      EXPECT_NO_THROW(check_gemm(m, 4096, 1024, b_layout::nk, out_type::bf16, opt)) << which << " " << m;
    }
}
