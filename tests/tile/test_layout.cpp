// CPU tests of the tile layer's layout math: swizzles against their definition for every coordinate,
// shared-tile offsets, and wgmma descriptors checked against a model of how the hardware reads them.
#include <gtest/gtest.h>

#include <set>

#include "tile/layout.h"

using namespace mp::tile;

namespace {
// The swizzles as the CUDA programming guide draws them: 16-byte unit j of row r of the pattern moves to
// j ^ (r / rows_per_xor_step) within the span, where a pattern row is the swizzle span long.
uint32_t reference_swizzle(swizzle s, uint32_t byte) {
  const int span = swizzle_bytes(s);
  if (span == 0) return byte;
  const uint32_t atom = 8 * 128;  // every pattern repeats after 1024 bytes
  const uint32_t base = byte / atom * atom, in = byte % atom;
  const uint32_t row = in / span, unit = (in % span) / 16, lo = in % 16;
  const uint32_t units = span / 16;
  const uint32_t xor_step = 128 / span;  // 128B: every row, 64B: every 2 rows, 32B: every 4 rows
  const uint32_t swz_unit = unit ^ ((row / xor_step) % units);
  return base + row * span + swz_unit * 16 + lo;
}
}  // namespace

TEST(TileLayout, SwizzleMatchesDefinitionEverywhere) {
  for (swizzle s : {swizzle::none, swizzle::b32, swizzle::b64, swizzle::b128})
    for (uint32_t b = 0; b < 16384; ++b)
      ASSERT_EQ(swizzle_address(s, b), reference_swizzle(s, b)) << "swizzle " << int(s) << " byte " << b;
}

TEST(TileLayout, SwizzleIsAPermutationOfEach1024Bytes) {
  for (swizzle s : {swizzle::b32, swizzle::b64, swizzle::b128}) {
    std::set<uint32_t> seen;
    for (uint32_t b = 0; b < 1024; b += 16) {
      const uint32_t t = swizzle_address(s, b);
      EXPECT_LT(t, 1024u);
      EXPECT_TRUE(seen.insert(t).second) << "collision at " << b;
    }
  }
}

template <int R, int C, swizzle S>
void check_st_layout() {
  using L = st_layout<R, C, 2, S>;
  std::set<uint32_t> seen;
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      const uint32_t o = L::offset(r, c);
      // chunked, row-major inside a chunk, then swizzled
      const int W = L::chunk_cols;
      const uint32_t plain = uint32_t(c / W) * R * W * 2 + uint32_t(r) * W * 2 + uint32_t(c % W) * 2;
      ASSERT_EQ(o, reference_swizzle(S, plain)) << r << "," << c;
      ASSERT_LT(o, uint32_t(L::bytes));
      ASSERT_TRUE(seen.insert(o).second) << "two elements at byte " << o;
    }
  EXPECT_EQ(seen.size(), size_t(R) * C);
}

TEST(TileLayout, SharedTileOffsetsEveryCoordinate) {
  check_st_layout<64, 64, swizzle::b128>();
  check_st_layout<128, 64, swizzle::b128>();
  check_st_layout<256, 64, swizzle::b128>();
  check_st_layout<64, 256, swizzle::b128>();
  check_st_layout<64, 32, swizzle::b64>();
  check_st_layout<32, 16, swizzle::b32>();
  check_st_layout<16, 16, swizzle::none>();
  static_assert(st_layout<64, 256, 2, swizzle::b128>::chunks == 4);
  static_assert(st_layout<64, 256, 2, swizzle::b128>::chunk_bytes == 8192);
}

TEST(TileLayout, DescriptorFieldsRoundTrip) {
  const uint64_t d = make_wgmma_desc(0x1A3F0, 8192, 1024, swizzle::b128);
  const auto f = decode_wgmma_desc(d);
  EXPECT_EQ(f.start, 0x1A3F0u);
  EXPECT_EQ(f.lbo, 8192u);
  EXPECT_EQ(f.sbo, 1024u);
  EXPECT_EQ(f.swizzle_code, 1);
  EXPECT_EQ(d >> 62, 1u);
  EXPECT_EQ((d >> 49) & 7, 0u);  // base offset 0: tiles are 1024-byte aligned
  EXPECT_EQ(decode_wgmma_desc(make_wgmma_desc(0, 16, 512, swizzle::b64)).swizzle_code, 2);
  EXPECT_EQ(decode_wgmma_desc(make_wgmma_desc(0, 16, 256, swizzle::b32)).swizzle_code, 3);
}

// For every k16 step and every (mn, k) an m64nNk16 instruction reads, the address the descriptor leads
// the hardware to must be where our shared tile keeps that element.
template <int MN, int K, swizzle S>
void check_k_major_operand() {
  using L = st_layout<MN, K, 2, S>;     // MN rows, K contiguous
  const uint32_t base = 3 * 1024 * 16;  // a 1024-aligned tile address
  for (int ks = 0; ks < K / 16; ++ks) {
    const uint64_t d = wgmma_operand_desc<L, major::k>(base, ks);
    for (int mn = 0; mn < MN; ++mn)
      for (int k = 0; k < 16; ++k)
        ASSERT_EQ(wgmma_model_address(d, major::k, mn, k), base + L::offset(mn, ks * 16 + k))
            << "ks " << ks << " mn " << mn << " k " << k;
  }
}
template <int K, int MN, swizzle S>
void check_mn_major_operand() {
  using L = st_layout<K, MN, 2, S>;  // K rows, MN contiguous
  const uint32_t base = 5 * 1024 * 16;
  for (int ks = 0; ks < K / 16; ++ks) {
    const uint64_t d = wgmma_operand_desc<L, major::mn>(base, ks);
    for (int mn = 0; mn < MN; ++mn)
      for (int k = 0; k < 16; ++k)
        ASSERT_EQ(wgmma_model_address(d, major::mn, mn, k), base + L::offset(ks * 16 + k, mn))
            << "ks " << ks << " mn " << mn << " k " << k;
  }
}

TEST(TileLayout, WgmmaDescriptorsKMajorEveryCoordinate) {
  check_k_major_operand<64, 64, swizzle::b128>();   // A slice of the GEMM
  check_k_major_operand<256, 64, swizzle::b128>();  // B stored N x K
  check_k_major_operand<64, 128, swizzle::b128>();  // K spanning two chunks
  check_k_major_operand<64, 32, swizzle::b64>();
  check_k_major_operand<64, 16, swizzle::b32>();
}

TEST(TileLayout, WgmmaDescriptorsMNMajorEveryCoordinate) {
  check_mn_major_operand<64, 256, swizzle::b128>();  // B stored K x N
  check_mn_major_operand<64, 128, swizzle::b128>();
  check_mn_major_operand<32, 64, swizzle::b128>();
}

// The per-step descriptors the warpgroup mma builds (step 0's descriptor plus a constant) equal the ones
// built from scratch, for every 16-byte-aligned tile address whose tile lies in the 228 KB of shared
// memory a Hopper block can have, and every k16 step.
template <class L, major M>
void check_desc_steps(int ksteps, uint32_t tile_bytes) {
  constexpr uint32_t smem_bytes = 228 * 1024;
  for (uint32_t base = 0; base + tile_bytes <= smem_bytes; base += 16) {
    const uint64_t d0 = wgmma_operand_desc<L, M>(base, 0);
    for (int ks = 0; ks < ksteps; ++ks) {
      const uint64_t stepped = wgmma_desc_add(d0, wgmma_desc_step<L, M>(ks));
      const uint64_t direct = wgmma_operand_desc<L, M>(base, ks);
      ASSERT_EQ(stepped, direct) << "base " << base << " ks " << ks;
    }
  }
}

TEST(TileLayout, WgmmaDescriptorStepsMatchEveryAddress) {
  check_desc_steps<st_layout<64, 64, 2, swizzle::b128>, major::k>(4, 64 * 64 * 2);
  check_desc_steps<st_layout<256, 64, 2, swizzle::b128>, major::k>(4, 256 * 64 * 2);
  check_desc_steps<st_layout<64, 128, 2, swizzle::b128>, major::k>(8, 64 * 128 * 2);
  check_desc_steps<st_layout<64, 32, 2, swizzle::b64>, major::k>(2, 64 * 32 * 2);
  check_desc_steps<st_layout<64, 16, 2, swizzle::b32>, major::k>(1, 64 * 16 * 2);
  check_desc_steps<st_layout<64, 256, 2, swizzle::b128>, major::mn>(4, 64 * 256 * 2);
  check_desc_steps<st_layout<64, 128, 2, swizzle::b128>, major::mn>(4, 64 * 128 * 2);
  check_desc_steps<st_layout<32, 64, 2, swizzle::b128>, major::mn>(2, 32 * 64 * 2);
  // A tile that would end past 256 KB is where the start field would carry: not a shared-memory tile.
  using A = st_layout<64, 64, 2, swizzle::b128>;
  const uint64_t stepped =
      wgmma_desc_add(wgmma_operand_desc<A, major::k>(0x3FFF0, 0), wgmma_desc_step<A, major::k>(1));
  EXPECT_NE(stepped, (wgmma_operand_desc<A, major::k>(0x3FFF0, 1)));
}
