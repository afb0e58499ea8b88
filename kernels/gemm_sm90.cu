// The tile-layer GEMM for Hopper, cooperative and persistent: one block per SM walks tiles in M-groups
// (L2 reuse). 128 x BN x 64 tiles (BN 256 or 128) with two consumer warpgroups (64 rows each, wgmma
// m64nBNk16 from 128B-swizzled shared tiles), or for shapes with few 128-row tiles 64 x 128 tiles with one;
// one TMA producer thread fills the ring. The kernel is load / compute / finish on the pipeline template
// (tile/pipeline.cuh); its policies are headers of their own: split-K and stream-K work items and their
// fixup (gemm_split.cuh), the epilogue (gemm_epilogue.cuh), L2 priorities (gemm_l2.cuh). Which kernel a
// shape gets is host code (plan_gemm in gemm_common.cpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "kernels/gemm.h"
#include "kernels/gemm_epilogue.cuh"
#include "kernels/gemm_globals.cuh"
#include "kernels/gemm_l2.cuh"
#include "kernels/gemm_split.cuh"
#include "tile/tile.cuh"
#include "tile/tma_host.h"

namespace mp::kernels {
namespace {
using namespace mp::tile;

// NC: consumer warpgroups, 64 rows each (BM = 64 * NC). WT: the whole-tile epilogue
// (epilogue_mode::whole): each consumer has a buffer for every chunk of its part of the tile, so it writes
// them all between one pair of barriers and issues their stores together; the ring loses a stage to them.
template <int BN, bool BT, class OutT, int NC = 2, bool WT = false>
struct gemm_kernel {
  static_assert(!WT || (BN == 256 && std::is_same_v<OutT, bf16> && NC == 2),
                "gemm: the whole-tile epilogue is compiled for bf16 128 x 256 tiles");
  static constexpr int BM = 64 * NC, BK = 64, consumers = NC;
  static constexpr int producer_registers = 40, consumer_registers = 232;
  using a_tile = st_bf<BM, BK>;
  using b_tile = std::conditional_t<BT, st_bf<BN, BK>, st_bf<BK, BN>>;  // N x K, or K x N
  struct stage {
    a_tile a;
    b_tile b;
  };
  // Output chunks of 64 x CW (one 128-byte swizzle span of OutT), double-buffered per consumer so that one
  // chunk's store overlaps the next chunk's writes (WT: a buffer per chunk).
  static constexpr int CW = 128 / int(sizeof(OutT)), chunks = BN / CW;
  static constexpr int c_buffers = WT ? chunks : 2;
  using c_tile = st<OutT, 64, CW>;
  struct finish_smem {
    c_tile c[consumers][c_buffers];
    int arrivals[consumers];  // fixup(): the tile counter's value before this consumer's arrival
  };
  using globals = gemm_globals;
  // The ring: as deep as the shared memory allows beside the epilogue buffers (at most 16 stages).
  static constexpr int stage_bytes = (BM + BN) * BK * 2;
  static constexpr int finish_bytes = (int(sizeof(finish_smem)) + 1023) / 1024 * 1024;
  static constexpr int stages_fit = (pc::max_shared_bytes - 1024 - finish_bytes - 16 * 16) / stage_bytes;
  static constexpr int stages = stages_fit < 16 ? stages_fit : 16;
  // The K loop unrolled by the ring depth (tile/pipeline.cuh), except in the 128 x 256 bf16 kernel without
  // the whole-tile epilogue (2048^3, one tile per block), which was measured with the rolled loop.
  static constexpr bool unroll_ring = !(BN == 256 && std::is_same_v<OutT, bf16> && !WT);
  struct state {
    rt_fl<16, BN> acc;
    bool data_only = false;  // g's, read once (begin): a parameter load per step is on the critical path
  };
  __device__ static void begin(state& st, const globals& g) { st.data_only = g.data_only != 0; }
  // The pipeline's first act (pc::prefetch_of): the three tensor maps into the descriptor cache.
  __device__ static void prefetch(const globals& g) {
    tma::prefetch_map(&g.a);
    tma::prefetch_map(&g.b);
    tma::prefetch_map(&g.c);
  }

  // A work item (gemm_split.cuh) decoded once per item, so that the producer's per-step work stays two TMA
  // issues: its K range and the tile's position.
  struct item : gemm_segment {
    int2 pos;  // (M-tile, N-tile) of tile_of()
    int row;   // first row of the tile's A / C rows
  };
  __host__ __device__ static int work_count(const globals& g) { return gemm_work_count(g); }
  __device__ static item item_of(const globals& g, int work) {
    item w;
    static_cast<gemm_segment&>(w) = segment_of(g, work);
    w.pos = tile_of(g, w.tile);
    w.row = w.pos.x * BM;
    return w;
  }
  __device__ static int iters(const item& w) { return w.iters; }
  // Groups of group_m M-tiles are walked column by column, so the blocks running at one time share A rows
  // and B columns in L2.
  __device__ static int2 tile_of(const globals& g, int t) {
    const int per_group = g.group_m * g.tiles_n;
    const int first_m = (t / per_group) * g.group_m;
    const int rows = min(g.group_m, g.tiles_m - first_m);
    const int in = t % per_group;
    return {first_m + in % rows, in / rows};
  }

  __device__ static void load(stage& s, const globals& g, const item& w, int it, semaphore& full) {
    if (g.compute_only) {  // diagnostic: no data, only the signal that the stage is full
      arrive(full);
      return;
    }
    const int kk = (w.k_first + it) * BK;
    expect_bytes(full, tma::bytes<a_tile>() + tma::bytes<b_tile>());
    load_ab<BT>(s.a, s.b, g, full, w.row, w.pos.y * BN, kk);
  }

  // The data_only test also keeps ptxas from serializing the wgmma (warning C7514; docs/development.md).
  __device__ static void compute(state& st, stage& s, const globals&, const item&, int it, int consumer) {
    if (st.data_only) return;
    warpgroup::fence_accumulator(st.acc);
    warpgroup::mma_fence();
    auto& a = s.a.template subtile_rows<64>(consumer);  // this consumer's 64 rows of the A tile
    if constexpr (BT)
      warpgroup::mma_ABt(st.acc, a, s.b, it > 0);
    else
      warpgroup::mma_AB(st.acc, a, s.b, it > 0);
    warpgroup::mma_commit_group();
    warpgroup::fence_accumulator(st.acc);
  }

  __device__ static void finish(state& st, finish_smem& fs, const globals& g, const item& w, int consumer) {
    warpgroup::fence_accumulator(st.acc);
    if (w.iters == 0) return;
    if (w.count > 1) {  // a split or stream-K tile: the partial sums meet in the workspace
      const bool mine = fixup<consumers>(st.acc, fs.arrivals, g, w, consumer);
      pc::trace_mark(g, pc::trace_fixup_done);
      if (!mine) return;
    }
    auto put_acc = [&](int j) {  // the accumulator pairs of chunk j, in the output type
      return [&st, j](int jb, int f) {
        const float2 v = st.acc.tiles[0][j * (CW / 16) + jb][f];
        if constexpr (std::is_same_v<OutT, float>) {
          return v;
        } else {
          const __nv_bfloat162 b = __float22bfloat162_rn(v);
          return *reinterpret_cast<const uint32_t*>(&b);
        }
      };
    };
    const int row = w.row + consumer * 64, col = w.pos.y * BN;
    if constexpr (WT) {  // every chunk in its own buffer: written and stored at once
      store_chunks<chunks, c_buffers, OutT>(fs.c[consumer], g, 1 + consumer, row, col, put_acc);
    } else {  // the chunks take turns in the two buffers
#pragma unroll
      for (int j = 0; j < chunks; ++j)
        store_chunks<1, c_buffers, OutT>(&fs.c[consumer][j % c_buffers], g, 1 + consumer, row, col + j * CW,
                                         [&](int) { return put_acc(j); });
    }
  }
};

static_assert(int(l2_priority::normal) == int(tma::l2_priority::normal) &&
                  int(l2_priority::evict_first) == int(tma::l2_priority::evict_first) &&
                  int(l2_priority::evict_last) == int(tma::l2_priority::evict_last),
              "gemm.h's L2 priorities must match tile/tma.cuh's (GemmPlan's go to the kernel as numbers)");
static_assert(pc::trace_points == gemm_trace_points && pc::trace_steps == gemm_trace_times + 1 &&
                  pc::trace_step_count == gemm_trace_step_count,
              "gemm.h's trace layout must match tile/pipeline.cuh's");

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail_user("gemm: ", what, " failed: ", cudaGetErrorString(e));
}

GemmPlan make_plan(int m, int n, int k, const GemmSchedule& s, out_type out) {
  return plan_gemm(m, n, k, s, pc::device_sm_count(), out, pc::device_l2_bytes());
}

// Tensor maps are encoded once per (tile type, pointer, shape) and reused: encoding costs microseconds
// of host time, which small GEMMs would otherwise pay on every call.
template <class ST>
const CUtensorMap& cached_map(const void* p, int depth, int rows, int cols) {
  struct entry {
    const void* p;
    int d, r, c;
    CUtensorMap map;
  };
  thread_local entry cache[16];
  thread_local int next = 0;
  for (auto& e : cache)
    if (e.p == p && e.d == depth && e.r == rows && e.c == cols) return e.map;
  using T = typename ST::elem;
  entry& e = cache[next];
  next = (next + 1) % 16;
  e = {p, depth, rows, cols,
       make_tma_map<ST>(gl<T, 1, -1, -1, -1>(static_cast<T*>(const_cast<void*>(p)), 1, depth, rows, cols))};
  return e.map;
}

// The workspace for tiles that several blocks finish (split-K, stream-K): per stream in use, grow-only, the
// tile counters and the fp32 partials in two allocations. The counters are zeroed whenever their
// allocation grows, and every launch leaves the counters it used at zero, so all of them are zero at every
// launch. (In one allocation, counters first, a launch with more counters than the last one would read
// the previous launch's partials as counters, find them non-zero, and leave tiles unwritten.)
struct fixup_space {
  int* counters;
  float4* partials;
};
fixup_space workspace(cudaStream_t stream, size_t counters, size_t partial_float4) {
  struct buffer {
    void* p = nullptr;
    size_t bytes = 0;
    void grow(size_t want, cudaStream_t s, bool zero) {
      if (bytes >= want) return;
      if (p) check_cuda(cudaFreeAsync(p, s), "freeing the GEMM workspace");
      check_cuda(cudaMallocAsync(&p, want, s), "allocating the GEMM workspace");
      if (zero) check_cuda(cudaMemsetAsync(p, 0, want, s), "clearing the GEMM tile counters");
      bytes = want;
    }
  };
  struct entry {
    cudaStream_t s;
    buffer counters, partials;
  };
  thread_local std::vector<entry> ws;
  entry* e = nullptr;
  for (auto& x : ws)
    if (x.s == stream) e = &x;
  if (!e) {
    ws.push_back({stream, {}, {}});
    e = &ws.back();
  }
  e->counters.grow(counters * sizeof(int), stream, true);
  e->partials.grow(partial_float4 * sizeof(float4), stream, false);
  return {static_cast<int*>(e->counters.p), static_cast<float4*>(e->partials.p)};
}

// Which kernels run the K loop unrolled by the ring depth: the large shapes' whole-tile kernels, the small
// tiles and the f32 kernels do; the immediate-epilogue 128 x 256 bf16 kernels keep the rolled loop.
static_assert(pc::traits<gemm_kernel<256, true, bf16, 2, true>>::unroll == bool(MP_PIPELINE_STAGE_UNROLL));
static_assert(pc::traits<gemm_kernel<128, false, bf16, 1>>::unroll == bool(MP_PIPELINE_STAGE_UNROLL));
static_assert(!pc::traits<gemm_kernel<256, true, bf16>>::unroll);
static_assert(pc::traits<gemm_kernel<256, true, float>>::unroll == bool(MP_PIPELINE_STAGE_UNROLL));

template <int BN, bool BT, class OutT, int NC = 2, bool WT = false>
void run(const void* a, const void* b, void* c, int m, int n, int k, cudaStream_t stream,
         const GemmSchedule& s, const GemmPlan& p) {
  using K = gemm_kernel<BN, BT, OutT, NC, WT>;
  typename K::globals g{};
  g.a = cached_map<typename K::a_tile>(a, 1, m, k);
  g.b = BT ? cached_map<typename K::b_tile>(b, 1, n, k) : cached_map<typename K::b_tile>(b, 1, k, n);
  g.c = cached_map<typename K::c_tile>(c, 1, m, n);
  g.m = m, g.n = n, g.k = k;
  g.tiles_m = (m + K::BM - 1) / K::BM;
  g.tiles_n = (n + BN - 1) / BN;
  g.k_iters = (k + K::BK - 1) / K::BK;
  g.group_m = std::max(1, s.group_m);
  g.data_only = s.data_only;
  g.compute_only = s.compute_only;
  g.trace = s.trace, g.trace_blocks = s.trace_blocks;
  g.l2_hint = int(p.l2_a) + 4 * int(p.l2_b) + 16 * int(p.l2_c);
  const KSplit ks = k_split(g.k_iters, p.splits, p.split_lead);
  g.iters_per_split = ks.per_split, g.splits = ks.splits;
  const int tiles = g.tiles_m * g.tiles_n;
  size_t fix_tiles = 0;
  if (g.splits > 1) {
    fix_tiles = tiles, g.slots = g.splits;
    g.fixed_reducer = s.persistent && s.fixed_reducer;
  } else if (p.sk_tiles > 0) {
    g.grid = pc::resident_blocks<K>();
    // the plan assumed one block per SM; this is the grid
    g.sk_tiles = stream_k_tiles(tiles, g.grid, g.k_iters, s.stream_k);
    fix_tiles = g.sk_tiles;
    g.slots = g.sk_tiles > 0 ? stream_k_max_parts(g.grid, g.sk_tiles, g.k_iters) : 1;
    g.fixed_reducer = s.fixed_reducer;
  }
  g.dp_tiles = tiles - g.sk_tiles;
  if (fix_tiles > 0) {  // one counter and slot set per tile and consumer warpgroup
    const auto w = workspace(stream, fix_tiles * K::consumers,
                             fix_tiles * K::consumers * g.slots * (BN / 8) * warpgroup_threads);
    g.counters = w.counters, g.ws = w.partials;
  }
  const int max_blocks = s.persistent ? 0 : K::work_count(g);
  check_cuda(pc::launch<K>(g, stream, max_blocks), "the GEMM kernel launch");
}

}  // namespace

void gemm_bf16(const void* a, const void* b, void* c, int m, int n, int k, b_layout bl, out_type out,
               CUstream_st* stream, const GemmSchedule& s) {
  check_gemm_shape(m, n, k);
  if (s.trace && !MP_PIPELINE_TRACE)
    throw not_supported("gemm: the timeline trace in this build (configure with -DMP_PIPELINE_TRACE=ON)");
  for (auto [p, name] : {std::pair{a, "A"}, std::pair{b, "B"}, std::pair<const void*, const char*>{c, "C"}})
    MP_USER_CHECK(p && reinterpret_cast<uintptr_t>(p) % 16 == 0, "gemm: ", name,
                  " must be a 16-byte aligned device pointer");
  const GemmPlan p = make_plan(m, n, k, s, out);
  const bool bt = bl == b_layout::nk;
  const bool f32 = out == out_type::f32;
  if (p.whole_tile) {  // plan_gemm gives it only to bf16 output on 128 x 256 tiles
    MP_INTERNAL_CHECK(!f32 && p.bm == 128 && p.bn == 256, "gemm: a whole-tile epilogue planned for a kernel without one");
    return bt ? run<256, true, bf16, 2, true>(a, b, c, m, n, k, stream, s, p)
              : run<256, false, bf16, 2, true>(a, b, c, m, n, k, stream, s, p);
  }
  // One kernel shape (tile width BN, consumers NC) in its four instances: B stored N x K or K x N, bf16 or
  // f32 output.
  auto launch = [&]<int BN, int NC>() {
    if (bt)
      return f32 ? run<BN, true, float, NC>(a, b, c, m, n, k, stream, s, p)
                 : run<BN, true, bf16, NC>(a, b, c, m, n, k, stream, s, p);
    return f32 ? run<BN, false, float, NC>(a, b, c, m, n, k, stream, s, p)
               : run<BN, false, bf16, NC>(a, b, c, m, n, k, stream, s, p);
  };
  // The kernel shapes plan_gemm can ask for: 64 x 128 (one consumer warpgroup), 128 x 128 and 128 x 256.
  if (p.bm == 64) {
    MP_INTERNAL_CHECK(p.bn == 128, "gemm: no 64-row kernel for block_n ", p.bn);
    return launch.template operator()<128, 1>();
  }
  MP_INTERNAL_CHECK(p.bn == 256 || p.bn == 128, "gemm: no kernel for block_n ", p.bn);
  if (p.bn == 256) return launch.template operator()<256, 2>();
  return launch.template operator()<128, 2>();
}

std::string describe_gemm(int m, int n, int k, b_layout, out_type out, const GemmSchedule& s) {
  check_gemm_shape(m, n, k);
  return describe_plan(make_plan(m, n, k, s, out), s);
}

}  // namespace mp::kernels
