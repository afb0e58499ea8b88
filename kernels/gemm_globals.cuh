// What the GEMM kernels take (kernels/gemm_sm90.cu): one struct for every tile shape and output type,
// filled on the host from the plan (GemmPlan) and read by the kernel and its policies
// (gemm_split.cuh, gemm_epilogue.cuh, gemm_l2.cuh).
#pragma once
#include "tile/tile.cuh"

namespace mp::kernels {

struct gemm_globals {
  CUtensorMap a, b, c;  // c: the output
  int m, n, k;
  int tiles_m, tiles_n, k_iters, group_m;
  // How tiles become work items (gemm_split.cuh, segment_of): split-K (splits > 1) cuts every tile into
  // `splits` K ranges; otherwise the first dp_tiles tiles are one item each and the sk_tiles after them
  // are shared out over the `grid` blocks as equal K ranges (stream-K), so that the last wave has no idle
  // SMs.
  int splits, iters_per_split;
  int dp_tiles, sk_tiles, grid;
  // Tiles finished by several blocks: each writes its fp32 partial to ws (slot `which` of the tile), and
  // one (see fixed_reducer; counters, left at zero after each tile) adds the others' to its own and stores.
  float4* ws;
  int* counters;
  int slots;
  // Split-K tiles on the persistent grid and stream-K tiles: the item numbered last (see fixup) adds the
  // others' partials (a fixed reducer: its counter only counts their writes), instead of the last item to
  // arrive.
  int fixed_reducer;
  int data_only;     // diagnostic: no wgmma (GemmSchedule::data_only)
  int compute_only;  // diagnostic: no loads (GemmSchedule::compute_only)
  unsigned long long* trace;  // diagnostic timeline (GemmSchedule::trace; pc::trace_mark), or null
  int trace_blocks;
  // L2 priorities of the loads of A and B and the stores of C (GemmPlan::l2_a, l2_b, l2_c), as
  // a + 4 b + 16 c of tma::l2_priority values; 0: no hints (gemm_l2.cuh).
  int l2_hint;
};

}  // namespace mp::kernels
