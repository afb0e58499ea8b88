// The tile layer's data types: register tiles and vectors (rt, rv), shared tiles and vectors (st, sv) and
// global layouts (gl). Names say memory space, shape and element type: rt_bf<16,64>, st_bf<64,64>.
#pragma once
#ifdef __CUDACC_RTC__
// NVRTC (the CUDA lowering's generated units): no math.h, so INFINITY from libcu++.
#include <cuda/std/limits>
#ifndef INFINITY
#define INFINITY (::cuda::std::numeric_limits<float>::infinity())
#endif
#endif
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "tile/layout.h"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900 || !defined(__CUDA_ARCH_FEAT_SM90_ALL))
#error \
    "the metapipe tile layer needs Hopper's arch-specific target: compile with -gencode=arch=compute_90a,code=sm_90a (CMAKE_CUDA_ARCHITECTURES=90a)"
#endif

namespace mp::tile {

constexpr int warp_threads = 32;
constexpr int warpgroup_threads = 128;
constexpr int warpgroup_warps = 4;

// ---- element types and their packed pairs ----
template <class T>
struct packed;
template <>
struct packed<float> {
  using type = float2;
};
template <>
struct packed<__nv_bfloat16> {
  using type = __nv_bfloat162;
};
template <>
struct packed<__half> {
  using type = __half2;
};
template <class T>
using packed_t = typename packed<T>::type;
template <class T>
concept tile_element =
    std::is_same_v<T, float> || std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

using bf16 = __nv_bfloat16;
using f16 = __half;

// ---- register tiles (one warp owns one; a warpgroup owns four, one per 16-row slice) ----
// Layouts: `row_l` is the mma accumulator / A-operand fragment: lane l holds pairs of adjacent columns
// (2*(l%4), +1) in rows l/4 and l/4+8 of each 16x16 block. `col_l` is its transpose: pairs of adjacent
// rows (2*(l%4), +1) in columns l/4 and l/4+8 (the B-operand fragment of mma.sync).
struct row_l {};
struct col_l {};
template <class L>
concept tile_layout = std::is_same_v<L, row_l> || std::is_same_v<L, col_l>;

template <tile_element T, int R, int C, tile_layout L = row_l>
struct rt {
  static_assert(R % 16 == 0,
                "rt: the row count must be a multiple of 16 (tiles are built from 16x16 blocks)");
  static_assert(C % 16 == 0,
                "rt: the column count must be a multiple of 16 (tiles are built from 16x16 blocks)");
  using elem = T;
  using pair = packed_t<T>;
  using layout = L;
  static constexpr int rows = R, cols = C, height = R / 16, width = C / 16;
  // Block (i, j), fragment f: row_l: f=0 (r, c), 1 (r+8, c), 2 (r, c+8), 3 (r+8, c+8) with r = lane/4,
  // c = 2*(lane%4). In a 16-row tile this order is exactly wgmma's accumulator register order.
  pair tiles[height][width][4];
};
template <int R, int C, class L = row_l>
using rt_fl = rt<float, R, C, L>;
template <int R, int C, class L = row_l>
using rt_bf = rt<bf16, R, C, L>;
template <int R, int C, class L = row_l>
using rt_hf = rt<f16, R, C, L>;

// ---- register vectors: one value per row (rows_v, what row_max yields) or per column (cols_v) of an rt ----
struct rows_v {};
struct cols_v {};
template <tile_element T, int N, class A = rows_v>
struct rv {
  static_assert(N % 16 == 0, "rv: the length must be a multiple of 16");
  static constexpr int length = N, blocks = N / 16;
  // rows_v: v[b][0] is row 16b + lane/4, v[b][1] row 16b + lane/4 + 8 (replicated over the lane quad).
  // cols_v: v[b][0..1] cols 16b + 2*(lane%4) + {0,1}, v[b][2..3] the same + 8 (replicated over quads).
  T v[blocks][std::is_same_v<A, rows_v> ? 2 : 4];
};
template <int N, class A = rows_v>
using rv_fl = rv<float, N, A>;
template <int N, class A = rows_v>
using rv_bf = rv<bf16, N, A>;

// ---- shared tiles: swizzled so that TMA writes and wgmma / ldmatrix read them without bank conflicts ----
template <int C, int E>
constexpr swizzle default_swizzle() {
  return (C * E) % 128 == 0  ? swizzle::b128
         : (C * E) % 64 == 0 ? swizzle::b64
         : (C * E) % 32 == 0 ? swizzle::b32
                             : swizzle::none;
}
template <tile_element T, int R, int C, swizzle S = default_swizzle<C, sizeof(T)>()>
struct alignas(1024) st {
  using elem = T;
  using layout = st_layout<R, C, sizeof(T), S>;
  static constexpr int rows = R, cols = C;
  static constexpr swizzle swz = S;
  static constexpr int bytes = layout::bytes;
  T data[R * C];
  // The element (r, c). A store through this reference is a generic one (ST.E, 64-bit address) unless the
  // compiler can prove the address space; a hot loop writes with st_shared_b32 (tile/sync.cuh) at
  // smem_addr() + layout::offset(r, c) instead.
  __device__ T& at(int r, int c) {
    return *reinterpret_cast<T*>(reinterpret_cast<char*>(data) + layout::offset(r, c));
  }
  __device__ const T& at(int r, int c) const {
    return *reinterpret_cast<const T*>(reinterpret_cast<const char*>(data) + layout::offset(r, c));
  }
  __device__ uint32_t smem_addr() const { return static_cast<uint32_t>(__cvta_generic_to_shared(data)); }
  // Rows [i*SR, (i+1)*SR) as a tile of their own: exact when the tile is one chunk (all columns inside
  // one swizzle span), since whole 8-row swizzle patterns then stay together.
  template <int SR>
  __device__ st<T, SR, C, S>& subtile_rows(int i) {
    static_assert(layout::chunks == 1, "subtile_rows: only for tiles whose columns fit in one swizzle span");
    static_assert(R % SR == 0 && SR % 8 == 0,
                  "subtile_rows: the sub-tile height must divide R and be a multiple of 8");
    return *reinterpret_cast<st<T, SR, C, S>*>(reinterpret_cast<char*>(data) + i * SR * layout::row_bytes);
  }
};
template <int R, int C>
using st_bf = st<bf16, R, C>;
template <int R, int C>
using st_hf = st<f16, R, C>;
template <int R, int C>
using st_fl = st<float, R, C>;

template <tile_element T, int N>
struct alignas(16) sv {
  static constexpr int length = N;
  T data[N];
};
template <int N>
using sv_fl = sv<float, N>;
template <int N>
using sv_bf = sv<bf16, N>;

// ---- global layouts: up to 4-D (batch, depth, rows, cols); a dimension is fixed at compile time, or
// given at run time when its template value is -1. Row-major, the columns contiguous. ----
template <tile_element T, int B, int D, int R, int C>
struct gl {
  using elem = T;
  T* data = nullptr;
  int b_ = B > 0 ? B : 0, d_ = D > 0 ? D : 0, r_ = R > 0 ? R : 0, c_ = C > 0 ? C : 0;
  gl() = default;
  __host__ __device__ gl(T* p, int b, int d, int r, int c)
      : data(p), b_(B > 0 ? B : b), d_(D > 0 ? D : d), r_(R > 0 ? R : r), c_(C > 0 ? C : c) {}
  __host__ __device__ int batch() const { return B > 0 ? B : b_; }
  __host__ __device__ int depth() const { return D > 0 ? D : d_; }
  __host__ __device__ int rows() const { return R > 0 ? R : r_; }
  __host__ __device__ int cols() const { return C > 0 ? C : c_; }
  __host__ __device__ size_t offset(int b, int d, int r, int c) const {
    return ((size_t(b) * depth() + d) * rows() + r) * size_t(cols()) + c;
  }
  __host__ __device__ T* ptr(int b, int d, int r, int c) const { return data + offset(b, d, r, c); }
};

// ---- kinds, for constraining the operations ----
template <class X>
struct is_rt : std::false_type {};
template <class T, int R, int C, class L>
struct is_rt<rt<T, R, C, L>> : std::true_type {};
template <class X>
struct is_st : std::false_type {};
template <class T, int R, int C, swizzle S>
struct is_st<st<T, R, C, S>> : std::true_type {};
template <class X>
struct is_rv : std::false_type {};
template <class T, int N, class A>
struct is_rv<rv<T, N, A>> : std::true_type {};
template <class X>
struct is_sv : std::false_type {};
template <class T, int N>
struct is_sv<sv<T, N>> : std::true_type {};
template <class X>
struct is_gl : std::false_type {};
template <class T, int B, int D, int R, int C>
struct is_gl<gl<T, B, D, R, C>> : std::true_type {};
template <class X>
concept reg_tile = is_rt<std::remove_cvref_t<X>>::value;
template <class X>
concept shared_tile = is_st<std::remove_cvref_t<X>>::value;
template <class X>
concept reg_vec = is_rv<std::remove_cvref_t<X>>::value;
template <class X>
concept shared_vec = is_sv<std::remove_cvref_t<X>>::value;
template <class X>
concept global_layout = is_gl<std::remove_cvref_t<X>>::value;

}  // namespace mp::tile
