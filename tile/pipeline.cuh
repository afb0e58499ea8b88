// The producer/consumer pipeline template: one producer warpgroup fills an N-stage shared-memory ring
// with TMA, C consumer warpgroups compute on it with wgmma, and each work item ends with a finish step
// (the epilogue). The grid is persistent: at most one block per SM, each walking work items
// blockIdx.x, blockIdx.x + gridDim.x, ... A kernel is a struct K with its load, compute and finish:
//
//   struct K {
//     static constexpr int stages, consumers, producer_registers, consumer_registers;
//     struct globals;  struct stage;  struct finish_smem;  struct state;   // state: consumer registers
//     __host__ __device__ static int work_count(const globals&);
//     struct item;                                           // what a work index means (decoded once)
//     __device__ static item item_of(const globals&, int work);
//     __device__ static int iters(const item&);
//     __device__ static void load(stage&, const globals&, const item&, int iter, semaphore& full);  // 1 thread
//     __device__ static void compute(state&, stage&, const globals&, const item&, int iter, int consumer);
//     __device__ static void finish(state&, finish_smem&, const globals&, const item&, int consumer);
//     __device__ static void begin(state&, const globals&); // optional, each consumer: before its items
//     static constexpr bool unroll_ring;                    // optional: see unroll_ring_of
//     __device__ static void prefetch(const globals&);      // optional, 1 thread first: see prefetch_of
//   };
//
// Per-item shared data (optional): a kernel whose work item has operands that stay in shared memory for
// all its K steps (attention's Q tile) declares load(stage&, finish_smem&, ...) and compute(state&,
// stage&, finish_smem&, ...) instead, and its first load() brings them into finish_smem on the first
// stage's semaphore. The producer runs ahead of the consumers, so such a kernel launches one block per
// work item (launch() with max_blocks = work_count), unless it declares `static constexpr int
// item_slots` (1 or 2): then finish_smem holds that many copies of the per-item operands, the block's
// k-th item uses copy k % item_slots (K::item_of decides it from the work index: k = (work - blockIdx.x)
// / gridDim.x), and the template keeps the producer off a copy until the consumers are done with the
// item that last used it (one semaphore per copy, arrived on by every consumer warp once the item's
// wgmma are done). Such a kernel runs on the persistent grid: the next item's operands load while the
// current item computes and finishes, and a block's set-up is paid once. K::begin then runs before
// every item.
//
// compute() issues wgmma and commits one group; the template waits for the group before the stage goes
// back to the producer (one group stays in flight, so the next stage's loads overlap this one's math).
// K::globals may also carry a timeline trace (trace_mark below) for diagnostics.
#pragma once
#include <utility>
#include "tile/sync.cuh"
#include "tile/tma.cuh"
#include "tile/types.cuh"
#include "tile/warpgroup.cuh"

// MP_PIPELINE_TRACE (CMake option, off by default): the trace_mark / trace_step timeline diagnostics
// (bench_gemm --trace). A build switch because compiled in, it slowed M = 128 from 0.90x to 0.78x
// cuBLAS, where a lone consumer warpgroup's K steps are short (bench/RESULTS.md, GEMM).
#ifndef MP_PIPELINE_TRACE
#define MP_PIPELINE_TRACE 0
#endif
// MP_PIPELINE_STAGE_UNROLL (on by default; 0 for the A/B against the rolled loop): the consumer's K loop
// unrolled by the ring depth (traits::unroll, unroll_ring_of).
#ifndef MP_PIPELINE_STAGE_UNROLL
#define MP_PIPELINE_STAGE_UNROLL 1
#endif

namespace mp::tile::pc {

// The most dynamic shared memory one block may use on Hopper (227 KiB); the template checks its layout
// against this at compile time. Kernels still ask the device at run time (launch()).
constexpr int max_shared_bytes = 227 * 1024;

// Whether the consumer's K loop is unrolled by the ring depth: K::unroll_ring, or by default yes. The
// unrolled loop keeps every stage's addresses as constants (fewer instructions per K step) but holds a
// few more registers live; a kernel whose consumers are at the register limit (ptxas -v shows spills)
// sets unroll_ring = false.
template <class K>
constexpr bool unroll_ring_of() {
  if constexpr (requires { K::unroll_ring; })
    return K::unroll_ring;
  else
    return true;
}

// Whether K keeps per-item operands in finish_smem (see "per-item shared data" above): its load() and
// compute() then take the finish region too.
template <class K>
constexpr bool takes_item_smem = requires(typename K::state& st, typename K::stage& s,
                                          typename K::finish_smem& f, const typename K::globals& g,
                                          const typename K::item& w, semaphore& sem) {
  K::load(s, f, g, w, 0, sem);
  K::compute(st, s, f, g, w, 0, 0);
};

// K's copies of its per-item operands (see "per-item shared data" above): K::item_slots, or 0 (one block
// per work item).
template <class K>
constexpr int item_slots_of() {
  if constexpr (requires { K::item_slots; })
    return K::item_slots;
  else
    return 0;
}

// Timeline diagnostics. When K::globals has `unsigned long long* trace` and `int trace_blocks` and trace is
// set, thread 0 of each block b < trace_blocks writes the global timer (ns) at these points into
// trace[b * trace_points + point] (the item points of the block's last work item are the ones left; the
// last slot holds the SM number). Costs a branch per point when off.
enum trace_point : int {
  trace_start,             // the block starts
  trace_ready,             // its shared memory and semaphores are set up
  trace_first_full,        // the item's first stage is full (consumer 0)
  trace_mainloop_done,     // the item's wgmma are done
  trace_fixup_done,        // the item's partial sums are added (K::finish marks it, where it has any)
  trace_epilogue_begin,    // the kernel's epilogue may write its buffers (K::finish marks it, where it does)
  trace_epilogue_written,  // the epilogue's buffers are written and fenced, its stores next (the same)
  trace_finish_done,       // the item's finish step is issued
  trace_end,               // the block's TMA stores are done
  trace_sm,                // not a time: the SM the block ran on
  trace_steps,             // then per K step i < trace_step_count of the block's last item, three clock64
                           // readings (SM cycles): [3i] its stage is full (consumer 0), [3i + 1] the wgmma
                           // wait returned, [3i + 2] the producer has its stage (the empty wait returned)
};
constexpr int trace_step_count = 64;
constexpr int trace_points = trace_steps + 3 * trace_step_count;
template <class G>
__device__ inline void trace_mark(const G& g, int point) {
  if constexpr (MP_PIPELINE_TRACE && requires {
                  g.trace;
                  g.trace_blocks;
                }) {
    if (g.trace != nullptr && threadIdx.x == 0 && int(blockIdx.x) < g.trace_blocks)
      g.trace[size_t(blockIdx.x) * trace_points + point] = point == trace_sm ? sm_id() : global_timer_ns();
  }
}

// Whether this thread records trace_step readings: read once, before the K loops, so that a K step pays
// one register test for it (a K step of a lone consumer warpgroup is short: every load from the kernel's
// parameters on its path shows in the GEMM's time).
template <class G>
__device__ inline bool tracing_steps(const G& g, int thread = 0) {
  if constexpr (MP_PIPELINE_TRACE && requires {
                  g.trace;
                  g.trace_blocks;
                })
    return g.trace != nullptr && int(threadIdx.x) == thread && int(blockIdx.x) < g.trace_blocks;
  else
    return false;
}
template <class G>
__device__ inline void trace_step(bool tracing, const G& g, int it, int which) {
  if constexpr (requires { g.trace; }) {
    if (tracing && it < trace_step_count)
      g.trace[size_t(blockIdx.x) * trace_points + trace_steps + 3 * it + which] = clock64();
  }
}

template <class K>
struct traits {
  static constexpr int consumers = K::consumers;
  static constexpr int stages = K::stages;
  static constexpr int threads = (consumers + 1) * warpgroup_threads;
  static constexpr int stage_bytes = sizeof(typename K::stage);
  // The finish region is rounded up to 1024 bytes (swizzled tiles in it stay aligned, and the mbarriers
  // after it 8-byte aligned); an empty finish_smem takes no space.
  static constexpr int finish_bytes = std::is_empty_v<typename K::finish_smem>
                                          ? 0
                                          : (int(sizeof(typename K::finish_smem)) + 1023) / 1024 * 1024;
  static constexpr int item_slots = item_slots_of<K>();
  static_assert(item_slots >= 0 && item_slots <= 2, "pipeline: item_slots is 1 or 2 (or absent)");
  static_assert(item_slots == 0 || takes_item_smem<K>, "pipeline: item_slots needs per-item shared data");
  static constexpr int barrier_bytes = (2 * stages + item_slots) * 8;
  // The consumer's K loop unrolled by the ring depth (kernel<K> below), unless K says `unroll_ring =
  // false` (where the unrolled loop's extra live registers would spill) or the build sets
  // MP_PIPELINE_STAGE_UNROLL=0 (the A/B against the rolled loop).
  static constexpr bool unroll = MP_PIPELINE_STAGE_UNROLL && unroll_ring_of<K>();
  // +1024: the dynamic shared memory base is aligned up to 1024 bytes for swizzled tiles.
  static constexpr int shared_bytes = stage_bytes * stages + finish_bytes + barrier_bytes + 1024;
  static_assert(stages >= 1, "pipeline: at least one stage");
  static_assert(consumers >= 1 && consumers <= 3, "pipeline: 1 to 3 consumer warpgroups");
  static_assert(shared_bytes <= max_shared_bytes,
                "pipeline: stages * sizeof(stage) + sizeof(finish_smem) exceeds the 227 KiB of shared memory "
                "a block may use; "
                "use fewer stages or smaller tiles");
  static_assert(sizeof(typename K::stage) % 1024 == 0,
                "pipeline: a stage must be a multiple of 1024 bytes (swizzled tiles)");
  static_assert(K::producer_registers * warpgroup_threads +
                        K::consumer_registers * warpgroup_threads * consumers <=
                    65536,
                "pipeline: the register split exceeds the 64K registers of an SM");
};

// The block's dynamic shared memory as the templates lay it out (aligned up to 1024 bytes for swizzled
// tiles): the stage ring, the finish region, then a full and an empty semaphore per stage.
template <class K>
struct block_smem {
  typename K::stage* stages;
  typename K::finish_smem* fin;
  semaphore* full;   // completes on the producer's expect_bytes arrival and the TMA bytes
  semaphore* empty;  // completes on `empty_arrivals` consumer-warp arrivals
  semaphore* item_empty;  // per copy of the per-item operands (K::item_slots): the same arrivals
  // Thread 0 initialises the semaphores; the caller then syncs the block.
  __device__ static block_smem carve(uint8_t* raw, int empty_arrivals) {
    using T = traits<K>;
    // With the unrolled K loop, aligned in the shared window's 32-bit addresses: the compiler then
    // computes stage addresses in uniform registers from the block's window base, with no generic-address
    // arithmetic. (For the rolled loop, that costs a kernel at the register limit a 32-byte spill.)
    uint8_t* base;
    if constexpr (T::unroll) {
      const uint32_t raw32 = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
      base = static_cast<uint8_t*>(__cvta_shared_to_generic((raw32 + 1023u) & ~1023u));
    } else {
      base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
    }
    block_smem m;
    m.stages = reinterpret_cast<typename K::stage*>(base);
    m.fin = reinterpret_cast<typename K::finish_smem*>(base + T::stage_bytes * T::stages);
    m.full = reinterpret_cast<semaphore*>(base + T::stage_bytes * T::stages + T::finish_bytes);
    m.empty = m.full + T::stages;
    m.item_empty = m.empty + T::stages;
    if (threadIdx.x == 0) {
      for (int s = 0; s < T::stages; ++s) {
        init_semaphore(m.full[s], 1);
        init_semaphore(m.empty[s], empty_arrivals);
      }
      for (int s = 0; s < T::item_slots; ++s) init_semaphore(m.item_empty[s], empty_arrivals);
      fence_barrier_init();
    }
    return m;
  }
};

// K's optional first act (K::prefetch: the tensor maps its TMA copies use, fetched into the SM's
// descriptor cache while the block sets up its semaphores), by the producer warpgroup's first thread.
// What TMA kernels commonly do; on the H200 the GEMM measured level with and without it (bench/RESULTS.md,
// GEMM). Kept: three instructions a block, and no first copy waits for its descriptor.
template <class K>
__device__ inline void prefetch_of(const typename K::globals& g) {
  if constexpr (requires { K::prefetch(g); })
    if (threadIdx.x == traits<K>::consumers * warpgroup_threads) K::prefetch(g);
}

// The producer's loop (one thread): every K step of work items first, first + step, ..., each into the
// next ring stage once its consumers have freed it.
template <class K>
__device__ void produce(const typename K::globals& g, const block_smem<K>& m, int first, int step) {
  ring_pos<traits<K>::stages> p;
  const int nwork = K::work_count(g);
  const bool tracing = tracing_steps(g, int(threadIdx.x));
  constexpr int slots = traits<K>::item_slots;
  for (int work = first, k = 0; work < nwork; work += step, ++k) {
    const typename K::item w = K::item_of(g, work);
    const int iters = K::iters(w);
    // The item's copy of the per-item operands is free once the item k - slots is done with it. Waited
    // for by every item, one without K steps too: each wait then finds its copy at most one use behind,
    // which is what a parity wait can tell apart.
    if constexpr (slots > 0) wait(m.item_empty[k % slots], ((k / slots) & 1) ^ 1u);
    for (int it = 0; it < iters; ++it, p.advance()) {
      wait(m.empty[p.stage], p.phase ^ 1u);  // a fresh barrier counts as having completed phase "-1"
      trace_step(tracing, g, it, 2);
      if constexpr (takes_item_smem<K>)
        K::load(m.stages[p.stage], *m.fin, g, w, it, m.full[p.stage]);  // see "per-item shared data" above
      else
        K::load(m.stages[p.stage], g, w, it, m.full[p.stage]);
    }
  }
}

#ifndef __CUDACC_RTC__  // host code: not in NVRTC units (the CUDA lowering launches through the driver API)
// An attribute of the current device.
inline int device_attribute(cudaDeviceAttr a) {
  int dev = 0, v = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&v, a, dev);
  return v;
}
// SMs and bytes of L2 of the current device, queried once.
inline int device_sm_count() {
  static const int n = device_attribute(cudaDevAttrMultiProcessorCount);
  return n;
}
inline long long device_l2_bytes() {
  static const long long n = device_attribute(cudaDevAttrL2CacheSize);
  return n;
}

#endif  // __CUDACC_RTC__

// One block of K's pipeline: what kernel<K> below runs. A kernel of its own (the CUDA lowering's
// generated entries, extern "C" with their own parameters) calls it with a globals that lives in its
// parameters, launched with traits<K>::threads threads and traits<K>::shared_bytes of dynamic shared memory.
template <class K>
__device__ __forceinline__ void run_block(const typename K::globals& g) {
  using T = traits<K>;
  trace_mark(g, trace_start);
  prefetch_of<K>(g);
  extern __shared__ uint8_t smem_raw[];
  // One arrival per consumer warp on `empty`.
  const auto m = block_smem<K>::carve(smem_raw, T::consumers * warpgroup_warps);
  auto* stages = m.stages;
  auto* fin = m.fin;
  semaphore* full = m.full;
  semaphore* empty = m.empty;
  __syncthreads();
  trace_mark(g, trace_ready);
  trace_mark(g, trace_sm);
  const int first = blockIdx.x, stride = gridDim.x;  // this block's work items: first, first + stride, ...

  const int nwork = K::work_count(g);
  // The same for every thread of a warp, which with the unrolled K loop the compiler learns from a
  // shuffle (and then keeps what depends on it, like the wgmma descriptors, in uniform registers).
  const int wg = T::unroll ? __shfl_sync(0xffffffffu, warpgroup::warpgroup_id(), 0) : warpgroup::warpgroup_id();
  if (wg == T::consumers) {  // producer warpgroup
    warpgroup::decrease_registers<K::producer_registers>();
    if (warpgroup::thread_in_group() == 0) produce<K>(g, m, first, stride);
  } else {  // consumer warpgroups
    warpgroup::increase_registers<K::consumer_registers>();
    typename K::state st;
    ring_pos<T::stages> p;
    const bool signaller = threadIdx.x % warp_threads == 0;
    // One wgmma group stays in flight when a consumer moves to the next K step, so a stage goes back to
    // the producer one step after its own (0 and 2 measured no faster: bench/RESULTS.md, GEMM).
    constexpr int pending = 1;
    // Read once: the K loop below runs on registers (see tracing_steps).
    const bool tracing = tracing_steps(g);
    constexpr int slots = T::item_slots;
    // optional: the consumer's own set-up (per item on the persistent grid of per-item operands)
    if constexpr (slots == 0 && requires { K::begin(st, g); }) K::begin(st, g);
    // One K step of an item on ring stage `s`: an int, or a std::integral_constant where the K loop is
    // unrolled by the ring depth (T::unroll).
    auto step = [&](const typename K::item& w, int it, auto s) {
      wait(full[s], p.phase);
      if (tracing && it == 0) trace_mark(g, trace_first_full);
      trace_step(tracing, g, it, 0);
      if constexpr (takes_item_smem<K>)
        K::compute(st, stages[s], *fin, g, w, it, wg);
      else
        K::compute(st, stages[s], g, w, it, wg);
      // At most `pending` groups stay in flight; the step they were issued before is done: free it.
      warpgroup::mma_async_wait<pending>();
      trace_step(tracing, g, it, 1);
      if (it >= pending && signaller) {
        const int back = int(s) - pending;  // the stage `pending` steps behind
        arrive(empty[back < 0 ? back + T::stages : back]);
      }
    };
    // The K loop, unrolled by the ring depth (T::unroll): every step's stage is then a compile-time
    // constant and its addresses (and wgmma descriptors) are the ring's base plus constants, kept in
    // uniform registers (50 instructions per K step of the GEMM against 77 rolled; bench/RESULTS.md,
    // GEMM). A pass over the stages starts at the item's current stage and stops after its last K step.
    // Rolled, the ring's address is made opaque, so that the compiler keeps it in registers instead of
    // recomputing it from the block's shared-memory window at every K step.
    if constexpr (!T::unroll) asm volatile("" : "+l"(stages));
    auto mainloop = [&](const typename K::item& w, int iters) {
      if constexpr (T::unroll) {
        int it = 0;
        auto unrolled = [&]<int S>() {
          step(w, it, std::integral_constant<int, S>{});
          ++it;
          p.advance();
        };
        while (it < iters) {
          [&]<int... S>(std::integer_sequence<int, S...>) {
            ((p.stage == S && it < iters ? unrolled.template operator()<S>() : void()), ...);
          }(std::make_integer_sequence<int, T::stages>{});
        }
      } else {
        for (int it = 0; it < iters; ++it, p.advance()) step(w, it, p.stage);
      }
    };
    for (int work = first, k = 0; work < nwork; work += stride, ++k) {
      const typename K::item w = K::item_of(g, work);
      const int iters = K::iters(w);
      if constexpr (slots > 0 && requires { K::begin(st, g); }) K::begin(st, g);
      // The stage `back` (<= stages) K steps behind the current one.
      auto behind = [&p](int back) {
        const int s = p.stage - back;
        return s < 0 ? s + T::stages : s;
      };
      mainloop(w, iters);
      warpgroup::mma_async_wait<0>();
      trace_mark(g, trace_mainloop_done);
      if (signaller) {  // the item's last steps, oldest first (p is one past the last)
        for (int back = min(pending, iters); back >= 1; --back) arrive(empty[behind(back)]);
        if constexpr (slots > 0) arrive(m.item_empty[k % slots]);  // its per-item operands are read
      }
      K::finish(st, *fin, g, w, wg);
      trace_mark(g, trace_finish_done);
    }
    tma::wait_all<0>();  // TMA stores a finish step issued must be done before the block's shared memory goes
    trace_mark(g, trace_end);
  }
}

template <class K>
__global__ void __launch_bounds__(traits<K>::threads, 1)
    kernel(const __grid_constant__ typename K::globals g) {
  run_block<K>(g);
}

#ifndef __CUDACC_RTC__

// The persistent grid of K: one block per SM (each takes a whole SM's shared memory), queried once.
// Kernels that cut work by the grid size (stream-K) ask for it before launching.
template <class K>
int resident_blocks() {
  static int resident = [] {
    cudaFuncSetAttribute(kernel<K>, cudaFuncAttributeMaxDynamicSharedMemorySize, traits<K>::shared_bytes);
    return device_sm_count();
  }();
  return resident;
}

// Launch K: the persistent grid (resident_blocks), or `max_blocks` blocks when given, never more than the
// work needs.
template <class K>
cudaError_t launch(const typename K::globals& g, cudaStream_t stream, int max_blocks = 0) {
  using T = traits<K>;
  static cudaError_t attr =
      cudaFuncSetAttribute(kernel<K>, cudaFuncAttributeMaxDynamicSharedMemorySize, T::shared_bytes);
  if (attr != cudaSuccess) return attr;
  const int nwork = K::work_count(g);
  if (nwork == 0) return cudaSuccess;
  int blocks = max_blocks > 0 ? max_blocks : resident_blocks<K>();
  blocks = std::min(blocks, nwork);
  kernel<K><<<blocks, T::threads, T::shared_bytes, stream>>>(g);
  return cudaGetLastError();
}
#endif  // __CUDACC_RTC__

}  // namespace mp::tile::pc
