// Runs the CUDA C++ that backends/cuda/lower emits on the host, so CI (no GPU) checks what the generated
// code computes, not only that it compiles: each block's threads are std::threads, __syncthreads a
// barrier of the block (bar.sync 1, n one of n of its threads), __syncwarp and a warp shuffle an exchange through memory between two barriers of the warp.
// Blocks run one after another, so one array serves as every block's shared memory (NaN-poisoned before
// each block). Only the few device built-ins the lowering uses are provided.
#pragma once
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/lower/lower.h"
#include "backends/cuda/lower/runtime.h"
#include "ir/eval.h"

// The generated unit's prelude leaves its cp.async helpers to this file (below).
#define MP_HOST_EMULATION 1

struct mp_host_dim3 {
  unsigned x = 0, y = 0, z = 0;
};

namespace mp_host {

struct Block {
  std::unique_ptr<std::barrier<>> all;
  std::mutex named_mutex;  // named barrier 1 (bar.sync 1, n): made by its first caller, n threads
  std::unique_ptr<std::barrier<>> named;
  unsigned named_count = 0;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<double> exchange;
};
inline thread_local mp_host_dim3 tid;
inline thread_local Block* block = nullptr;
inline mp_host_dim3 bid, bdim, gdim;  // written only between blocks, while no thread runs
inline std::mutex atomics;
inline std::atomic<bool> leftover_copies{false};  // a thread ended with cp.async copies not waited for

inline constexpr size_t kSmemFloats = 65536;  // 256 KiB: more than any sm_90 block may opt into

using Kernel = void (*)(void* const*, float*, long long*, float*, long long, int*);

struct Program {
  std::string name;
  float* smem = nullptr;
  std::map<std::string, Kernel> kernels;
};
inline std::vector<Program>& programs() {
  static std::vector<Program> p;
  return p;
}
struct Registrar {
  Registrar(std::string name, float* smem, std::map<std::string, Kernel> k) {
    programs().push_back({std::move(name), smem, std::move(k)});
  }
};

}  // namespace mp_host

#define threadIdx (mp_host::tid)
#define blockIdx (mp_host::bid)
#define blockDim (mp_host::bdim)
#define gridDim (mp_host::gdim)
#define __global__
#define __device__
#define __shared__
#define __forceinline__ inline
#define __launch_bounds__(...)

inline void __syncthreads() { mp_host::block->all->arrive_and_wait(); }
inline void __syncwarp() { mp_host::block->warps[mp_host::tid.x >> 5]->arrive_and_wait(); }
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline double __longlong_as_double(long long v) {
  double d;
  std::memcpy(&d, &v, 8);
  return d;
}
inline int atomicCAS(int* p, int cmp, int val) {
  std::lock_guard<std::mutex> g(mp_host::atomics);
  int old = *p;
  if (old == cmp) *p = val;
  return old;
}
// Blocks run one after another here, so a fence has nothing to order and the last block to count
// itself done is the last one run.
inline void __threadfence() {}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  std::lock_guard<std::mutex> g(mp_host::atomics);
  unsigned long long old = *p;
  *p = old + v;
  return old;
}
struct alignas(16) float4 {
  float x, y, z, w;
};
inline double __shfl_down_sync(unsigned, double v, int d) {
  auto* b = mp_host::block;
  unsigned t = mp_host::tid.x, lane = t & 31, w = t >> 5;
  b->exchange[t] = v;
  b->warps[w]->arrive_and_wait();
  double r = lane + unsigned(d) < 32 ? b->exchange[t + unsigned(d)] : v;
  b->warps[w]->arrive_and_wait();
  return r;
}
inline double __shfl_xor_sync(unsigned, double v, int d) {
  auto* b = mp_host::block;
  unsigned t = mp_host::tid.x, w = t >> 5;
  b->exchange[t] = v;
  b->warps[w]->arrive_and_wait();
  double r = b->exchange[t ^ unsigned(d)];
  b->warps[w]->arrive_and_wait();
  return r;
}

// cp.async on the host: a thread's copies gather into its open group; a committed group lands at the
// latest when a wait allows fewer groups in flight, and every other group lands at once at its commit, so
// both a read before its wait (poison NaN read) and a slot refilled while another thread still reads it
// (data of a later iteration read) show up as wrong results.
namespace mp_host {
struct Copy {
  float* dst;
  const float* src;
  int n;
};
inline thread_local std::vector<Copy> open_group;
inline thread_local std::vector<std::vector<Copy>> in_flight;
inline thread_local unsigned long long commits = 0;
inline void land(const std::vector<Copy>& g) {
  for (auto& c : g) std::memcpy(c.dst, c.src, size_t(c.n) * sizeof(float));
}
}  // namespace mp_host
inline void mp_cp_async16(float* s, const float* g) { mp_host::open_group.push_back({s, g, 4}); }
inline void mp_cp_async4(float* s, const float* g) { mp_host::open_group.push_back({s, g, 1}); }
inline void mp_cp_commit() {
  if (mp_host::commits++ % 2 == 1) {
    mp_host::land(mp_host::open_group);
    mp_host::in_flight.emplace_back();
  } else {
    mp_host::in_flight.push_back(std::move(mp_host::open_group));
  }
  mp_host::open_group.clear();
}
template <int N>
inline void mp_cp_wait() {
  while (mp_host::in_flight.size() > size_t(N)) {
    mp_host::land(mp_host::in_flight.front());
    mp_host::in_flight.erase(mp_host::in_flight.begin());
  }
}

// Bulk copies on mbarriers (MP_CUDA_LOWER_COPY=bulk) on the host: an mbarrier of the block's shared
// memory is a record of this file (by its address, made by mp_bar_init), its phase completing once its
// arrival and the bytes it was told to expect are in. The copies of every other phase of an mbarrier land
// at issue, the others only when a thread waits for their phase, so that, as with cp.async, a read before
// the wait sees the NaN poison and a slot refilled too early shows a later iteration's data. A bulk copy
// not 16-byte aligned or not a multiple of 16 bytes, more bytes copied than announced, a wait on an
// address that is no mbarrier, a wait that does not end within 20 seconds, or a block ending with a phase
// pending or never waited for, is an error (run returns 98).
namespace mp_host {
struct Bar {
  unsigned count = 0, pending = 0;  // arrivals a phase needs, arrivals still missing
  long long tx = 0;                 // bytes announced and not yet landed
  unsigned long long phase = 0, waited = 0;  // phases completed, completed phases some thread waited for
  unsigned long long uses = 0;      // phases announced
  bool copies_used = false;         // told to expect bytes (a "full" mbarrier): each phase must be waited for
  bool lazy = false;                // this phase's copies land at the first wait
  std::vector<Copy> copies;         // ... not landed yet
};
inline std::mutex bar_mutex;
inline std::map<const void*, Bar> bars;  // this block's mbarriers
inline std::atomic<bool> bad_bulk{false};
inline std::atomic<bool> stuck{false};  // a wait timed out: the others of the run return at once
inline thread_local std::chrono::steady_clock::time_point waiting_since{};
inline thread_local bool waiting = false;
inline void bar_complete(Bar& b) {
  if (b.tx < 0) bad_bulk = true;
  if (b.pending == 0 && b.tx == 0) {
    ++b.phase;
    b.pending = b.count;
  }
}
inline void bar_land(Bar& b) {
  for (auto& c : b.copies) {
    std::memcpy(c.dst, c.src, size_t(c.n) * sizeof(float));
    b.tx -= 4LL * c.n;
  }
  b.copies.clear();
  bar_complete(b);
}
inline Bar* bar_of(const void* p) {
  auto it = bars.find(p);
  if (it != bars.end()) return &it->second;
  bad_bulk = true;
  return nullptr;
}
}  // namespace mp_host
inline void mp_bar_init(unsigned long long* b, unsigned arrivals) {
  std::lock_guard<std::mutex> g(mp_host::bar_mutex);
  mp_host::Bar& r = mp_host::bars[b];
  r = {};
  r.count = r.pending = arrivals;
}
inline void mp_bar_fence_init() {}
// A plain arrival (the producer path's "empty" mbarriers): no bytes.
inline void mp_bar_arrive(unsigned long long* b) {
  std::lock_guard<std::mutex> g(mp_host::bar_mutex);
  mp_host::Bar* r = mp_host::bar_of(b);
  if (!r) return;
  if (r->pending == 0) mp_host::bad_bulk = true;
  --r->pending;
  mp_host::bar_complete(*r);
}
// bar.sync 1, n: the first n threads to arrive pass together (every caller must pass the same n).
inline void mp_sync_consumers(unsigned n) {
  mp_host::Block* b = mp_host::block;
  {
    std::lock_guard<std::mutex> g(b->named_mutex);
    if (!b->named) b->named = std::make_unique<std::barrier<>>(std::ptrdiff_t(n)), b->named_count = n;
    if (b->named_count != n) mp_host::bad_bulk = true;
  }
  b->named->arrive_and_wait();
}
inline void mp_fence_proxy_async() {}
inline void mp_bar_expect(unsigned long long* b, unsigned bytes) {
  std::lock_guard<std::mutex> g(mp_host::bar_mutex);
  mp_host::Bar* r = mp_host::bar_of(b);
  if (!r) return;
  if (r->pending == 0) mp_host::bad_bulk = true;
  r->lazy = r->uses++ % 2 == 0;
  r->copies_used = true;
  r->tx += bytes;
  --r->pending;
  mp_host::bar_complete(*r);
}
inline void mp_bulk_copy(float* s, const float* g, unsigned bytes, unsigned long long* b) {
  std::lock_guard<std::mutex> lk(mp_host::bar_mutex);
  mp_host::Bar* r = mp_host::bar_of(b);
  if (!r) return;
  if (bytes == 0 || bytes % 16 != 0 || reinterpret_cast<uintptr_t>(s) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(g) % 16 != 0)
    mp_host::bad_bulk = true;
  r->copies.push_back({s, g, int(bytes / 4)});
  if (!r->lazy) mp_host::bar_land(*r);
}
inline bool mp_bar_try_wait(unsigned long long* b, unsigned parity) {
  {
    std::lock_guard<std::mutex> g(mp_host::bar_mutex);
    mp_host::Bar* r = mp_host::bar_of(b);
    if (!r) return true;
    if ((r->phase & 1) == parity) mp_host::bar_land(*r);  // the phase waited for is the current one
    if ((r->phase & 1) != parity) {
      r->waited = r->phase;
      mp_host::waiting = false;
      return true;
    }
  }
  // Not complete: thread 0 has not announced it yet, or is still issuing. A GPU would wait as long as it
  // takes; here a wait of more than 20 seconds is a hang in the generated code (and every later wait of
  // the run gives up at once).
  auto now = std::chrono::steady_clock::now();
  if (!mp_host::waiting) mp_host::waiting = true, mp_host::waiting_since = now;
  if (mp_host::stuck || now - mp_host::waiting_since > std::chrono::seconds(20)) {
    mp_host::bad_bulk = true;
    mp_host::stuck = true;
    mp_host::waiting = false;
    return true;
  }
  std::this_thread::yield();
  return false;
}

// The 16-byte global store of the prelude: a misaligned address is an error (run returns 97).
namespace mp_host {
inline std::atomic<bool> bad_store{false};
}  // namespace mp_host
inline void mp_st4(float* p, float a, float b, float c, float d) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) mp_host::bad_store = true;
  p[0] = a, p[1] = b, p[2] = c, p[3] = d;
}

namespace mp_host {

// The launch sequence of runtime_cuda.cpp on the host: the same tensor table, values between statements,
// scratch and error word; `max_grid` bounds the persistent blocks (a GPU would use its SM count).
// Returns the device error word (0: none; 99: a thread ended with cp.async copies not waited for; 98: a
// bulk copy or mbarrier misused, see above; 97: a 16-byte store misaligned).
inline int run(const Program& prog, const mp::cuda::Lowered& low, mp::ir::Memory& mem, int max_grid) {
  std::vector<std::vector<unsigned char>> tensors;
  std::vector<void*> table;
  for (auto& t : low.tensors) tensors.push_back(mp::cuda::to_device_bytes(mem.at(t->name)));
  for (auto& b : tensors) table.push_back(b.data());
  std::vector<float> gv(size_t(low.global_floats) + 4, std::nanf(""));
  std::vector<long long> gm(size_t(low.global_meta) + 2, 0);
  int64_t scratch_floats = 0;
  for (auto& k : low.kernels) scratch_floats = std::max(scratch_floats, k.scratch_floats * max_grid);
  std::vector<float> scratch(size_t(scratch_floats) + 4, std::nanf(""));
  alignas(8) int err[4] = {0, 0, 0, 0};
  for (auto& k : low.kernels) {
    Kernel fn = prog.kernels.at(k.entry);
    int grid = k.distributed ? int(std::min<int64_t>(k.trip, max_grid)) : 1;
    gdim.x = unsigned(grid);
    const int nthreads = k.threads > 0 ? k.threads : low.threads;
    bdim.x = unsigned(nthreads);
    for (int b = 0; b < grid; ++b) {
      bid.x = unsigned(b);
      std::memset(prog.smem, 0xff, kSmemFloats * sizeof(float));
      bars.clear();
      Block blk;
      blk.all = std::make_unique<std::barrier<>>(nthreads);
      for (int w = 0; w < nthreads / 32; ++w) blk.warps.push_back(std::make_unique<std::barrier<>>(32));
      blk.exchange.assign(size_t(nthreads), 0.0);
      std::vector<std::thread> threads;
      for (int t = 0; t < nthreads; ++t)
        threads.emplace_back([&, t] {
          tid.x = unsigned(t);
          block = &blk;
          fn(table.data(), gv.data(), gm.data(), scratch.data(), k.scratch_floats, err);
          // A copy never waited for would land after the kernel on a GPU, or never.
          bool left = !open_group.empty();
          for (auto& g : in_flight) left = left || !g.empty();
          if (left) leftover_copies = true;
        });
      for (auto& th : threads) th.join();
      for (auto& [at, r] : bars)  // a phase pending, or completed and never waited for
        if (r.pending != r.count || r.tx != 0 || !r.copies.empty() || (r.copies_used && r.waited != r.phase))
          bad_bulk = true;
    }
  }
  stuck = false;
  if (leftover_copies.exchange(false)) return 99;
  if (bad_bulk.exchange(false)) return 98;
  if (bad_store.exchange(false)) return 97;
  for (size_t i = 0; i < low.tensors.size(); ++i)
    if (low.tensors[i]->role != mp::ir::TensorRole::Input)
      mp::cuda::from_device_bytes(tensors[i], mem.at(low.tensors[i]->name));
  return err[0];
}

}  // namespace mp_host
