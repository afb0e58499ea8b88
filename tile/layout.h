// Host- and device-callable layout math of the tile layer: shared-memory swizzles, the byte offset of an
// element in a shared tile, and the wgmma shared-memory matrix descriptor. Plain constexpr C++ (no CUDA
// headers), so CI checks every coordinate on the CPU (tests/tile/test_layout.cpp).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define MP_HD __host__ __device__ __forceinline__
#else
#define MP_HD inline
#endif

namespace mp::tile {

// The shared-memory swizzles TMA and wgmma both understand. The value is the span in bytes over which
// 16-byte units are permuted (0: none, "interleave" in the PTX ISA).
enum class swizzle : int { none = 0, b32 = 32, b64 = 64, b128 = 128 };

MP_HD constexpr int swizzle_bytes(swizzle s) { return static_cast<int>(s); }

// log2 of the number of 16-byte units a swizzle permutes (1, 2, 3), 0 for none.
MP_HD constexpr int swizzle_bits(swizzle s) {
  return s == swizzle::b128 ? 3 : s == swizzle::b64 ? 2 : s == swizzle::b32 ? 1 : 0;
}

// The hardware swizzle acts on shared-memory address bits: bits [4, 4+b) are XORed with bits [7, 7+b).
// It is defined on absolute addresses, which is why swizzled tiles are aligned to 1024 bytes: then the
// function can be applied to offsets inside the tile.
MP_HD constexpr uint32_t swizzle_address(swizzle s, uint32_t byte) {
  const uint32_t b = static_cast<uint32_t>(swizzle_bits(s));
  const uint32_t mask = (1u << b) - 1u;
  return byte ^ (((byte >> 7) & mask) << 4);
}

// A shared tile of R x C elements of E bytes each, stored as C / W column chunks of R rows x W elements
// (W = swizzle span / E; the whole row when unswizzled), one chunk after the other. A chunk is what one
// TMA box fills, and what a K-major (chunk holds all K) or MN-major wgmma operand expects.
template <int R, int C, int E, swizzle S>
struct st_layout {
  static constexpr int rows = R, cols = C, elem_bytes = E;
  static constexpr int chunk_cols = S == swizzle::none ? C : swizzle_bytes(S) / E;
  static constexpr int chunks = C / chunk_cols;
  static constexpr int row_bytes = chunk_cols * E;
  static constexpr int chunk_bytes = R * row_bytes;
  static constexpr int bytes = R * C * E;
  static_assert(R > 0 && C > 0, "a shared tile needs at least one row and one column");
  static_assert(C % chunk_cols == 0,
                "shared tile: columns must be a multiple of the swizzle span in elements");
  static_assert(S == swizzle::none || (R * row_bytes) % (8 * row_bytes) == 0,
                "swizzled shared tile: rows must be a multiple of 8 (one swizzle pattern)");

  // Byte offset of element (r, c) from the tile's (1024-byte aligned) base.
  MP_HD static constexpr uint32_t offset(int r, int c) {
    const uint32_t chunk = static_cast<uint32_t>(c / chunk_cols);
    const uint32_t in = static_cast<uint32_t>(r * row_bytes + (c % chunk_cols) * E);
    return chunk * chunk_bytes + swizzle_address(S, in);
  }
};

// ---- wgmma shared-memory matrix descriptor (PTX ISA: "Matrix Descriptor Format") ----
// bits 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4,
// 49-51 base offset (0 for 1024-aligned swizzled tiles), 62-63 swizzle (0 none, 1 128B, 2 64B, 3 32B).
MP_HD constexpr uint64_t desc_swizzle_code(swizzle s) {
  return s == swizzle::b128 ? 1 : s == swizzle::b64 ? 2 : s == swizzle::b32 ? 3 : 0;
}

MP_HD constexpr uint64_t make_wgmma_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo, swizzle s) {
  return (uint64_t((smem_addr & 0x3FFFF) >> 4)) | (uint64_t((lbo & 0x3FFFF) >> 4) << 16) |
         (uint64_t((sbo & 0x3FFFF) >> 4) << 32) | (desc_swizzle_code(s) << 62);
}

struct wgmma_desc_fields {
  uint32_t start, lbo, sbo;
  int swizzle_code;
};
MP_HD constexpr wgmma_desc_fields decode_wgmma_desc(uint64_t d) {
  return {uint32_t(d & 0x3FFF) << 4, uint32_t((d >> 16) & 0x3FFF) << 4, uint32_t((d >> 32) & 0x3FFF) << 4,
          int(d >> 62)};
}

// Which dimension of a wgmma operand is contiguous in shared memory: K-major ("row-major A", "B stored
// N x K") or MN-major (B stored K x N, which wgmma reads with its transpose bit set).
enum class major { k, mn };

// The descriptor of the k16 step `ks` of an operand held in a shared tile with layout L, 16-bit elements.
// K-major: the tile is MN rows x K cols; one chunk holds 64 K values, 8-row groups are row_bytes*8 apart.
// MN-major: the tile is K rows x MN cols; chunks of 64 MN values are chunk_bytes apart (LBO), 8-row K
// groups are 8*row_bytes apart (SBO); the k16 step moves 16 rows.
template <class L, major M>
MP_HD constexpr uint64_t wgmma_operand_desc(uint32_t tile_addr, int ks) {
  static_assert(L::elem_bytes == 2, "wgmma operand descriptors here are for 16-bit elements (bf16, fp16)");
  constexpr swizzle S = L::chunk_cols * 2 == 128  ? swizzle::b128
                        : L::chunk_cols * 2 == 64 ? swizzle::b64
                                                  : swizzle::b32;
  if constexpr (M == major::k) {
    // k16 = 32 bytes inside a swizzled row; when a chunk holds fewer K values than the step reaches,
    // the step moves to the next chunk.
    constexpr int k_per_chunk = L::chunk_cols;
    const int k0 = ks * 16;
    const uint32_t addr =
        tile_addr + uint32_t(k0 / k_per_chunk) * L::chunk_bytes + uint32_t(k0 % k_per_chunk) * 2;
    return make_wgmma_desc(addr, 16, 8 * L::row_bytes, S);
  } else {
    const uint32_t addr = tile_addr + uint32_t(ks * 16 * L::row_bytes);
    return make_wgmma_desc(addr, L::chunk_bytes, 8 * L::row_bytes, S);
  }
}

// The k16 steps of one operand tile differ only in the descriptor's start-address field, by a constant:
// wgmma_operand_desc<L, M>(addr, ks) == wgmma_desc_add(wgmma_operand_desc<L, M>(addr, 0),
// wgmma_desc_step<L, M>(ks)) for every tile that lies in shared memory (below 256 KB, so the 14-bit start
// field does not carry; the CPU tests check every address). A kernel then builds one descriptor per
// operand and K step and adds compile-time constants, instead of rebuilding each k16 step's descriptor.
template <class L, major M>
MP_HD constexpr uint32_t wgmma_desc_step(int ks) {
  return uint32_t(wgmma_operand_desc<L, M>(0u, ks) - wgmma_operand_desc<L, M>(0u, 0));
}
// Adds to the start-address field (the low word) only: one integer add, the high word untouched.
MP_HD constexpr uint64_t wgmma_desc_add(uint64_t desc, uint32_t step) {
  return (desc & 0xFFFFFFFF00000000ull) | uint64_t(uint32_t(desc) + step);
}

// A model of how wgmma reads a descriptor (the PTX ISA's canonical layouts, 16-bit elements): the smem
// address of operand element (mn, k), 0 <= k < 16. Used by the CPU tests to prove that the descriptors
// above address exactly the elements of our shared tiles.
MP_HD constexpr uint32_t wgmma_model_address(uint64_t desc, major m, int mn, int k) {
  const auto f = decode_wgmma_desc(desc);
  const swizzle s = f.swizzle_code == 1 ? swizzle::b128 : f.swizzle_code == 2 ? swizzle::b64 : swizzle::b32;
  const int span = swizzle_bytes(s);  // bytes of one row of the swizzle atom
  uint32_t a = 0;
  if (m == major::k) {
    // ((8, m), (T, 2k)) : ((span, SBO), (1 elem, 16 bytes)) — rows of `span` bytes, 8-row groups SBO apart.
    a = f.start + uint32_t(mn % 8) * span + uint32_t(mn / 8) * f.sbo + uint32_t(k) * 2;
  } else {
    // MN contiguous: span/2 elements per row, further MN chunks LBO apart; K rows span apart, 8-row
    // groups SBO apart.
    const int per = span / 2;
    a = f.start + uint32_t(mn % per) * 2 + uint32_t(mn / per) * f.lbo + uint32_t(k % 8) * span +
        uint32_t(k / 8) * f.sbo;
  }
  return swizzle_address(s, a);
}

}  // namespace mp::tile
