// The ping-pong variant of the producer/consumer pipeline (tile/pipeline.cuh): the same kernel struct K
// (load / compute / finish over an N-stage ring, persistent grid), but each work item belongs to ONE of the
// two consumer warpgroups. A block's items j = 0, 1, 2, ... go to consumer j % 2, and the consumers take
// turns at the tensor cores: consumer c runs item j's mainloop only after the other consumer has issued
// the last wgmma of item j - 1, so one consumer's epilogue (finish) overlaps the other's mainloop.
//
// K's compute() gets the whole stage (its `consumer` argument says which warpgroup runs it); finish() may
// use named barriers 1 and 2 (one per consumer); this template uses 3 and 4 for the turn hand-off.
#pragma once
#include "tile/pipeline.cuh"

namespace mp::tile::pc {

// Named barriers of the turn hand-off: consumer c waits on turn_barrier + c.
constexpr int turn_barrier = 3;

template <class K>
__global__ void __launch_bounds__(traits<K>::threads, 1)
    pingpong_kernel(const __grid_constant__ typename K::globals g) {
  using T = traits<K>;
  static_assert(T::consumers == 2, "pingpong: exactly two consumer warpgroups take turns");
  static_assert(T::cluster == 1 && !T::multicast, "pingpong: no thread-block clusters (each item has one consumer)");
  trace_mark(g, trace_start);
  prefetch_of<K>(g);
  extern __shared__ uint8_t smem_raw[];
  // one arrival per warp of the one consumer of a stage on `empty`
  const auto m = block_smem<K>::carve(smem_raw, warpgroup_warps);
  auto* stages = m.stages;
  auto* fin = m.fin;
  semaphore* full = m.full;
  semaphore* empty = m.empty;
  __syncthreads();
#if MP_PIPELINE_PDL
  grid_dependency_wait();  // dependent launch: as in kernel<K> (tile/pipeline.cuh)
  allow_dependent_launch();
#endif
  trace_mark(g, trace_ready);
  trace_mark(g, trace_sm);

  const int nwork = K::work_count(g);
  const int wg = warpgroup::warpgroup_id();
  if (wg == T::consumers) {  // producer warpgroup: the block's items in order, every K step of each
    warpgroup::decrease_registers<K::producer_registers>();
    if (warpgroup::thread_in_group() == 0) produce<K>(g, m, blockIdx.x, gridDim.x);
  } else {  // consumer warpgroups 0 and 1, alternating items
    warpgroup::increase_registers<K::consumer_registers>();
    typename K::state st;
    ring_pos<T::stages> p;  // follows the producer over the other consumer's items too
    const bool signaller = threadIdx.x % warp_threads == 0;
    if constexpr (requires { K::begin(st, g); }) K::begin(st, g);
    int j = 0;
    for (int work = blockIdx.x; work < nwork; work += gridDim.x, ++j) {
      const typename K::item w = K::item_of(g, work);
      const int iters = K::iters(w);
      if ((j & 1) != wg) {
        p.advance(iters);
        continue;
      }
      // Wait for the turn. Besides the ordering, this keeps the full-barrier waits below sound: a parity
      // wait is exact only while the stage's previous fill has completed, and the other consumer has
      // passed all its waits on item j - 1's fills before it hands the turn over.
      if (j > 0) named_barrier_sync(turn_barrier + wg, 2 * warpgroup_threads);
      int prev = -1;
      for (int it = 0; it < iters; ++it, p.advance()) {
        wait(full[p.stage], p.phase);
        K::compute(st, stages[p.stage], g, w, it, wg);
        warpgroup::mma_async_wait<1>();  // the previous iteration's wgmma are done: free its stage
        if (prev >= 0 && signaller) arrive(empty[prev]);
        prev = p.stage;
      }
      // All of this item's wgmma are issued: hand the tensor cores to the other consumer (one arrival
      // per sync: only when the block has a next item, which is the other consumer's).
      if (work + gridDim.x < nwork) named_barrier_arrive(turn_barrier + (wg ^ 1), 2 * warpgroup_threads);
      warpgroup::mma_async_wait<0>();
      if (prev >= 0 && signaller) arrive(empty[prev]);
      K::finish(st, *fin, g, w, wg);
    }
    tma::wait_all<0>();  // TMA stores a finish step issued must be done before the block's shared memory goes
  }
}

// Launch K with the ping-pong schedule: a persistent grid of one block per SM (or `max_blocks`), never
// more blocks than work items; with `overlap`, as a programmatic dependent launch.
template <class K>
cudaError_t launch_pingpong(const typename K::globals& g, cudaStream_t stream, int max_blocks = 0,
                            bool overlap = false) {
  using T = traits<K>;
  static cudaError_t attr =
      cudaFuncSetAttribute(pingpong_kernel<K>, cudaFuncAttributeMaxDynamicSharedMemorySize, T::shared_bytes);
  if (attr != cudaSuccess) return attr;
  const int nwork = K::work_count(g);
  if (nwork == 0) return cudaSuccess;
  overlap = overlap && MP_PIPELINE_PDL;  // as in launch()
  if (!overlap) {
    pingpong_kernel<K><<<std::min(max_blocks > 0 ? max_blocks : device_sm_count(), nwork), T::threads,
                         T::shared_bytes, stream>>>(g);
    return cudaGetLastError();
  }
  cudaLaunchAttribute at[2];
  cudaLaunchConfig_t cfg = launch_config<K>(stream, at, overlap);
  cfg.gridDim = dim3(std::min(max_blocks > 0 ? max_blocks : device_sm_count(), nwork));
  return cudaLaunchKernelEx(&cfg, pingpong_kernel<K>, g);
}

}  // namespace mp::tile::pc
