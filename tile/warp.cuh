// Warp-scope operations on register tiles and vectors: fill, copy / convert, unary and binary maps, row
// and column reductions and broadcasts, and loads / stores between registers, shared and global memory.
// Destination first. Shapes are checked at compile time.
#pragma once
#include "tile/sync.cuh"
#include "tile/types.cuh"

namespace mp::tile {

// ---- element conversion ----
template <class T>
__device__ inline float to_float(T x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else if constexpr (std::is_same_v<T, bf16>)
    return __bfloat162float(x);
  else
    return __half2float(x);
}
template <class T>
__device__ inline T from_float(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else if constexpr (std::is_same_v<T, bf16>)
    return __float2bfloat16_rn(x);
  else
    return __float2half_rn(x);
}
template <class P>
struct pair_elem;
template <>
struct pair_elem<float2> {
  using type = float;
};
template <>
struct pair_elem<__nv_bfloat162> {
  using type = bf16;
};
template <>
struct pair_elem<__half2> {
  using type = f16;
};
template <class P>
__device__ inline float2 pair_to_float2(P p) {
  using E = typename pair_elem<P>::type;
  return {to_float<E>(p.x), to_float<E>(p.y)};
}
template <class P>
__device__ inline P pair_from_float2(float2 f) {
  using E = typename pair_elem<P>::type;
  P p;
  p.x = from_float<E>(f.x);
  p.y = from_float<E>(f.y);
  return p;
}

// Where fragment f, pair element e of block (0, 0) sits, for this lane. col_l is the transpose of row_l.
template <class L>
__device__ constexpr int frag_row(int lane, int f, int e) {
  if constexpr (std::is_same_v<L, row_l>)
    return lane / 4 + 8 * (f & 1);
  else
    return 2 * (lane % 4) + 8 * (f >> 1) + e;
}
template <class L>
__device__ constexpr int frag_col(int lane, int f, int e) {
  if constexpr (std::is_same_v<L, row_l>)
    return 2 * (lane % 4) + 8 * (f >> 1) + e;
  else
    return lane / 4 + 8 * (f & 1);
}

template <class A, class B>
concept same_shape =
    A::rows == B::rows&& A::cols == B::cols&& std::is_same_v<typename A::layout, typename B::layout>;

// 2^x on the special-function unit alone: ex2.approx.ftz (results below 2^-126 flush to 0, -inf gives
// 0, the same 2-ulp approximation otherwise). exp2f without fast math compiles to ex2.approx.f32, which
// ptxas wraps in a range test and two multiplies for subnormal results: three more issue slots per
// value in softmax loops that are bound by the exponentials (attention at head dim 64).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

namespace warp {

__device__ inline int laneid() { return threadIdx.x % warp_threads; }

// Apply op(float2) -> float2 to every pair of src, writing dst (types may differ: that is a conversion).
template <class D, class S, class Op>
__device__ inline void map(D& dst, const S& src, Op op) {
  static_assert(D::rows == S::rows, "warp::map: the destination and the source have different row counts");
  static_assert(D::cols == S::cols, "warp::map: the destination and the source have different column counts");
  static_assert(std::is_same_v<typename D::layout, typename S::layout>,
                "warp::map: the tiles have different layouts (row_l vs col_l)");
#pragma unroll
  for (int i = 0; i < D::height; ++i)
#pragma unroll
    for (int j = 0; j < D::width; ++j)
#pragma unroll
      for (int f = 0; f < 4; ++f)
        dst.tiles[i][j][f] = pair_from_float2<typename D::pair>(op(pair_to_float2(src.tiles[i][j][f])));
}
template <class D, class A, class B, class Op>
__device__ inline void zip(D& dst, const A& a, const B& b, Op op) {
  static_assert(same_shape<D, A> && same_shape<D, B>,
                "warp binary op: all tiles must have the same rows, columns and layout");
#pragma unroll
  for (int i = 0; i < D::height; ++i)
#pragma unroll
    for (int j = 0; j < D::width; ++j)
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        float2 x = pair_to_float2(a.tiles[i][j][f]), y = pair_to_float2(b.tiles[i][j][f]);
        dst.tiles[i][j][f] = pair_from_float2<typename D::pair>(float2{op(x.x, y.x), op(x.y, y.y)});
      }
}

template <reg_tile D>
__device__ inline void fill(D& dst, float v) {
  map(dst, dst, [v](float2) { return float2{v, v}; });
}
template <class D>
__device__ inline void zero(D& dst) {
  fill(dst, 0.f);
}
template <class D, class S>
__device__ inline void copy(D& dst, const S& src) {
  map(dst, src, [](float2 x) { return x; });
}

// unary maps
#define MP_TILE_UNARY(name, expr)                     \
  template <class D, class S>                         \
  __device__ inline void name(D& dst, const S& src) { \
    map(dst, src, [](float2 p) {                      \
      auto f = [](float x) { return expr; };          \
      return float2{f(p.x), f(p.y)};                  \
    });                                               \
  }
MP_TILE_UNARY(exp, __expf(x))
MP_TILE_UNARY(exp2, exp2f(x))
MP_TILE_UNARY(log, __logf(x))
MP_TILE_UNARY(abs, fabsf(x))
MP_TILE_UNARY(neg, -x)
MP_TILE_UNARY(relu, fmaxf(x, 0.f))
#undef MP_TILE_UNARY

// binary maps: tile-tile and tile-scalar
#define MP_TILE_BINARY(name, expr)                                                                 \
  template <class D, class A, class B>                                                             \
  requires(!std::is_arithmetic_v<B>) __device__ inline void name(D& dst, const A& a, const B& b) { \
    zip(dst, a, b, [](float x, float y) { return expr; });                                         \
  }                                                                                                \
  template <class D, class A>                                                                      \
  __device__ inline void name(D& dst, const A& a, float y) {                                       \
    map(dst, a, [y](float2 p) {                                                                    \
      auto f = [y](float x) { return expr; };                                                      \
      return float2{f(p.x), f(p.y)};                                                               \
    });                                                                                            \
  }
MP_TILE_BINARY(add, x + y)
MP_TILE_BINARY(sub, x - y)
MP_TILE_BINARY(mul, x* y)
MP_TILE_BINARY(div, x / y)
MP_TILE_BINARY(max, fmaxf(x, y))
MP_TILE_BINARY(min, fminf(x, y))
#undef MP_TILE_BINARY

// ---- reductions over rows (one value per row, rows_v) and columns (cols_v), row_l tiles ----
template <class V, class S, class Op>
__device__ inline void row_reduce(V& dst, const S& src, Op op, float init, bool accumulate) {
  static_assert(std::is_same_v<typename S::layout, row_l>, "row reductions take row_l tiles");
  static_assert(V::length == S::rows, "row reduction: the vector length must equal the tile's row count");
#pragma unroll
  for (int i = 0; i < S::height; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // h: row lane/4 (fragments 0, 2) or lane/4 + 8 (fragments 1, 3)
      float acc = init;
#pragma unroll
      for (int j = 0; j < S::width; ++j) {
        float2 a = pair_to_float2(src.tiles[i][j][h]), b = pair_to_float2(src.tiles[i][j][h + 2]);
        acc = op(acc, op(op(a.x, a.y), op(b.x, b.y)));
      }
      acc = op(acc, __shfl_xor_sync(0xffffffffu, acc, 1));  // the 4 lanes of a quad share the row
      acc = op(acc, __shfl_xor_sync(0xffffffffu, acc, 2));
      using E = std::remove_cvref_t<decltype(dst.v[0][0])>;
      dst.v[i][h] = from_float<E>(accumulate ? op(to_float(dst.v[i][h]), acc) : acc);
    }
}
// The reductions' operators and their identities.
struct max_op {
  static constexpr float identity = -INFINITY;
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct sum_op {
  static constexpr float identity = 0.f;
  __device__ float operator()(float a, float b) const { return a + b; }
};
template <class V, class S>
__device__ inline void row_max(V& dst, const S& src, bool accumulate = false) {
  row_reduce(dst, src, max_op{}, max_op::identity, accumulate);
}
template <class V, class S>
__device__ inline void row_sum(V& dst, const S& src, bool accumulate = false) {
  row_reduce(dst, src, sum_op{}, sum_op::identity, accumulate);
}
template <class V, class S, class Op>
__device__ inline void col_reduce(V& dst, const S& src, Op op, float init, bool accumulate) {
  static_assert(std::is_same_v<typename S::layout, row_l>, "column reductions take row_l tiles");
  static_assert(V::length == S::cols,
                "column reduction: the vector length must equal the tile's column count");
#pragma unroll
  for (int j = 0; j < S::width; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) {  // q: column 2*(lane%4) + (q&1) + 8*(q>>1)
      float acc = init;
#pragma unroll
      for (int i = 0; i < S::height; ++i) {
        float2 a = pair_to_float2(src.tiles[i][j][(q >> 1) * 2]),
               b = pair_to_float2(src.tiles[i][j][(q >> 1) * 2 + 1]);
        acc = op(acc, (q & 1) ? op(a.y, b.y) : op(a.x, b.x));
      }
      acc = op(acc, __shfl_xor_sync(0xffffffffu, acc, 4));  // lanes with the same lane%4 share the column
      acc = op(acc, __shfl_xor_sync(0xffffffffu, acc, 8));
      acc = op(acc, __shfl_xor_sync(0xffffffffu, acc, 16));
      using E = std::remove_cvref_t<decltype(dst.v[0][0])>;
      dst.v[j][q] = from_float<E>(accumulate ? op(to_float(dst.v[j][q]), acc) : acc);
    }
}
template <class V, class S>
__device__ inline void col_max(V& dst, const S& src, bool accumulate = false) {
  col_reduce(dst, src, max_op{}, max_op::identity, accumulate);
}
template <class V, class S>
__device__ inline void col_sum(V& dst, const S& src, bool accumulate = false) {
  col_reduce(dst, src, sum_op{}, sum_op::identity, accumulate);
}

// ---- broadcasts: dst[r][c] = op(src[r][c], v[r]) (row vectors) or op(src[r][c], v[c]) (column vectors) ----
template <class D, class S, class V, class Op>
__device__ inline void row_map(D& dst, const S& src, const V& v, Op op) {
  static_assert(same_shape<D, S> && std::is_same_v<typename S::layout, row_l>,
                "row broadcast: same-shape row_l tiles");
  static_assert(V::length == S::rows, "row broadcast: the vector length must equal the tile's row count");
#pragma unroll
  for (int i = 0; i < S::height; ++i)
#pragma unroll
    for (int j = 0; j < S::width; ++j)
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        const float y = to_float(v.v[i][f & 1]);
        float2 x = pair_to_float2(src.tiles[i][j][f]);
        dst.tiles[i][j][f] = pair_from_float2<typename D::pair>(float2{op(x.x, y), op(x.y, y)});
      }
}
template <class D, class S, class V, class Op>
__device__ inline void col_map(D& dst, const S& src, const V& v, Op op) {
  static_assert(same_shape<D, S> && std::is_same_v<typename S::layout, row_l>,
                "column broadcast: same-shape row_l tiles");
  static_assert(V::length == S::cols,
                "column broadcast: the vector length must equal the tile's column count");
#pragma unroll
  for (int i = 0; i < S::height; ++i)
#pragma unroll
    for (int j = 0; j < S::width; ++j)
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        const int q = (f >> 1) * 2;
        float2 x = pair_to_float2(src.tiles[i][j][f]);
        dst.tiles[i][j][f] = pair_from_float2<typename D::pair>(
            float2{op(x.x, to_float(v.v[j][q])), op(x.y, to_float(v.v[j][q + 1]))});
      }
}
#define MP_TILE_BCAST(name, expr)                                       \
  template <class D, class S, class V>                                  \
  __device__ inline void name##_row(D& dst, const S& src, const V& v) { \
    row_map(dst, src, v, [](float x, float y) { return expr; });        \
  }                                                                     \
  template <class D, class S, class V>                                  \
  __device__ inline void name##_col(D& dst, const S& src, const V& v) { \
    col_map(dst, src, v, [](float x, float y) { return expr; });        \
  }
MP_TILE_BCAST(add, x + y)
MP_TILE_BCAST(sub, x - y)
MP_TILE_BCAST(mul, x* y)
MP_TILE_BCAST(div, x / y)
#undef MP_TILE_BCAST

// ---- loads and stores ----
// Element (r, c) of the tile <- at(r, c) (its value: a global reference, or a shared load below).
template <class RT, class Acc>
__device__ inline void load_with(RT& dst, Acc at) {
  const int lane = laneid();
  using L = typename RT::layout;
  using E = typename RT::elem;
#pragma unroll
  for (int i = 0; i < RT::height; ++i)
#pragma unroll
    for (int j = 0; j < RT::width; ++j)
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        float2 x;
        x.x = to_float(at(16 * i + frag_row<L>(lane, f, 0), 16 * j + frag_col<L>(lane, f, 0)));
        x.y = to_float(at(16 * i + frag_row<L>(lane, f, 1), 16 * j + frag_col<L>(lane, f, 1)));
        dst.tiles[i][j][f] = pair_from_float2<packed_t<E>>(x);
      }
}
// Element (r, c) of the tile -> put(r, c, its value as a float).
template <class RT, class Put>
__device__ inline void store_with(const RT& src, Put put) {
  const int lane = laneid();
  using L = typename RT::layout;
#pragma unroll
  for (int i = 0; i < RT::height; ++i)
#pragma unroll
    for (int j = 0; j < RT::width; ++j)
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        float2 x = pair_to_float2(src.tiles[i][j][f]);
        put(16 * i + frag_row<L>(lane, f, 0), 16 * j + frag_col<L>(lane, f, 0), x.x);
        put(16 * i + frag_row<L>(lane, f, 1), 16 * j + frag_col<L>(lane, f, 1), x.y);
      }
}
// Shared memory by 32-bit shared-window address (smem_addr() + layout offset). These paths went through
// st::at / sv::data references before, which nvcc compiles to generic LD.E / ST.E (64-bit address, one
// element each) whenever it cannot prove the address space, e.g. for a tile placed in dynamic shared
// memory through an integer alignment; ld / st.shared are LDS / STS. The "memory" clobbers keep them in
// order with the thread's other accesses, as the references were.
namespace detail {
// The bits of a 16-bit element and back.
__device__ inline unsigned short bits(bf16 x) { return __bfloat16_as_ushort(x); }
__device__ inline unsigned short bits(f16 x) { return __half_as_ushort(x); }
template <class T>
__device__ inline T from_bits(unsigned short u) {
  if constexpr (std::is_same_v<T, bf16>)
    return __ushort_as_bfloat16(u);
  else
    return __ushort_as_half(u);
}
template <class T>
__device__ inline T ld_shared(uint32_t a) {
  if constexpr (std::is_same_v<T, float>) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
    return v;
  } else {
    unsigned short v;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(a) : "memory");
    return from_bits<T>(v);
  }
}
template <class T>
__device__ inline void st_shared(uint32_t a, T v) {
  if constexpr (std::is_same_v<T, float>)
    asm volatile("st.shared.f32 [%0], %1;" ::"r"(a), "f"(v) : "memory");
  else
    asm volatile("st.shared.b16 [%0], %1;" ::"r"(a), "h"(bits(v)) : "memory");
}
// Two adjacent 16-bit elements in one 32-bit access (4-byte aligned): the lower address holds the first.
template <class T>
__device__ inline float2 ld_shared_pair(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(a) : "memory");
  return {to_float(from_bits<T>(v & 0xffffu)), to_float(from_bits<T>(v >> 16))};
}
template <class T>
__device__ inline void st_shared_pair(uint32_t a, float2 x) {
  st_shared_b32(a, uint32_t(bits(from_float<T>(x.x))) | uint32_t(bits(from_float<T>(x.y))) << 16);
}
// Whether the pair elements of a fragment of RT are adjacent in ST at every even column offset: row_l
// pairs are columns 2k, 2k+1 of one row; with 16-bit elements and rows a multiple of 4 bytes long they
// share a 4-byte word, which a swizzle (it moves whole 16-byte units) and a chunk (chunk_cols is then
// even) never split.
template <class RT, class ST>
constexpr bool adjacent_pairs = std::is_same_v<typename RT::layout, row_l> &&
                                sizeof(typename ST::elem) == 2 && ST::layout::row_bytes % 4 == 0;
// fn(pair, r, c) for every fragment pair of register tile `t` placed at (r0, c0) in a larger tile: (r, c)
// is the position of the pair's first element.
template <class RT, class Fn>
__device__ inline void for_each_pair(RT& t, int r0, int c0, Fn fn) {
  using L = typename std::remove_const_t<RT>::layout;
  const int lane = laneid();
#pragma unroll
  for (int i = 0; i < RT::height; ++i)
#pragma unroll
    for (int j = 0; j < RT::width; ++j)
#pragma unroll
      for (int f = 0; f < 4; ++f)
        fn(t.tiles[i][j][f], r0 + 16 * i + frag_row<L>(lane, f, 0), c0 + 16 * j + frag_col<L>(lane, f, 0));
}
}  // namespace detail

// shared <-> registers; the shared tile may hold more rows / columns (the register tile is at (r0, c0)).
template <reg_tile RT, shared_tile ST>
__device__ inline void load(RT& dst, const ST& src, int r0 = 0, int c0 = 0) {
  static_assert(RT::rows <= ST::rows && RT::cols <= ST::cols,
                "warp::load: the register tile is larger than the shared tile");
  using SL = typename ST::layout;
  using T = typename ST::elem;
  const uint32_t base = src.smem_addr();
  if constexpr (detail::adjacent_pairs<RT, ST>) {
    if (c0 % 2 == 0) {  // an odd c0 would split the 32-bit words: element by element below
      detail::for_each_pair(dst, r0, c0, [&](auto& pair, int r, int c) {
        pair =
            pair_from_float2<packed_t<typename RT::elem>>(detail::ld_shared_pair<T>(base + SL::offset(r, c)));
      });
      return;
    }
  }
  load_with(dst, [&](int r, int c) { return detail::ld_shared<T>(base + SL::offset(r0 + r, c0 + c)); });
}
template <shared_tile ST, reg_tile RT>
__device__ inline void store(ST& dst, const RT& src, int r0 = 0, int c0 = 0) {
  static_assert(RT::rows <= ST::rows && RT::cols <= ST::cols,
                "warp::store: the register tile is larger than the shared tile");
  using SL = typename ST::layout;
  using T = typename ST::elem;
  const uint32_t base = dst.smem_addr();
  if constexpr (detail::adjacent_pairs<RT, ST>) {
    if (c0 % 2 == 0) {
      detail::for_each_pair(src, r0, c0, [&](const auto& pair, int r, int c) {
        detail::st_shared_pair<T>(base + SL::offset(r, c), pair_to_float2(pair));
      });
      return;
    }
  }
  store_with(src, [&](int r, int c, float v) {
    detail::st_shared<T>(base + SL::offset(r0 + r, c0 + c), from_float<T>(v));
  });
}
// global <-> registers: the tile whose top-left element is (row, col) of matrix (b, d) of g. No bounds
// checks: the caller keeps the tile inside g.
template <reg_tile RT, global_layout GL>
__device__ inline void load(RT& dst, const GL& g, int row, int col, int d = 0, int b = 0) {
  load_with(dst, [&](int r, int c) -> const typename GL::elem& { return *g.ptr(b, d, row + r, col + c); });
}
template <global_layout GL, reg_tile RT>
__device__ inline void store(const GL& g, const RT& src, int row, int col, int d = 0, int b = 0) {
  store_with(
      src, [&](int r, int c, float v) { *g.ptr(b, d, row + r, col + c) = from_float<typename GL::elem>(v); });
}
// vectors: rows_v <-> shared vectors
template <reg_vec V, shared_vec SV>
__device__ inline void load(V& dst, const SV& src, int off = 0) {
  using T = std::remove_cvref_t<decltype(src.data[0])>;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(src.data));
  const int lane = laneid();
#pragma unroll
  for (int b = 0; b < V::blocks; ++b)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      dst.v[b][h] = from_float<std::remove_cvref_t<decltype(dst.v[0][0])>>(
          to_float(detail::ld_shared<T>(base + uint32_t(sizeof(T) * (off + 16 * b + lane / 4 + 8 * h)))));
}
template <shared_vec SV, reg_vec V>
__device__ inline void store(SV& dst, const V& src, int off = 0) {
  const int lane = laneid();
  if (lane % 4 != 0) return;
  using T = std::remove_cvref_t<decltype(dst.data[0])>;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(dst.data));
#pragma unroll
  for (int b = 0; b < V::blocks; ++b)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      detail::st_shared<T>(base + uint32_t(sizeof(T) * (off + 16 * b + lane / 4 + 8 * h)),
                           from_float<T>(to_float(src.v[b][h])));
}
template <reg_vec V>
__device__ inline void fill(V& dst, float x) {
#pragma unroll
  for (int b = 0; b < V::blocks; ++b)
#pragma unroll
    for (int h = 0; h < int(sizeof(dst.v[0]) / sizeof(dst.v[0][0])); ++h)
      dst.v[b][h] = from_float<std::remove_cvref_t<decltype(dst.v[0][0])>>(x);
}

}  // namespace warp
}  // namespace mp::tile
