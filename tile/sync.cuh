// mbarrier wrappers with phase tracking, fences between the generic and the async proxy, named barriers.
// An mbarrier completes a phase once its expected arrivals and expected transaction bytes (TMA) are in;
// waiters name the phase parity they wait for.
#pragma once
#include <cstdint>

namespace mp::tile {

struct alignas(8) semaphore {
  uint64_t v;
  __device__ uint32_t addr() const { return static_cast<uint32_t>(__cvta_generic_to_shared(&v)); }
};

// Call from one thread, then fence_barrier_init() and a block barrier before anyone else uses it.
__device__ inline void init_semaphore(semaphore& s, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(s.addr()), "r"(arrivals) : "memory");
}
__device__ inline void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ inline void arrive(semaphore& s) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(s.addr()) : "memory");
}
// An arrival with no memory ordering (.relaxed): for a thread whose accesses to what the semaphore guards
// are complete before it arrives by other means, e.g. wgmma reads of a ring stage after wgmma.wait_group.
__device__ inline void arrive_relaxed(semaphore& s) {
  asm volatile("mbarrier.arrive.relaxed.cta.shared::cta.b64 _, [%0];" ::"r"(s.addr()) : "memory");
}
// One arrival that also announces `bytes` of TMA traffic the phase must wait for.
__device__ inline void expect_bytes(semaphore& s, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(s.addr()),
               "r"(bytes)
               : "memory");
}
// How a wait orders what follows it: acquire at CTA scope (the default), no ordering (relaxed: for waits
// whose data reaches the waiter by other means, e.g. wgmma reads of a TMA-filled stage, which the
// mbarrier's transaction count covers), or acquire at cluster scope (phases that peer blocks complete:
// arrive_cluster, store_async_cluster).
enum class wait_order { cta, relaxed, cluster };
// Whether the phase with this parity has completed (mbarrier.try_wait: the thread may be suspended for a
// while until it does).
template <wait_order O = wait_order::cta>
__device__ inline bool phase_done(semaphore& s, uint32_t parity) {
  uint32_t done;
#define MP_PHASE_DONE(SEM)                                                    \
  asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity" SEM               \
               ".shared::cta.b64 p, [%1], %2;\n"                              \
               "selp.u32 %0, 1, 0, p;\n}\n"                                   \
               : "=r"(done)                                                   \
               : "r"(s.addr()), "r"(parity)                                   \
               : "memory")
  if constexpr (O == wait_order::cta)
    MP_PHASE_DONE(".acquire.cta");
  else if constexpr (O == wait_order::relaxed)
    MP_PHASE_DONE(".relaxed.cta");
  else
    MP_PHASE_DONE(".acquire.cluster");
#undef MP_PHASE_DONE
  return done != 0;
}
// Wait until the phase with this parity has completed.
template <wait_order O = wait_order::cta>
__device__ inline void wait(semaphore& s, uint32_t parity) {
  while (!phase_done<O>(s, parity)) {
  }
}
__device__ inline void wait_relaxed(semaphore& s, uint32_t parity) { wait<wait_order::relaxed>(s, parity); }

// A ring position: stage index and the parity of the current pass over the ring.
template <int Stages>
struct ring_pos {
  int stage = 0;
  uint32_t phase = 0;
  __device__ void advance() {
    if (++stage == Stages) {
      stage = 0;
      phase ^= 1u;
    }
  }
  // Skip n positions (n >= 0): every wrap past the end of the ring flips the parity.
  __device__ void advance(int n) {
    const int t = stage + n;
    phase ^= uint32_t((t / Stages) & 1);
    stage = t % Stages;
  }
};

// ---- thread-block clusters ----
__device__ inline uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// All threads of all blocks of the cluster (release / acquire: shared-memory writes and barrier inits
// before it are visible to the peers after it).
__device__ inline void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}
// The shared::cluster address of `p` (in this block's shared memory) at the same offset in block `cta` of
// the cluster.
__device__ inline uint32_t cluster_address(const void* p, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))), "r"(cta));
  return remote;
}
// Arrive on the semaphore at the same shared-memory offset in block `cta` of the cluster (release at cluster
// scope: this thread's memory accesses before it happen before a peer's wait_cluster returns).
__device__ inline void arrive_cluster(semaphore& s, uint32_t cta) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(cluster_address(&s, cta))
               : "memory");
}
// The same arrival with no memory ordering (.relaxed): for a thread whose accesses to what the semaphore
// guards are complete before it arrives by other means, e.g. a consumer freeing a ring stage that a peer
// multicasts into, after wgmma.wait_group has retired the wgmma that read it. A release at cluster scope
// costs a MEMBAR.ALL.GPU before the arrival (SASS), which halved the multicast ring's load rate (the
// loads alone at 4096^3 in 2-block clusters: 246 us against 123 us without; bench/RESULTS.md, GEMM).
__device__ inline void arrive_cluster_relaxed(semaphore& s, uint32_t cta) {
  asm volatile("mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [%0];" ::"r"(cluster_address(&s, cta))
               : "memory");
}
// Wait for a phase that peer blocks complete (arrive_cluster, store_async_cluster): acquire at cluster scope.
__device__ inline void wait_cluster(semaphore& s, uint32_t parity) { wait<wait_order::cluster>(s, parity); }
// Store 16 bytes into a peer block's shared memory (`addr` from cluster_address; 16-byte aligned) and count
// them on the peer's semaphore at `sem` (cluster_address of it), whose phase waits for them through
// expect_bytes. Asynchronous: the writer needs no fence; the peer's wait_cluster makes the data visible.
__device__ inline void store_async_cluster(uint32_t addr, float4 v, uint32_t sem) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                   addr),
               "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(__float_as_uint(v.z)),
               "r"(__float_as_uint(v.w)), "r"(sem)
               : "memory");
}

// ---- flags in global memory between blocks of one grid ----
// Add to a counter with release semantics at GPU scope: once a block's threads have written what the
// counter announces and synced (a block or named barrier), one thread adds, and the barrier makes the
// others' writes part of what the release publishes.
__device__ inline void add_release_gpu(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// Read a counter with acquire semantics at GPU scope: what was published by the releases it observes is
// visible to this thread, and to the threads that sync with it afterwards.
__device__ inline int load_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Stores to shared memory by 32-bit shared-window address (smem_addr() + layout offset). A C++ store
// through a pointer into a shared tile is generic (ST.E with a 64-bit address) unless the compiler can
// prove the address space, and a generic store to shared memory is slower than st.shared (STS).
__device__ inline void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ inline void st_shared_v2_f32(uint32_t addr, float2 v) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(v.x), "f"(v.y) : "memory");
}

// stmatrix.x4: the warp writes four 8 x 8 matrices of 16-bit elements; lane l gives the shared address
// of row l % 8 of matrix l / 8 (16 contiguous bytes), and v[i] is the lane's pair of matrix i (row
// lane / 4, columns 2 * (lane % 4) and + 1) as a bf16x2 / half2. One instruction for what takes four
// st.shared.b32 per lane.
__device__ inline void stmatrix_x4(uint32_t addr, uint32_t v0, uint32_t v1, uint32_t v2, uint32_t v3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v0),
               "r"(v1), "r"(v2), "r"(v3)
               : "memory");
}

// A 1-D bulk copy (cp.async.bulk, the TMA engine without a tensor map) of `bytes` contiguous bytes from
// global memory into this block's shared memory, completing on `bar` (whose phase expects the bytes
// through expect_bytes). Both addresses and `bytes` are multiples of 16. For streams that are contiguous
// in memory (a GEMV's weight rows): the bytes in flight cost no registers.
__device__ inline void load_bulk(void* dst, const void* src, uint32_t bytes, semaphore& bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src), "r"(bytes), "r"(bar.addr())
               : "memory");
}

// Writes by ordinary stores (st.shared, stmatrix) that TMA or wgmma read next need this in the writer.
__device__ inline void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// A barrier over `threads` threads (a multiple of 32) using hardware barrier `id` (1..15; 0 is
// __syncthreads).
__device__ inline void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// Arrive on named barrier `id` without waiting: the threads that bar.sync on it with the same count go on
// once all `threads` have arrived (producer / consumer hand-offs between warpgroups).
__device__ inline void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Programmatic dependent launch (sm_90). A grid launched with programmatic stream serialization may start
// while the grid before it in the stream is still running: it must call grid_dependency_wait() before
// touching global memory that grid reads or writes (the wait returns once that grid has finished and its
// writes are visible; without the launch attribute it returns at once). allow_dependent_launch() lets the
// next such grid in the stream start launching (its blocks then wait in grid_dependency_wait()).
__device__ inline void grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ inline void allow_dependent_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// The SM this thread runs on (diagnostics only).
__device__ inline unsigned sm_id() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}
// The GPU's global nanosecond timer (comparable across SMs; diagnostics only).
__device__ inline unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace mp::tile
