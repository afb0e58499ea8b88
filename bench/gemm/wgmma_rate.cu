// wgmma issue-rate microbenchmark: how many cycles one warpgroup's wgmma m64nNk16 (bf16, A and B from
// shared memory) take back to back, by N, by the number of warpgroups issuing at once on an SM, and by
// the number of independent accumulator chains each keeps. It answers one question of the GEMM's small
// shapes: can a lone consumer warpgroup keep the tensor cores busy, or does a 64-row tile need two?
//
// Each warpgroup runs `steps` K steps of the GEMM main loop's shape: 4 wgmma (one 64-deep K step) into
// its accumulators (slice ks into chain ks % chains), a commit, then a wait leaving `pending` groups in
// flight (as the GEMM's consumer does). Cycles are clock64 around the loop, per warpgroup; the utilisation
// is the FMA the SM's issuing warpgroups did per cycle over the SM's 2048 dense bf16 FMA per cycle.
// A last group of rows gives each K step's first wgmma a run-time scale-d (overwrite on the first step).
// The shared tiles hold zeros or random bf16 values in [-1, 1) (the table has both: a tensor core's
// power, and so the clock it keeps, depends on the values); ns/wgmma is from the global timer, so that a
// clock that drops shows against the cycles. Short loops (32 K steps, a small GEMM's) show warm-up costs.
//   usage: wgmma_rate [--steps N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/device.h"
#include "tile/tile.cuh"

using namespace mp::tile;

namespace {

constexpr int max_wgs = 3;
constexpr int fma_per_clock = 2048;  // dense bf16 on one Hopper SM (989 TFLOP/s at 1.83 GHz, 132 SMs)

// Overwrite: the first wgmma of K step s overwrites (s == 0) or accumulates, chosen at run time (a
// scale-d predicate), as a GEMM that zeroes no accumulators does; otherwise every wgmma accumulates.
// Stages: K step s reads A and B tiles from buffer s % Stages (the GEMM's ring rotates through 8), instead
// of the same ones every step. Ring: each step also goes through the GEMM's ring handshake (one warpgroup
// issuing): a producer thread arrives on the stage's `full` mbarrier once the consumer has released it
// (`empty`), the consumer waits for `full` before its wgmma and releases the stage Pending steps later,
// as the GEMM's --compute-only run does. Sem (with Ring): the consumer's memory ordering, 0: release
// arrivals and acquire waits (the mbarrier defaults); bit 0: relaxed arrivals on `empty`; bit 1: relaxed
// waits on `full`; bit 2: only the waits (no producer: every `full` has completed its first phase before
// the loop and the consumer waits for that phase, so each wait succeeds at once; no arrivals); bit 3: only
// the arrivals on `empty` (no producer, no waits); bit 4: a late release, each stage freed one step later,
// right after the next step's wgmma are issued, before the wait (tried in the GEMM's pipeline and not
// kept: bench/RESULTS.md, GEMM).
// With Ring, a K step's wgmma sit under a run-time test that is always true, as the GEMM's sit under its
// data_only test: without one, ptxas serializes the ring kernels' wgmma (warning C7514: every wgmma waits
// for the one before), and the ring rows measured that serialization (161.5 cycles per m64n128k16) instead
// of the handshake (bench/RESULTS.md, GEMM).
template <int N, int Chains, int Pending, bool Overwrite = false, int Stages = 1, bool Ring = false, int Sem = 0>
__global__ void __launch_bounds__(max_wgs * 128, 1)
    rate_kernel(int wgs, int steps, int random, long long* cycles, long long* ns, float* sink) {
  extern __shared__ uint8_t raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  constexpr int tile_bytes = int(sizeof(st_bf<64, 64>) + sizeof(st_bf<N, 64>));
  auto a_of = [&](int i) -> st_bf<64, 64>& { return *reinterpret_cast<st_bf<64, 64>*>(base + i * tile_bytes); };
  auto b_of = [&](int i) -> st_bf<N, 64>& {
    return *reinterpret_cast<st_bf<N, 64>*>(base + i * tile_bytes + sizeof(st_bf<64, 64>));
  };
  semaphore* full = reinterpret_cast<semaphore*>(base + Stages * tile_bytes);
  semaphore* empty = full + Stages;
  if (Ring && threadIdx.x == 0) {
    for (int i = 0; i < Stages; ++i) init_semaphore(full[i], 1), init_semaphore(empty[i], 4);
    fence_barrier_init();
    if constexpr ((Sem & 4) != 0)  // wait-only rows: the first phase of every `full` completes now
      for (int i = 0; i < Stages; ++i) arrive(full[i]);
  }
  for (int i = threadIdx.x; i < Stages * tile_bytes / 4; i += blockDim.x) {
    uint32_t v = 0;
    if (random) {  // two bf16 in [-1, 1) from a hash of the index
      uint32_t x = (i + 1) * 2654435761u ^ blockIdx.x;
      x ^= x >> 15, x *= 2246822519u, x ^= x >> 13;
      const __nv_bfloat162 b = __floats2bfloat162_rn(float(x & 0xffff) / 32768.f - 1.f,
                                                     float(x >> 16) / 32768.f - 1.f);
      v = *reinterpret_cast<const uint32_t*>(&b);
    }
    reinterpret_cast<uint32_t*>(base)[i] = v;
  }
  fence_async_shared();  // the zeros are read by wgmma (the async proxy)
  __syncthreads();
  const int wg = threadIdx.x / 128;
  constexpr bool waits = Ring && (Sem & 8) == 0, arrivals = Ring && (Sem & 4) == 0;
  constexpr bool producer = waits && arrivals;
  if constexpr (producer) {
    if (wg == 1) {  // warpgroup 1: thread 0 is the producer (no data: it only signals each stage full)
      if (threadIdx.x == 128) {
        ring_pos<Stages> p;
        for (int s = 0; s < steps; ++s, p.advance()) {
          wait(empty[p.stage], p.phase ^ 1u);
          arrive(full[p.stage]);
        }
      }
      return;
    }
  }
  if (wg >= wgs) return;
  ring_pos<Stages> p;
  rt_fl<16, N> acc[Chains];
#pragma unroll
  for (int c = 0; c < Chains; ++c) warp::zero(acc[c]);
  const long long t0 = clock64();
  const unsigned long long n0 = global_timer_ns();
  const bool issue = !Ring || wgs > 0;  // always true: see Ring above
  for (int s = 0; s < steps; ++s, p.advance()) {
    if constexpr (waits) {
      const uint32_t parity = (Sem & 4) ? 0u : p.phase;
      if constexpr ((Sem & 2) != 0)
        wait_relaxed(full[p.stage], parity);
      else
        wait(full[p.stage], parity);
    }
    if (issue) {
#pragma unroll
      for (int c = 0; c < Chains; ++c) warpgroup::fence_accumulator(acc[c]);
      warpgroup::mma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        warpgroup::mma_ABt_slice(acc[ks % Chains], a_of(p.stage), b_of(p.stage), ks,
                                 Overwrite ? (ks > 0 || s > 0) : true);
      warpgroup::mma_commit_group();
#pragma unroll
      for (int c = 0; c < Chains; ++c) warpgroup::fence_accumulator(acc[c]);
    }
    constexpr bool late = (Sem & 16) != 0;
    if constexpr (arrivals && late)
      if (s >= Pending + 1 && threadIdx.x % 32 == 0) {
        const int back = p.stage - Pending - 1;
        arrive(empty[back < 0 ? back + Stages : back]);
      }
    warpgroup::mma_async_wait<Pending>();
    if constexpr (arrivals && !late)
      if (s >= Pending && threadIdx.x % 32 == 0) {
        const int back = p.stage - Pending;
        if constexpr (Sem & 1)
          arrive_relaxed(empty[back < 0 ? back + Stages : back]);
        else
          arrive(empty[back < 0 ? back + Stages : back]);
      }
  }
  warpgroup::mma_async_wait<0>();
  const long long t1 = clock64();
  const unsigned long long n1 = global_timer_ns();
  if (threadIdx.x % 128 == 0) {
    cycles[blockIdx.x * max_wgs + wg] = t1 - t0;
    ns[blockIdx.x * max_wgs + wg] = (long long)(n1 - n0);
  }
  float s = 0;
#pragma unroll
  for (int c = 0; c < Chains; ++c) s += acc[c].tiles[0][0][0].x;
  if (s != 0) sink[threadIdx.x] = s;  // never true (zeros): keeps the accumulators live
}

struct row {
  int n, chains, pending, wgs, steps, stages, sem;
  bool random, overwrite, ring;
  double cycles_per_mma, ns_per_mma, utilisation;
};

long long median(std::vector<long long> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <int N, int Chains, int Pending, bool Overwrite = false, int Stages = 1, bool Ring = false, int Sem = 0>
bool measure(int wgs, int steps, bool random, int blocks, long long* d_cycles, long long* d_ns, float* d_sink,
             row* out) {
  static_assert(!Ring || Stages > Pending, "wgmma_rate: the ring needs more stages than groups in flight");
  const int smem = Stages * int(sizeof(st_bf<64, 64>) + sizeof(st_bf<N, 64>)) + 2 * Stages * 8 + 1024;
  if (Ring && wgs != 1) return false;  // the ring's producer is warpgroup 1
  auto k = rate_kernel<N, Chains, Pending, Overwrite, Stages, Ring, Sem>;
  if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) return false;
  std::vector<long long> h(blocks * max_wgs), hn(blocks * max_wgs);
  for (int rep = 0; rep < 2; ++rep) {  // the first launch warms up; the second is measured
    k<<<blocks, max_wgs * 128, smem>>>(wgs, steps, random ? 1 : 0, d_cycles, d_ns, d_sink);
    if (cudaDeviceSynchronize() != cudaSuccess) return false;
  }
  cudaMemcpy(h.data(), d_cycles, h.size() * sizeof(long long), cudaMemcpyDeviceToHost);
  cudaMemcpy(hn.data(), d_ns, hn.size() * sizeof(long long), cudaMemcpyDeviceToHost);
  std::vector<long long> per, per_ns;  // every issuing warpgroup of every block
  for (int b = 0; b < blocks; ++b)
    for (int w = 0; w < wgs; ++w) per.push_back(h[b * max_wgs + w]), per_ns.push_back(hn[b * max_wgs + w]);
  const double cpm = double(median(per)) / (4.0 * steps);
  out->n = N, out->chains = Chains, out->pending = Pending, out->wgs = wgs, out->steps = steps;
  out->random = random, out->overwrite = Overwrite;
  out->stages = Stages, out->ring = Ring, out->sem = Sem;
  out->cycles_per_mma = cpm;
  out->ns_per_mma = double(median(per_ns)) / (4.0 * steps);
  out->utilisation = wgs * (64.0 * N * 16) / cpm / fma_per_clock;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 4096;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "wgmma_rate: unknown option '%s' (usage: wgmma_rate [--steps N])\n", argv[i]);
      return 2;
    }
  }
  if (steps < 1) {
    std::fprintf(stderr, "wgmma_rate: --steps must be at least 1\n");
    return 2;
  }
  auto gpu = mp::query_gpu();
  if (!gpu || !mp::gpu_is_hopper(*gpu)) {
    std::printf("wgmma_rate: needs a Hopper GPU (sm_90a): %s\n", mp::gpu_absent_reason().c_str());
    return 1;
  }
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  long long *d_cycles = nullptr, *d_ns = nullptr;
  float* d_sink = nullptr;
  cudaMalloc(&d_cycles, sizeof(long long) * sms * max_wgs);
  cudaMalloc(&d_ns, sizeof(long long) * sms * max_wgs);
  cudaMalloc(&d_sink, sizeof(float) * max_wgs * 128);
  std::printf("wgmma m64nNk16 bf16 (SS), K steps of 4 wgmma per warpgroup, one block on each of %d SMs\n", sms);
  std::printf("%5s %7s %8s %4s %6s %7s %10s %7s %15s %13s %9s %11s\n", "N", "chains", "pending", "WGs", "steps",
              "data", "first", "stages", "ring", "cycles/wgmma", "ns/wgmma", "tensor use");
  std::printf("(ring: the consumer's arrivals on empty / waits on full: rel / acq (the defaults) or relaxed)\n");
  bool ok = true;
  auto show = [&](bool fine, const row& r) {
    if (!fine) {
      std::printf("launch failed: %s\n", cudaGetErrorString(cudaGetLastError()));
      ok = false;
      return;
    }
    const char* ring = !r.ring       ? "no"
                       : r.sem == 4  ? "waits only"
                       : r.sem == 8  ? "arrivals only"
                       : r.sem == 16 ? "late release"
                       : r.sem == 0  ? "rel/acq"
                       : r.sem == 1  ? "relaxed/acq"
                       : r.sem == 2  ? "rel/relaxed"
                                     : "relaxed/relaxed";
    std::printf("%5d %7d %8d %4d %6d %7s %10s %7d %15s %13.1f %9.2f %10.1f%%\n", r.n, r.chains, r.pending, r.wgs,
                r.steps, r.random ? "random" : "zeros", r.overwrite ? "run-time" : "accumulate", r.stages, ring,
                r.cycles_per_mma, r.ns_per_mma, 100 * r.utilisation);
  };
  // The GEMM's 64-row tile as its --compute-only run has it: one warpgroup, N = 128, tiles from a ring of 8
  // stages, with and without the ring's mbarrier handshake; 1, 2 and 8 buffers without it.
  for (int st : {steps, 128}) {
    row r{};
    show(measure<128, 1, 1, true, 1>(1, st, true, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<128, 1, 1, true, 2>(1, st, true, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<128, 1, 1, true, 8>(1, st, true, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<128, 1, 1, true, 8, true>(1, st, true, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<128, 1, 1, true, 8, true, 1>(1, st, true, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<128, 1, 1, true, 8, true, 2>(1, st, true, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<128, 1, 1, true, 8, true, 3>(1, st, true, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<128, 1, 1, true, 8, true, 4>(1, st, true, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<128, 1, 1, true, 8, true, 8>(1, st, true, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<128, 1, 1, true, 8, true, 16>(1, st, true, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<128, 1, 1, true, 4, true, 16>(1, st, true, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<128, 1, 1, true, 2, true>(1, st, true, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<128, 1, 2, true, 8, true>(1, st, true, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<256, 1, 1, true, 4>(1, st, true, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<256, 1, 1, true, 4, true>(1, st, true, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<256, 1, 1, true, 4, true, 3>(1, st, true, sms, d_cycles, d_ns, d_sink, &r), r);
  }
  // The GEMM's 64-row tile (one warpgroup, N = 128) and 128-row tile (two, N = 256): zeros and random
  // data, a long loop and a small GEMM's 32 K steps.
  for (bool random : {false, true})
    for (int st : {steps, 32}) {
      row r{};
      show(measure<128, 1, 1>(1, st, random, sms, d_cycles, d_ns, d_sink, &r), r);
      show(measure<256, 1, 1>(2, st, random, sms, d_cycles, d_ns, d_sink, &r), r);
    }
  // The first wgmma of each K step with a run-time scale-d (overwrite or accumulate), as the GEMM had it.
  for (int wgs = 1; wgs <= 2; ++wgs) {
    row r{};
    show(measure<128, 1, 1, true>(wgs, steps, true, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<64, 1, 1, true>(wgs, steps, true, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<256, 1, 1, true>(wgs, steps, true, sms, d_cycles, d_ns, d_sink, &r), r);
  }
  for (int wgs = 1; wgs <= max_wgs; ++wgs) {
    row r{};
    show(measure<64, 1, 1>(wgs, steps, false, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<64, 2, 1>(wgs, steps, false, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<128, 1, 0>(wgs, steps, false, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<128, 1, 1>(wgs, steps, false, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<128, 2, 1>(wgs, steps, false, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<64, 4, 1>(wgs, steps, false, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<256, 1, 1>(wgs, steps, false, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<32, 1, 1>(wgs, steps, false, sms, d_cycles, d_ns, d_sink, &r), r);
    show(measure<32, 4, 1>(wgs, steps, false, sms, d_cycles, d_ns, d_sink, &r), r);
  }
  cudaFree(d_cycles);
  cudaFree(d_ns);
  cudaFree(d_sink);
  return ok ? 0 : 1;
}
