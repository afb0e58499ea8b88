// GPU tests of the tile layer on Hopper: TMA loads into swizzled shared tiles, warp-scope register ops,
// reductions and broadcasts, and warpgroup wgmma (A*B and A*B^T) against CPU references.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/device.h"
#include "core/random.h"
#include "kernels/gemm.h"
#include "tile/tile.cuh"
#include "tile/tma_host.h"

using namespace mp::tile;
using mp::kernels::bf16_bits_to_float;
using mp::kernels::float_to_bf16_bits;

namespace {

bool have_hopper() {
  auto g = mp::query_gpu();
  return g && mp::gpu_is_hopper(*g);
}
#define SKIP_WITHOUT_HOPPER() \
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU: " << mp::gpu_absent_reason()

template <class T>
struct dev {
  T* p = nullptr;
  size_t n = 0;
  explicit dev(size_t n_) : n(n_) { EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess); }
  ~dev() { cudaFree(p); }
  void put(const std::vector<T>& v) {
    EXPECT_EQ(cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> get() const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

std::vector<uint16_t> to_bf16(const std::vector<float>& f, std::vector<float>* rounded) {
  std::vector<uint16_t> b(f.size());
  rounded->resize(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    b[i] = float_to_bf16_bits(f[i]);
    (*rounded)[i] = bf16_bits_to_float(b[i]);
  }
  return b;
}

// One warp: TMA-load a 64x64 bf16 tile, read its first 16x64 rows into registers, and compute
// out0 = exp(x) + x, row maxima and sums, column sums, x - rowmax (broadcast).
__global__ void warp_ops_kernel(const __grid_constant__ CUtensorMap map, float* out, float* rmax, float* rsum,
                                float* csum, float* centered) {
  __shared__ st_bf<64, 64> t;
  __shared__ semaphore bar;
  if (threadIdx.x == 0) {
    init_semaphore(bar, 1);
    fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    expect_bytes(bar, tma::bytes<st_bf<64, 64>>());
    tma::load_async(t, &map, bar, 0, 0);
  }
  wait(bar, 0);
  rt_fl<16, 64> x, y;
  warp::load(x, t, 16, 0);  // rows 16..31
  warp::exp(y, x);
  warp::add(y, y, x);
  gl<float, 1, 1, 16, 64> g_out(out, 1, 1, 16, 64);
  warp::store(g_out, y, 0, 0);
  rv_fl<16> mx, sm;
  rv_fl<64, cols_v> cs;
  warp::row_max(mx, x);
  warp::row_sum(sm, x);
  warp::col_sum(cs, x);
  __shared__ sv_fl<16> s_mx, s_sm;
  warp::store(s_mx, mx);
  warp::store(s_sm, sm);
  __syncwarp();
  if (threadIdx.x < 16) {
    rmax[threadIdx.x] = s_mx.data[threadIdx.x];
    rsum[threadIdx.x] = s_sm.data[threadIdx.x];
  }
  const int lane = threadIdx.x;
  if (lane < 4)
    for (int j = 0; j < 4; ++j)
      for (int q = 0; q < 4; ++q) csum[16 * j + 2 * lane + (q & 1) + 8 * (q >> 1)] = cs.v[j][q];
  rt_bf<16, 64> c;
  warp::sub_row(y, x, mx);
  warp::copy(c, y);  // convert to bf16
  gl<bf16, 1, 1, 16, 64> g_c(reinterpret_cast<bf16*>(centered), 1, 1, 16, 64);
  warp::store(g_c, c, 0, 0);
}

TEST(SM90_Tile, TmaLoadAndWarpOps) {
  SKIP_WITHOUT_HOPPER();
  auto seed = mp::fresh_seed();
  std::vector<float> xr;
  auto xb = to_bf16(mp::random_floats(64 * 64, seed), &xr);
  dev<uint16_t> dx(64 * 64);
  dx.put(xb);
  dev<float> out(16 * 64), rmax(16), rsum(16), csum(64);
  dev<uint16_t> cen(16 * 64);
  cudaMemset(out.p, 0xff, out.n * 4);
  auto map = make_tma_map<st_bf<64, 64>>(gl<bf16, 1, 1, -1, -1>(reinterpret_cast<bf16*>(dx.p), 1, 1, 64, 64));
  warp_ops_kernel<<<1, 32>>>(map, out.p, rmax.p, rsum.p, csum.p, reinterpret_cast<float*>(cen.p));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto o = out.get(), mx = rmax.get(), sm = rsum.get(), cs = csum.get();
  auto ce = cen.get();
  for (int r = 0; r < 16; ++r) {
    double m = -1e30, s = 0;
    for (int c = 0; c < 64; ++c) {
      const double x = xr[(16 + r) * 64 + c];
      EXPECT_NEAR(o[r * 64 + c], std::exp(x) + x, 1e-4 * (1 + std::fabs(std::exp(x) + x)))
          << r << "," << c << " seed " << seed;
      m = std::max(m, x);
      s += x;
    }
    EXPECT_FLOAT_EQ(mx[r], float(m));
    EXPECT_NEAR(sm[r], s, 1e-4);
    for (int c = 0; c < 64; ++c)
      EXPECT_NEAR(bf16_bits_to_float(ce[r * 64 + c]), xr[(16 + r) * 64 + c] - m, 1e-2);
  }
  for (int c = 0; c < 64; ++c) {
    double s = 0;
    for (int r = 0; r < 16; ++r) s += xr[(16 + r) * 64 + c];
    EXPECT_NEAR(cs[c], s, 1e-4) << c;
  }
}

// Shared <-> register tiles through the explicit ld.shared / st.shared paths of warp::load / store: a
// row-layout bf16 tile (32-bit pairs), a column-layout one and an fp32 one at an odd column (element by
// element), from a TMA-loaded (128-byte swizzled) tile and back into a zeroed one. Every value must come
// back bit for bit at its place, and nothing else may be written.
__global__ void shared_roundtrip_kernel(const __grid_constant__ CUtensorMap map, bf16* row_out, bf16* col_out,
                                        float* odd_out, bf16* back) {
  __shared__ st_bf<64, 64> t, u;
  __shared__ semaphore bar;
  const int lane = threadIdx.x;
  if (lane == 0) {
    init_semaphore(bar, 1);
    fence_barrier_init();
  }
  for (int i = lane; i < 64 * 64; i += 32) u.data[i] = __float2bfloat16(0.0f);
  __syncwarp();
  if (lane == 0) {
    expect_bytes(bar, tma::bytes<st_bf<64, 64>>());
    tma::load_async(t, &map, bar, 0, 0);
  }
  wait(bar, 0);
  rt_bf<16, 64> a;
  rt_bf<16, 64, col_l> b;
  rt_fl<16, 32> c;
  warp::load(a, t, 16, 0);  // rows 16..31
  warp::load(b, t, 32, 0);  // rows 32..47
  warp::load(c, t, 48, 1);  // rows 48..63, columns 1..32
  warp::store(gl<bf16, 1, 1, 16, 64>(row_out, 1, 1, 16, 64), a, 0, 0);
  warp::store(gl<bf16, 1, 1, 16, 64>(col_out, 1, 1, 16, 64), b, 0, 0);
  warp::store(gl<float, 1, 1, 16, 32>(odd_out, 1, 1, 16, 32), c, 0, 0);
  warp::store(u, a, 16, 0);
  warp::store(u, b, 32, 0);
  warp::store(u, c, 48, 1);
  __syncwarp();
  for (int i = lane; i < 64 * 64; i += 32) back[i] = u.at(i / 64, i % 64);
}

TEST(SM90_Tile, SharedLoadStoreRoundTrip) {
  SKIP_WITHOUT_HOPPER();
  auto seed = mp::fresh_seed();
  std::vector<float> xr;
  auto xb = to_bf16(mp::random_floats(64 * 64, seed), &xr);
  dev<uint16_t> dx(64 * 64), row(16 * 64), col(16 * 64), back(64 * 64);
  dev<float> odd(16 * 32);
  dx.put(xb);
  auto map = make_tma_map<st_bf<64, 64>>(gl<bf16, 1, 1, -1, -1>(reinterpret_cast<bf16*>(dx.p), 1, 1, 64, 64));
  shared_roundtrip_kernel<<<1, 32>>>(map, reinterpret_cast<bf16*>(row.p), reinterpret_cast<bf16*>(col.p),
                                     odd.p, reinterpret_cast<bf16*>(back.p));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto r = row.get(), c = col.get(), bk = back.get();
  const auto o = odd.get();
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 64; ++j) {
      EXPECT_EQ(r[i * 64 + j], xb[(16 + i) * 64 + j]) << "row layout " << i << "," << j << " seed " << seed;
      EXPECT_EQ(c[i * 64 + j], xb[(32 + i) * 64 + j]) << "col layout " << i << "," << j << " seed " << seed;
      if (j < 32) EXPECT_EQ(o[i * 32 + j], xr[(48 + i) * 64 + 1 + j]) << "odd column " << i << "," << j;
    }
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 64; ++j) {
      const bool stored = (i >= 16 && i < 48) || (i >= 48 && j >= 1 && j <= 32);
      EXPECT_EQ(bk[i * 64 + j], stored ? xb[i * 64 + j] : uint16_t(0))
          << "back in shared " << i << "," << j << " seed " << seed;
    }
}

// One warpgroup: TMA-load A (64x64) and B (64xN as K x N, or N x 64 as N x K), wgmma, store fp32. Sliced:
// the four 16-wide K slices one wgmma at a time, alternately into two accumulators, added at the end.
template <int N, bool BT, bool Sliced = false>
__global__ void wgmma_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                             float* c) {
  using b_tile = std::conditional_t<BT, st_bf<N, 64>, st_bf<64, N>>;
  extern __shared__ uint8_t raw[];
  auto* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  auto& a = *reinterpret_cast<st_bf<64, 64>*>(base);
  auto& b = *reinterpret_cast<b_tile*>(base + sizeof(st_bf<64, 64>));
  __shared__ semaphore bar;
  if (threadIdx.x == 0) {
    init_semaphore(bar, 1);
    fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    expect_bytes(bar, tma::bytes<st_bf<64, 64>>() + tma::bytes<b_tile>());
    tma::load_async(a, &ma, bar, 0, 0);
    tma::load_async(b, &mb, bar, 0, 0);
  }
  wait(bar, 0);
  rt_fl<16, N> acc;
  warp::fill(acc, 7.f);  // overwritten by mm_*
  rt_fl<16, N> odd;
  warp::fill(odd, 7.f);
  warpgroup::mma_fence();
  if constexpr (Sliced) {
    for (int ks = 0; ks < 4; ++ks) {  // slices 0 and 1 overwrite, 2 and 3 accumulate
      if constexpr (BT)
        warpgroup::mma_ABt_slice(ks % 2 ? odd : acc, a, b, ks, ks >= 2);
      else
        warpgroup::mma_AB_slice(ks % 2 ? odd : acc, a, b, ks, ks >= 2);
    }
  } else if constexpr (BT) {
    warpgroup::mm_ABt(acc, a, b);
  } else {
    warpgroup::mm_AB(acc, a, b);
  }
  warpgroup::mma_commit_group();
  warpgroup::mma_async_wait<0>();
  warpgroup::fence_accumulator(acc);
  warpgroup::fence_accumulator(odd);
  if constexpr (Sliced) warpgroup::add(acc, acc, odd);
  gl<float, 1, 1, 64, N> gc(c, 1, 1, 64, N);
  // Round trip through a shared tile at warpgroup scope, then out to global memory.
  auto& cs = *reinterpret_cast<st_fl<64, N>*>(base + sizeof(st_bf<64, 64>) + sizeof(b_tile));
  rt_fl<16, N> back;
  warpgroup::store(cs, acc);
  __syncthreads();
  warpgroup::load(back, cs);
  warpgroup::store(gc, back, 0, 0);
}

template <int N, bool BT, bool Sliced = false>
void check_wgmma() {
  auto seed = mp::fresh_seed();
  std::vector<float> ar, br;
  auto ab = to_bf16(mp::random_floats(64 * 64, seed), &ar);
  auto bb = to_bf16(mp::random_floats(64 * N, seed + 1), &br);
  dev<uint16_t> da(64 * 64), db(64 * N);
  da.put(ab);
  db.put(bb);
  dev<float> dc(64 * N);
  cudaMemset(dc.p, 0xff, dc.n * 4);
  using b_tile = std::conditional_t<BT, st_bf<N, 64>, st_bf<64, N>>;
  auto ma = make_tma_map<st_bf<64, 64>>(gl<bf16, 1, 1, -1, -1>(reinterpret_cast<bf16*>(da.p), 1, 1, 64, 64));
  auto mb = BT ? make_tma_map<b_tile>(gl<bf16, 1, 1, -1, -1>(reinterpret_cast<bf16*>(db.p), 1, 1, N, 64))
               : make_tma_map<b_tile>(gl<bf16, 1, 1, -1, -1>(reinterpret_cast<bf16*>(db.p), 1, 1, 64, N));
  const int smem = 2048 + sizeof(st_bf<64, 64>) + sizeof(b_tile) + sizeof(st_fl<64, N>);
  cudaFuncSetAttribute(wgmma_kernel<N, BT, Sliced>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  wgmma_kernel<N, BT, Sliced><<<1, 128, smem>>>(ma, mb, dc.p);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto c = dc.get();
  auto ref = mp::kernels::gemm_reference_cpu(ar, br, 64, N, 64,
                                             BT ? mp::kernels::b_layout::nk : mp::kernels::b_layout::kn);
  for (int i = 0; i < 64 * N; ++i)
    ASSERT_NEAR(c[i], ref[i], 1e-3 * (1 + std::fabs(ref[i]))) << "element " << i << " seed " << seed;
}

TEST(SM90_Tile, WgmmaAB) {
  SKIP_WITHOUT_HOPPER();
  check_wgmma<64, false>();
  check_wgmma<256, false>();
  check_wgmma<128, false, true>();
}
TEST(SM90_Tile, WgmmaABt) {
  SKIP_WITHOUT_HOPPER();
  check_wgmma<64, true>();
  check_wgmma<256, true>();
  check_wgmma<128, true, true>();
}

}  // namespace
