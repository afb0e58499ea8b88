// TMA (cp.async.bulk.tensor) tile loads completing on a semaphore, and tile stores, at thread scope: one
// thread issues them for the whole tile. The tensor map comes from make_tma_map<ST>() (tile/tma_host.h)
// and is passed to the kernel as a __grid_constant__ parameter.
#pragma once
#ifdef __CUDACC_RTC__
// NVRTC (the CUDA lowering's generated units) has no host headers: the driver API's opaque 128-byte map,
// as cuda.h declares it, is all the device code needs.
typedef struct alignas(64) CUtensorMap_st {
  unsigned long long opaque[16];
} CUtensorMap;
#else
#include <cuda.h>
#endif

#include "tile/sync.cuh"
#include "tile/types.cuh"

namespace mp::tile::tma {

// Fetch a tensor map (a __grid_constant__ kernel parameter) into the SM's descriptor cache ahead of its
// first use, so that the first load or store through it does not wait for the fetch.
__device__ inline void prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

namespace detail {
// The TMA boxes of a tile load (one per column chunk), completing on `bar`; with Hint, each carries the L2
// policy `policy` for the lines it reads (.L2::cache_hint).
template <bool Hint, class ST>
__device__ inline void load_tile(ST& dst, const CUtensorMap* map, semaphore& bar, int row, int col, int d, int b,
                                 uint64_t policy) {
  using L = typename ST::layout;
#pragma unroll
  for (int j = 0; j < L::chunks; ++j) {
    const uint32_t to = dst.smem_addr() + j * L::chunk_bytes;
    const uint64_t m = reinterpret_cast<uint64_t>(map);
    const int c = col + j * L::chunk_cols;
    if constexpr (Hint)
      asm volatile(
          "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint "
          "[%0], [%1, {%2, %3, %4, %5}], [%6], %7;" ::"r"(to),
          "l"(m), "r"(c), "r"(row), "r"(d), "r"(b), "r"(bar.addr()), "l"(policy)
          : "memory");
    else
      asm volatile(
          "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
          "%3, %4, %5}], [%6];" ::"r"(to),
          "l"(m), "r"(c), "r"(row), "r"(d), "r"(b), "r"(bar.addr())
          : "memory");
  }
}
// The TMA boxes of a tile store, one bulk group's worth; with Hint, with an L2 policy for the lines written.
template <bool Hint, class ST>
__device__ inline void store_tile(const CUtensorMap* map, const ST& src, int row, int col, int d, int b,
                                  uint64_t policy) {
  using L = typename ST::layout;
#pragma unroll
  for (int j = 0; j < L::chunks; ++j) {
    const uint32_t from = src.smem_addr() + j * L::chunk_bytes;
    const uint64_t m = reinterpret_cast<uint64_t>(map);
    const int c = col + j * L::chunk_cols;
    if constexpr (Hint)
      asm volatile(
          "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group.L2::cache_hint [%0, {%2, %3, %4, %5}], "
          "[%1], %6;" ::"l"(m),
          "r"(from), "r"(c), "r"(row), "r"(d), "r"(b), "l"(policy)
          : "memory");
    else
      asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(
                       m),
                   "r"(from), "r"(c), "r"(row), "r"(d), "r"(b)
                   : "memory");
  }
}
}  // namespace detail

// Load the tile whose top-left element is (row, col) of the (b, d) matrix into `dst`; the semaphore's
// phase completes when all bytes have landed (out-of-bounds elements are written as zeros). Each column
// chunk of the tile is one TMA box.
template <class ST>
__device__ inline void load_async(ST& dst, const CUtensorMap* map, semaphore& bar, int row, int col,
                                  int d = 0, int b = 0) {
  detail::load_tile<false>(dst, map, bar, row, col, d, b, 0);
}

// Load column chunks [first, first + count) of the tile into the same shared-memory offset of every block
// in `cta_mask` (thread-block cluster multicast); each receiver's semaphore at the same offset gets the
// bytes. The loading block passes its own tile and semaphore.
template <class ST>
__device__ inline void load_chunks_multicast(ST& dst, const CUtensorMap* map, semaphore& bar,
                                             uint16_t cta_mask, int first, int count, int row, int col,
                                             int d = 0, int b = 0) {
  using L = typename ST::layout;
  for (int j = first; j < first + count; ++j) {
    const uint32_t to = dst.smem_addr() + j * L::chunk_bytes;
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;" ::"r"(to),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(col + j * L::chunk_cols), "r"(row), "r"(d), "r"(b),
        "r"(bar.addr()), "h"(cta_mask)
        : "memory");
  }
}
template <class ST>
__device__ inline void load_async_multicast(ST& dst, const CUtensorMap* map, semaphore& bar,
                                            uint16_t cta_mask, int row, int col, int d = 0, int b = 0) {
  load_chunks_multicast(dst, map, bar, cta_mask, 0, ST::layout::chunks, row, col, d, b);
}

// Ask for the tile at (row, col) to be brought into L2 (no shared memory, no completion to wait for), so
// that a later load_async of it does not pay DRAM latency.
template <class ST>
__device__ inline void prefetch_l2(const CUtensorMap* map, int row, int col, int d = 0, int b = 0) {
  using L = typename ST::layout;
#pragma unroll
  for (int j = 0; j < L::chunks; ++j)
    asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];" ::"l"(
                     reinterpret_cast<uint64_t>(map)),
                 "r"(col + j * L::chunk_cols), "r"(row), "r"(d), "r"(b)
                 : "memory");
}

// L2 eviction priority of a load's or store's lines (createpolicy.fractional, applied to every line):
// evict_first lines are the first candidates for replacement, evict_last lines the last. A policy is a
// 64-bit value passed to the *_hint variants below.
enum class l2_priority { normal = 0, evict_first = 1, evict_last = 2 };
__device__ inline uint64_t l2_policy(l2_priority p) {
  uint64_t r = 0;
  if (p == l2_priority::evict_first)
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(r));
  else if (p == l2_priority::evict_last)
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(r));
  else
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(r));
  return r;
}
// load_async with an L2 policy (l2_policy) for the lines it reads.
template <class ST>
__device__ inline void load_async_hint(ST& dst, const CUtensorMap* map, semaphore& bar, int row, int col,
                                       uint64_t policy, int d = 0, int b = 0) {
  detail::load_tile<true>(dst, map, bar, row, col, d, b, policy);
}

// Store a tile to global memory (elements out of bounds are skipped). Completion: commit_group() then
// wait_read<0>() before the shared tile is reused, or wait_all<0>() before the data is read elsewhere.
template <class ST>
__device__ inline void store_async(const CUtensorMap* map, const ST& src, int row, int col, int d = 0,
                                   int b = 0) {
  detail::store_tile<false>(map, src, row, col, d, b, 0);
}
// store_async with an L2 policy (l2_policy) for the lines it writes.
template <class ST>
__device__ inline void store_async_hint(const CUtensorMap* map, const ST& src, int row, int col, uint64_t policy,
                                        int d = 0, int b = 0) {
  detail::store_tile<true>(map, src, row, col, d, b, policy);
}
__device__ inline void commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
template <int N>
__device__ inline void wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
template <int N>
__device__ inline void wait_all() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

// Bytes one load_async of this tile type brings in (the full box, zeros included).
template <class ST>
__host__ __device__ constexpr uint32_t bytes() {
  return ST::bytes;
}

}  // namespace mp::tile::tma
