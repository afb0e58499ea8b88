// CPU tests of the GEMM's host side: shape checks (the messages), bf16 rounding and the fp64 reference.
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "core/error.h"
#include "kernels/gemm.h"

using namespace mp::kernels;

static std::string error_of(long long m, long long n, long long k) {
  try {
    check_gemm_shape(m, n, k);
  } catch (const mp::user_error& e) {
    return e.what();
  }
  return "";
}

TEST(Gemm, RejectsShapesThatAreNotMultiplesOf16) {
  EXPECT_EQ(error_of(16, 32, 4096), "");
  EXPECT_NE(error_of(100, 64, 64).find("M=100 is not a multiple of 16"), std::string::npos)
      << error_of(100, 64, 64);
  EXPECT_NE(error_of(64, 24, 64).find("N=24 is not a multiple of 16"), std::string::npos);
  EXPECT_NE(error_of(64, 64, 8).find("K=8 is not a multiple of 16"), std::string::npos);
  EXPECT_NE(error_of(64, 64, 8).find("pad K to 16"), std::string::npos);
  EXPECT_NE(error_of(0, 64, 64).find("M=0 must be positive"), std::string::npos);
}

TEST(Gemm, EntryPointChecksTheShapeFirst) {
  // Whatever the build (with or without CUDA), a bad shape is a user error naming the dimension.
  try {
    gemm_bf16(nullptr, nullptr, nullptr, 64, 64, 40, b_layout::nk, out_type::bf16);
    FAIL() << "no error";
  } catch (const mp::user_error& e) {
    EXPECT_NE(std::string(e.what()).find("K=40"), std::string::npos) << e.what();
  }
}

TEST(Gemm, Bf16RoundingIsNearestEven) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(bf16_bits_to_float(float_to_bf16_bits(3.140625f)), 3.140625f);
  EXPECT_EQ(float_to_bf16_bits(1.0f + 1.0f / 256), 0x3f80);  // tie -> even
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3.0f / 256), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(float_to_bf16_bits(-2.0f), 0xc000);
}

TEST(Gemm, CpuReferenceBothLayouts) {
  // A = [[1,2],[3,4]], B (k x n) = [[5,6],[7,8]] -> [[19,22],[43,50]]; B^T stored n x k gives the same.
  std::vector<float> a{1, 2, 3, 4}, b{5, 6, 7, 8}, bt{5, 7, 6, 8};
  auto c = gemm_reference_cpu(a, b, 2, 2, 2, b_layout::kn);
  auto d = gemm_reference_cpu(a, bt, 2, 2, 2, b_layout::nk);
  EXPECT_EQ(c, (std::vector<double>{19, 22, 43, 50}));
  EXPECT_EQ(d, c);
}

TEST(Gemm, ScheduleNames) {
  EXPECT_EQ(GemmSchedule{}.stream_k, stream_k_mode::automatic);
  for (auto m : {stream_k_mode::automatic, stream_k_mode::off, stream_k_mode::on}) {
    stream_k_mode back = m == stream_k_mode::on ? stream_k_mode::off : stream_k_mode::on;
    EXPECT_TRUE(parse_stream_k_mode(stream_k_mode_name(m), back));
    EXPECT_EQ(back, m);
  }
  stream_k_mode m = stream_k_mode::off;
  EXPECT_FALSE(parse_stream_k_mode("2", m));
  EXPECT_EQ(m, stream_k_mode::off);
  EXPECT_EQ(GemmSchedule{}.l2_a, l2_priority::automatic);
  EXPECT_EQ(GemmSchedule{}.l2_b, l2_priority::automatic);
  EXPECT_EQ(GemmSchedule{}.l2_c, l2_priority::automatic);
  for (auto p : {l2_priority::normal, l2_priority::evict_first, l2_priority::evict_last, l2_priority::automatic}) {
    l2_priority back = p == l2_priority::normal ? l2_priority::evict_last : l2_priority::normal;
    EXPECT_TRUE(parse_l2_priority(l2_priority_name(p), back));
    EXPECT_EQ(back, p);
  }
  l2_priority p = l2_priority::evict_first;
  EXPECT_FALSE(parse_l2_priority("evict_first", p));
  EXPECT_EQ(p, l2_priority::evict_first);
  EXPECT_EQ(GemmSchedule{}.epilogue, epilogue_mode::automatic);
  for (auto e : {epilogue_mode::automatic, epilogue_mode::immediate, epilogue_mode::whole}) {
    epilogue_mode back = e == epilogue_mode::whole ? epilogue_mode::immediate : epilogue_mode::whole;
    EXPECT_TRUE(parse_epilogue_mode(epilogue_mode_name(e), back));
    EXPECT_EQ(back, e);
  }
  epilogue_mode e = epilogue_mode::whole;
  EXPECT_FALSE(parse_epilogue_mode("deferred", e));
  EXPECT_EQ(e, epilogue_mode::whole);
}

// The L2 priorities a plan gets (GemmSchedule::l2_a): A kept, B and C first where the operands overflow
// half the L2 and a tile group's A rows fit in a third of it; no hints otherwise; an explicit priority
// wins over the automatic one of its operand.
TEST(Gemm, PlanPicksTheL2Priorities) {
  const long long l2 = h200_l2_bytes;  // 60 MiB: the limit for a group's A rows is 20 MiB
  auto plan = [&](int m, int n, int k, GemmSchedule s = {}, long long l2_bytes = h200_l2_bytes) {
    return plan_gemm(m, n, k, s, 132, out_type::bf16, l2_bytes);
  };
  auto hinted = [](const GemmPlan& p) {
    return p.l2_a == l2_priority::evict_last && p.l2_b == l2_priority::evict_first &&
           p.l2_c == l2_priority::evict_first;
  };
  auto plain = [](const GemmPlan& p) {
    return p.l2_a == l2_priority::normal && p.l2_b == l2_priority::normal && p.l2_c == l2_priority::normal;
  };
  EXPECT_TRUE(hinted(plan(4096, 4096, 4096)));      // 96 MiB of operands; 16 x 128 rows x 4096: 16 MiB
  EXPECT_TRUE(hinted(plan(4096, 14336, 4096)));     // the up-projection: the same A rows
  EXPECT_TRUE(hinted(plan(8192, 128256, 4096)));    // the lm-head
  EXPECT_TRUE(hinted(plan(128, 4096, 4096)));       // 35 MiB of operands; A is 1 MiB
  EXPECT_TRUE(plain(plan(8192, 8192, 8192)));       // 16 x 128 rows x 8192: 32 MiB
  EXPECT_TRUE(plain(plan(16384, 4096, 14336)));     // the down-projection: 56 MiB of A rows
  EXPECT_TRUE(plain(plan(2048, 2048, 2048)));       // 24 MiB: fits in L2 as it is
  EXPECT_TRUE(hinted(plan(2048, 2048, 2048, {}, l2 / 2)));  // on a GPU with half the L2 (8 MiB of A rows)
  EXPECT_TRUE(plain(plan(2048, 2048, 2048, {}, l2 / 4)));   // a quarter: 8 MiB of A rows > 5 MiB
  EXPECT_TRUE(plain(plan(4096, 4096, 4096, {}, l2 / 2)));   // 16 MiB of A rows > 10 MiB
  GemmSchedule s;
  s.group_m = 8;  // 8 MiB of A rows at 8192^3
  EXPECT_TRUE(hinted(plan(8192, 8192, 8192, s)));
  s = {};
  s.group_m = 32;  // 32 x 128 rows x 4096: 32 MiB of A rows at 4096^3
  EXPECT_TRUE(plain(plan(4096, 4096, 4096, s)));
  s = {};
  s.l2_c = l2_priority::normal;  // explicit for C, automatic for A and B
  auto p = plan(4096, 4096, 4096, s);
  EXPECT_EQ(p.l2_a, l2_priority::evict_last);
  EXPECT_EQ(p.l2_b, l2_priority::evict_first);
  EXPECT_EQ(p.l2_c, l2_priority::normal);
  s.l2_a = l2_priority::evict_first;  // explicit where the automatic choice is no hint
  p = plan(8192, 8192, 8192, s);
  EXPECT_EQ(p.l2_a, l2_priority::evict_first);
  EXPECT_EQ(p.l2_b, l2_priority::normal);
  EXPECT_EQ(describe_plan(p, s),
            "128x256x64 tiles, 2048 tiles, stream-K over the last 68, split-K 1, persistent grid, "
            "whole-tile epilogue, L2 A first B normal C normal");
  EXPECT_THROW(plan(4096, 4096, 4096, {}, 0), mp::user_error);
}

// The epilogue a plan gets: automatic is the whole-tile epilogue for bf16 output on 128 x 256 tiles of
// single blocks when there are more tiles than SMs, immediate otherwise; asking for the whole tile where
// it does not apply is an error that names what is in the way.
TEST(Gemm, PlanPicksTheEpilogue) {
  const int sms = 132;
  auto plan = [&](int m, int n, int k, GemmSchedule s = {}, out_type o = out_type::bf16) {
    return plan_gemm(m, n, k, s, sms, o);
  };
  EXPECT_TRUE(plan(4096, 14336, 4096).whole_tile);  // 1792 tiles
  EXPECT_TRUE(plan(4096, 4096, 4096).whole_tile);   // 512 tiles
  EXPECT_EQ(describe_plan(plan(4096, 4096, 4096), {}),
            "128x256x64 tiles, 512 tiles, split-K 1, persistent grid, whole-tile epilogue, L2 A last "
            "B first C first");
  EXPECT_FALSE(plan(2048, 2048, 2048).whole_tile);                     // 128 tiles <= 132 SMs
  EXPECT_FALSE(plan(4096, 4096, 4096, {}, out_type::f32).whole_tile);  // f32 output
  EXPECT_FALSE(plan(128, 4096, 4096).whole_tile);                      // 64-row tiles
  GemmSchedule s;
  // the data-parallel tiles' epilogue; the shared tiles' reducers store whole tiles too
  s.stream_k = stream_k_mode::on;
  EXPECT_TRUE(plan(4096, 14336, 4096, s).whole_tile);
  EXPECT_EQ(describe_plan(plan(4096, 4096, 4096, s), s),
            "128x256x64 tiles, 512 tiles, stream-K over the last 116, split-K 1, persistent grid, "
            "whole-tile epilogue, L2 A last B first C first");
  s = {};
  s.persistent = false;  // one tile per block
  EXPECT_FALSE(plan(4096, 14336, 4096, s).whole_tile);
  s = {};
  s.epilogue = epilogue_mode::immediate;
  EXPECT_FALSE(plan(4096, 4096, 4096, s).whole_tile);
  s.epilogue = epilogue_mode::whole;  // asked for: also with one wave of tiles
  EXPECT_TRUE(plan(2048, 2048, 2048, s).whole_tile);
  auto rejected = [&](GemmSchedule w, out_type o, const char* names) {
    try {
      plan(4096, 4096, 4096, w, o);
      ADD_FAILURE() << "accepted: " << names;
    } catch (const mp::user_error& e) {
      EXPECT_NE(std::string(e.what()).find("whole-tile epilogue"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
    }
  };
  rejected(s, out_type::f32, "f32 output");
  GemmSchedule w = s;
  w.block_n = 128;
  rejected(w, out_type::bf16, "128 x 128 tiles");
  w = s;
  w.split_k = 2;
  rejected(w, out_type::bf16, "split-K 2");
}

// The schedule a shape gets on the H200 (132 SMs): computed on the host, so checked here without a GPU.
TEST(Gemm, PlanPicksTheTileFromTheShape) {
  const int sms = 132;
  auto plan = [&](int m, int n, int k, GemmSchedule s = {}) { return plan_gemm(m, n, k, s, sms); };
  GemmPlan p = plan(4096, 4096, 4096);  // large: 128 x 256 tiles, no split
  EXPECT_EQ(p.bm, 128);
  EXPECT_EQ(p.bn, 256);
  EXPECT_EQ(p.tiles, 512);
  EXPECT_EQ(p.splits, 1);
  EXPECT_EQ(p.sk_tiles, 0);
  p = plan(128, 4096, 4096);  // decode: 32 tiles of 128 x 128 would be too few -> 64 x 128, split 2
  EXPECT_EQ(p.bm, 64);
  EXPECT_EQ(p.bn, 128);
  EXPECT_EQ(p.tiles, 64);
  EXPECT_EQ(p.splits, 2);
  EXPECT_EQ(describe_plan(p, {}),
            "64x128x64 tiles, 64 tiles, split-K 2 (lead 3 K steps), persistent grid, L2 A last B "
            "first C first");
  EXPECT_EQ(p.split_lead, 3);  // chosen: about 6 K steps between the first split's end and the last's
  GemmSchedule lead;
  lead.split_lead = 5;  // the first split 5 K steps short of 32, the second 5 over
  const GemmPlan pl = plan(128, 4096, 4096, lead);
  EXPECT_EQ(pl.split_lead, 5);
  EXPECT_EQ(describe_plan(pl, lead),
            "64x128x64 tiles, 64 tiles, split-K 2 (lead 5 K steps), persistent grid, L2 A last B "
            "first C first");
  lead.split_lead = 0;  // even splits
  EXPECT_EQ(describe_plan(plan(128, 4096, 4096, lead), lead),
            "64x128x64 tiles, 64 tiles, split-K 2, persistent grid, L2 A last B first C first");
  p = plan(64, 4096, 4096);
  EXPECT_EQ(p.bm, 64);
  EXPECT_EQ(p.tiles, 32);
  EXPECT_EQ(p.splits, 4);
  p = plan(4096, 128, 4096);  // small N too
  EXPECT_EQ(p.bm, 64);
  EXPECT_EQ(p.tiles, 64);
  p = plan(128, 14336, 4096);  // 112 tiles of 128 x 128: enough without splitting K
  EXPECT_EQ(p.bm, 128);
  EXPECT_EQ(p.bn, 128);
  EXPECT_EQ(p.splits, 1);
  GemmSchedule tall;
  tall.block_m = 128;
  p = plan(128, 4096, 4096, tall);  // the 128-row tiles on the decode shape: split 4 ways
  EXPECT_EQ(p.bm, 128);
  EXPECT_EQ(p.bn, 128);
  EXPECT_EQ(p.splits, 4);
  GemmSchedule sk;
  sk.stream_k = stream_k_mode::on;
  p = plan(4096, 4096, 4096, sk);  // 512 tiles on 132 SMs: the partial wave's 116 shared
  EXPECT_EQ(p.sk_tiles, 512 % 132);
  EXPECT_EQ(plan(4096, 4096, 4096).sk_tiles, 0);    // automatic: the last wave is 88 % full
  EXPECT_EQ(plan(8192, 8192, 8192).sk_tiles, 68);   // 2048 tiles: the last wave 52 % full
  EXPECT_EQ(plan(4096, 14336, 4096).sk_tiles, 76);  // 1792 tiles: 58 %
  EXPECT_EQ(plan(8192, 128256, 4096).sk_tiles, 0);  // 32064 tiles: 91 %
  sk.stream_k = stream_k_mode::off;
  EXPECT_EQ(plan(8192, 8192, 8192, sk).sk_tiles, 0);
  using M = stream_k_mode;
  for (M mode : {M::automatic, M::on, M::off}) {
    EXPECT_EQ(stream_k_tiles(528, 132, 64, mode), 0);  // whole waves: nothing to share
    EXPECT_EQ(stream_k_tiles(100, 132, 64, mode), 0);  // less than one wave
  }
  EXPECT_EQ(stream_k_tiles(512, 132, 64, M::on), 116);
  EXPECT_EQ(stream_k_tiles(512, 132, 64, M::automatic), 0);
  EXPECT_EQ(stream_k_tiles(512, 132, 64, M::off), 0);
  // automatic: from a quarter to two thirds of a wave (33 to 88 tiles of 132)
  EXPECT_EQ(stream_k_tiles(132 + 32, 132, 64, M::automatic), 0);
  EXPECT_EQ(stream_k_tiles(132 + 33, 132, 64, M::automatic), 33);
  EXPECT_EQ(stream_k_tiles(132 + 88, 132, 64, M::automatic), 88);
  EXPECT_EQ(stream_k_tiles(132 + 89, 132, 64, M::automatic), 0);
  // never ranges under one K step: 2 tiles of 64 steps over 132 blocks would be
  EXPECT_EQ(stream_k_tiles(134, 132, 64, M::on), 0);
  EXPECT_EQ(stream_k_tiles(135, 132, 64, M::on), 3);
}

// The K split the kernel runs (k_split, shared with it): for every K step count, split count and lead
// that plan_gemm accepts, the splits are non-empty, in order, and cover the K steps exactly once; with a
// lead every split but the last is exactly `lead` short of an even share and the last is the longest.
TEST(Gemm, KSplitCoversEveryKStepOnce) {
  for (int k_iters = 1; k_iters <= 300; ++k_iters)
    for (int splits = 2; splits <= 8 && splits <= k_iters; ++splits) {
      const int even = (k_iters + splits - 1) / splits;
      for (int lead = 0; lead < even; ++lead) {
        const KSplit ks = k_split(k_iters, splits, lead);
        ASSERT_GE(ks.per_split, 1) << k_iters << " " << splits << " " << lead;
        ASSERT_GE(ks.splits, 1);
        ASSERT_LE(ks.splits, splits);
        if (lead > 0) {
          ASSERT_EQ(ks.splits, splits) << k_iters << " " << splits << " " << lead;
        }
        int next = 0;
        for (int s = 0; s < ks.splits; ++s) {
          ASSERT_EQ(ks.first(s), next) << k_iters << " " << splits << " " << lead << " split " << s;
          const int n = ks.iters(k_iters, s);
          ASSERT_GE(n, 1) << k_iters << " " << splits << " " << lead << " split " << s;
          if (s < ks.splits - 1) {
            ASSERT_EQ(n, even - lead);
          }
          if (lead > 0 && s == ks.splits - 1) {
            ASSERT_GT(n, ks.per_split);
          }
          next += n;
        }
        ASSERT_EQ(next, k_iters) << k_iters << " " << splits << " " << lead;
      }
    }
  // The plan's lead for 128 x 4096 x 4096 (64 K steps in 2): 29 + 35.
  const KSplit ks = k_split(64, 2, 3);
  EXPECT_EQ(ks.iters(64, 0), 29);
  EXPECT_EQ(ks.iters(64, 1), 35);
  // Without a lead, 10 K steps asked in 6 splits are five of 2.
  EXPECT_EQ(k_split(10, 6, 0).splits, 5);
}

namespace {
// Blocks 0..grid-1 of a persistent grid walk split-K items b, b + grid, ... (split_item); an item that
// adds its tile up waits until the tile's other splits are done, the others never wait. Returns whether
// every item completes, trying every block in turn until none can move.
bool split_walk_completes(int tiles, int splits, int grid, bool reducer_is_last) {
  const int items = tiles * splits;
  std::vector<char> done(size_t(items), 0);
  std::vector<int> next;  // each block's next item
  for (int b = 0; b < grid; ++b) next.push_back(b);
  const int reducer = reducer_is_last ? splits - 1 : 0;
  for (bool moved = true; moved;) {
    moved = false;
    for (int b = 0; b < grid; ++b)
      while (next[size_t(b)] < items) {
        const auto [split, tile] = split_item(next[size_t(b)], tiles);
        bool ready = true;
        for (int s = 0; s < splits && split == reducer; ++s)
          if (s != reducer && !done[size_t(s * tiles + tile)]) ready = false;
        if (!ready) break;
        done[size_t(next[size_t(b)])] = 1;
        next[size_t(b)] += grid;
        moved = true;
      }
  }
  for (char d : done)
    if (!d) return false;
  return true;
}
}  // namespace

// The fixed reducer's deadlock freedom (GemmSchedule::fixed_reducer, split_item): with the split that has
// the last K range adding up, every persistent grid finishes, whatever the tile count, split count and
// grid size; with the first split adding up instead, some grids would not (the check can tell).
TEST(Gemm, FixedReducerWalkCannotDeadlock) {
  bool first_ever_stuck = false;
  for (int tiles = 1; tiles <= 24; ++tiles)
    for (int splits = 2; splits <= 5; ++splits)
      for (int grid = 1; grid <= tiles * splits; ++grid) {
        ASSERT_TRUE(split_walk_completes(tiles, splits, grid, true))
            << tiles << " tiles, " << splits << " splits, grid " << grid;
        first_ever_stuck = first_ever_stuck || !split_walk_completes(tiles, splits, grid, false);
      }
  EXPECT_TRUE(first_ever_stuck);
  EXPECT_FALSE(split_walk_completes(4, 2, 1, false));  // one block: its first item waits for its later ones
  // The item numbering the kernel uses: split 1 of tile 3 among 64 tiles is item 67.
  EXPECT_EQ(split_item(67, 64).split, 1);
  EXPECT_EQ(split_item(67, 64).tile, 3);
}

// Stream-K's items (stream_k_part), for every grid and every share up to 2 * grid - 1 tiles (the last
// wave's share, under grid, is what stream_k_tiles gives; larger shares were the earlier two-tile
// variant), several K lengths, ranges of at least one K step: every K step of every shared tile belongs to
// exactly one item; a block touches at most three tiles, two when the share is under the grid; a tile has
// stream_k_max_parts parts at most (and some tile that many), numbered from its last K range (which 0) to
// its first; the fixed reducer (which == count - 1) finishes its part no earlier than one K step before
// any other part of the tile, on a timeline where every K step takes the same time (with two parts the
// other ends earlier; the reverse numbering would wait for one still running, which the check can tell);
// and the walk with the reducers' waits completes.
TEST(Gemm, StreamKPartsCoverEveryKStepOnce) {
  bool reverse_would_wait = false, three_parts = false;
  for (int grid = 1; grid <= 40; ++grid)
    for (int shared = 1; shared < 2 * grid; ++shared)
      for (int k_iters : {1, 2, 3, 7, 64}) {
        const long long U = 1ll * shared * k_iters;
        if (U < grid) continue;  // ranges under one K step: stream_k_tiles never shares so little
        const std::string at = std::to_string(grid) + " blocks, " + std::to_string(shared) + " tiles, " +
                               std::to_string(k_iters) + " K steps";
        std::vector<int> owner(size_t(U), -1);  // the block holding each K step
        struct part {
          int block, j, which, count;
          long long end;  // when the block finishes it, in K steps from the start of its range
        };
        std::vector<std::vector<part>> parts(static_cast<size_t>(shared));
        for (int b = 0; b < grid; ++b) {
          const long long s = b * U / grid;
          ASSERT_EQ(stream_k_part(3, b, grid, shared, k_iters).iters, 0) << at << ": block " << b;
          if (shared < grid) {
            ASSERT_EQ(stream_k_part(2, b, grid, shared, k_iters).iters, 0) << at << ": block " << b;
          }
          for (int j = 0; j < 3; ++j) {
            const StreamKPart p = stream_k_part(j, b, grid, shared, k_iters);
            if (p.iters == 0) continue;
            ASSERT_TRUE(p.tile >= 0 && p.tile < shared && p.first >= 0 && p.first + p.iters <= k_iters) << at;
            for (int i = 0; i < p.iters; ++i) {
              int& who = owner[size_t(1ll * p.tile * k_iters + p.first + i)];
              ASSERT_EQ(who, -1) << at << ": K step " << p.first + i << " of tile " << p.tile << " twice";
              who = b;
            }
            parts[size_t(p.tile)].push_back(
                {b, j, p.which, p.count, 1ll * p.tile * k_iters + p.first + p.iters - s});
          }
        }
        for (int who : owner) ASSERT_NE(who, -1) << at << ": a K step without an item";
        const int most = stream_k_max_parts(grid, shared, k_iters);
        size_t seen = 0;
        for (int t = 0; t < shared; ++t) {
          const auto& ps = parts[size_t(t)];
          ASSERT_TRUE(!ps.empty() && ps.size() <= size_t(most)) << at << ", tile " << t;
          if (shared > grid) {
            ASSERT_LE(ps.size(), 2u) << at << ", tile " << t;
          }
          seen = std::max(seen, ps.size());
          three_parts = three_parts || ps.size() >= 3;
          for (size_t i = 0; i < ps.size(); ++i) {
            ASSERT_EQ(ps[i].count, int(ps.size())) << at << ", tile " << t;
            // blocks in increasing order hold increasing K ranges: the last block's part is which 0
            ASSERT_EQ(ps[i].which, int(ps.size() - 1 - i)) << at << ", tile " << t;
            if (i > 0) {
              EXPECT_GE(ps[0].end + 1, ps[i].end) << at << ", tile " << t << ": the reducer would wait";
            }
          }
          if (ps.size() == 2 && shared > grid) {  // ranges longer than a tile: the other part ends first
            EXPECT_GE(ps[0].end, ps[1].end) << at << ", tile " << t << ": the reducer would wait";
            reverse_would_wait = reverse_would_wait || ps[1].end < ps[0].end;
          }
        }
        ASSERT_EQ(seen, size_t(most)) << at;
        // The walk: each block takes its items in order; a reducer waits until the tile's other parts are
        // done.
        std::vector<int> next(size_t(grid), 0);
        std::vector<int> done(size_t(shared), 0);  // parts of each tile done, the reducer's excluded
        for (bool moved = true; moved;) {
          moved = false;
          for (int b = 0; b < grid; ++b)
            while (next[size_t(b)] < 3) {
              const StreamKPart p = stream_k_part(next[size_t(b)], b, grid, shared, k_iters);
              if (p.iters > 0) {
                if (p.which == p.count - 1) {
                  if (done[size_t(p.tile)] < p.count - 1) break;
                } else {
                  ++done[size_t(p.tile)];
                }
              }
              ++next[size_t(b)];
              moved = true;
            }
        }
        for (int b = 0; b < grid; ++b) ASSERT_EQ(next[size_t(b)], 3) << at << ": block " << b << " stuck";
      }
  EXPECT_TRUE(reverse_would_wait);
  EXPECT_TRUE(three_parts);
}

TEST(Gemm, PlanRejectsUnsupportedSchedules) {
  auto error = [](GemmSchedule s, int sms = 132) -> std::string {
    try {
      plan_gemm(128, 4096, 4096, s, sms);
    } catch (const mp::user_error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error({}), "");
  GemmSchedule s;
  s.block_m = 32;
  EXPECT_NE(error(s).find("block_m must be 64 or 128"), std::string::npos) << error(s);
  s = {};
  s.block_m = 64;
  s.block_n = 256;
  EXPECT_NE(error(s).find("64-row tiles are 128 wide"), std::string::npos) << error(s);
  s.block_n = 64;  // 64 x 64 tiles measured slower than 64 x 128 and are not compiled
  EXPECT_NE(error(s).find("block_n must be 128 or 256"), std::string::npos) << error(s);
  s = {};
  s.block_m = 64;
  s.stream_k = stream_k_mode::on;
  EXPECT_NE(error(s).find("stream-K runs on 128-row tiles"), std::string::npos) << error(s);
  s = {};
  s.block_m = 128;
  s.block_n = 96;
  EXPECT_NE(error(s).find("block_n must be 128 or 256"), std::string::npos) << error(s);
  s = {};
  s.split_k = -1;
  EXPECT_NE(error(s).find("split_k must be 0"), std::string::npos) << error(s);
  s = {};
  s.group_m = 0;
  EXPECT_NE(error(s).find("group_m must be at least 1"), std::string::npos) << error(s);
  s = {};
  s.data_only = s.compute_only = true;
  EXPECT_NE(error(s).find("data_only and compute_only exclude each other"), std::string::npos) << error(s);
  // A split lead must leave the shorter splits at least one K step (128 x 4096 x 4096: 2 splits of 64).
  s = {};
  s.split_lead = 31;
  EXPECT_EQ(error(s), "");
  s.split_lead = 32;
  EXPECT_NE(error(s).find("split_lead 32 leaves no K steps to the shorter splits"), std::string::npos)
      << error(s);
  EXPECT_NE(error(s).find("use at most 31"), std::string::npos) << error(s);
  s.split_lead = -2;
  EXPECT_NE(error(s).find("split_lead must be -1"), std::string::npos) << error(s);
  s = {};
  s.split_k = 1;
  s.split_lead = 2;
  EXPECT_NE(error(s).find("applies to split tiles"), std::string::npos) << error(s);
  s.split_lead = 0;  // no lead asked for: fine without splits
  EXPECT_EQ(error(s), "");
  EXPECT_NE(error({}, 0).find("SM count must be positive"), std::string::npos) << error({}, 0);
}

// --schedule's text (apply_schedule): each key sets its field, later pairs win, and every malformed pair
// is a user error naming the pair and what it may be.
TEST(Gemm, ApplyScheduleSetsTheNamedFields) {
  GemmSchedule s;
  apply_schedule("block_m=64,block_n=128,split_k=2,split_lead=3,group_m=8,stream_k=0,epilogue=immediate,"
                 "persistent=0,fixed_reducer=0",
                 s);
  EXPECT_EQ(s.block_m, 64);
  EXPECT_EQ(s.block_n, 128);
  EXPECT_EQ(s.split_k, 2);
  EXPECT_EQ(s.split_lead, 3);
  EXPECT_EQ(s.group_m, 8);
  EXPECT_EQ(s.stream_k, stream_k_mode::off);
  EXPECT_EQ(s.epilogue, epilogue_mode::immediate);
  EXPECT_FALSE(s.persistent);
  EXPECT_FALSE(s.fixed_reducer);
  apply_schedule("split_lead=auto,l2=none,l2_a=last", s);
  EXPECT_EQ(s.split_lead, -1);
  EXPECT_EQ(s.l2_a, l2_priority::evict_last);
  EXPECT_EQ(s.l2_b, l2_priority::normal);
  EXPECT_EQ(s.l2_c, l2_priority::normal);
  apply_schedule("l2=auto,block_m=128,block_m=0", s);  // later pairs win
  EXPECT_EQ(s.l2_a, l2_priority::automatic);
  EXPECT_EQ(s.l2_c, l2_priority::automatic);
  EXPECT_EQ(s.block_m, 0);
  // the plan follows the text: 128 x 4096 x 4096 on 128-row tiles split 4 ways, no hints
  GemmSchedule t;
  apply_schedule("block_m=128,split_k=4,l2=none", t);
  EXPECT_EQ(describe_plan(plan_gemm(128, 4096, 4096, t, 132), t),
            "128x128x64 tiles, 32 tiles, split-K 4 (lead 2 K steps), persistent grid");
}

TEST(Gemm, ApplyScheduleRejectsBadPairs) {
  for (auto [text, says] : {std::pair<const char*, const char*>{"", "empty"},
                            {"block_m", "'block_m' is not key=value"},
                            {"=64", "'=64' is not key=value"},
                            {"block_m=64,", "'' is not key=value"},
                            {"tile=64", "unknown key 'tile'"},
                            {"block_m=32", "block_m=32 must be 0, 64 or 128"},
                            {"block_n=64", "block_n=64 must be 0, 128 or 256"},
                            {"split_k=-1", "split_k=-1 is not a whole number from 0 to 1024"},
                            {"split_k=99999999999", "is not a whole number"},
                            {"split_k=2x", "split_k=2x is not a whole number"},
                            {"group_m=0", "group_m=0 is not a whole number from 1"},
                            {"stream_k=2", "stream_k=2 must be auto, 0 or 1"},
                            {"epilogue=deferred", "epilogue=deferred must be auto, immediate or whole"},
                            {"l2=keep", "l2=keep must be auto or none"},
                            {"l2_b=keep", "l2_b=keep must be auto, normal, first or last"},
                            {"persistent=yes", "persistent=yes must be 0 or 1"}}) {
    GemmSchedule s;
    try {
      apply_schedule(text, s);
      ADD_FAILURE() << "accepted: '" << text << "'";
    } catch (const mp::user_error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << text << ": " << e.what();
    }
  }
}
