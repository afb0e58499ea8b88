// ThreadPool: workers wait on a generation counter (spinning first, then sleeping in atomic::wait, a
// futex on Linux); every thread claims chunks with a compare-exchange and counts them done, and the
// caller waits on that count the same way.
#include "core/thread_pool.h"

#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MP_CPU_RELAX() _mm_pause()
#else
#define MP_CPU_RELAX() std::this_thread::yield()
#endif

namespace mp {
namespace {

// How long a worker (or the caller) spins before it sleeps. Long enough to span the gap between the
// matvecs of one decode step, short enough not to burn a core once the loops stop.
constexpr auto kSpin = std::chrono::microseconds(200);

// Chunks per thread of one loop (see parallel_for).
constexpr int64_t kChunksPerThread = 2;

// Set while this thread runs a chunk, so that a nested parallel_for runs inline instead of deadlocking.
thread_local bool t_in_chunk = false;

// Waits until `a` differs from `old` and returns the new value.
template <class T>
T spin_then_wait(const std::atomic<T>& a, T old) {
  T v = a.load(std::memory_order_acquire);
  if (v != old) return v;
  auto start = std::chrono::steady_clock::now();
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      MP_CPU_RELAX();
      v = a.load(std::memory_order_acquire);
      if (v != old) return v;
    }
    if (std::chrono::steady_clock::now() - start > kSpin) break;
  }
  for (;;) {
    a.wait(old, std::memory_order_acquire);
    v = a.load(std::memory_order_acquire);
    if (v != old) return v;
  }
}

// Chunk i of `chunks` near-equal contiguous chunks of [0, n), computed without overflowing n * i.
void chunk_range(int64_t n, int64_t chunks, int64_t i, int64_t& begin, int64_t& end) {
  int64_t q = n / chunks, r = n % chunks;
  begin = q * i + (i < r ? i : r);
  end = begin + q + (i < r ? 1 : 0);
}

}  // namespace

struct ThreadPool::State {
  int threads = 1;
  std::vector<std::thread> workers;
  std::mutex call_mu;  // one parallel_for at a time

  // The current loop. `fn`, `n` and `chunks` are written before `claim` is stored (release) and read only
  // after a successful claim (acquire); they change again only once every chunk of the loop is done.
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0, chunks = 0;
  bool stop = false;
  // The three words every loop touches, each on its own cache line: the workers poll `generation` while
  // they spin, and the claims and completions must not invalidate it under them.
  // Bumped once per loop (and at shutdown) to wake the workers.
  alignas(64) std::atomic<uint32_t> generation{0};
  // (generation << 32) | chunks not yet claimed: any thread, the caller included, claims a chunk by a
  // compare-exchange that counts this down and also checks that the loop is still the one it woke for
  // (the count lives in the same word, so a late worker never reads another loop's count). So a worker
  // that the OS has not scheduled yet never holds the caller up: the caller runs the chunks itself.
  alignas(64) std::atomic<uint64_t> claim{0};
  alignas(64) std::atomic<int64_t> done{0};  // chunks finished in the current loop

  std::mutex err_mu;
  std::exception_ptr err;

  // Claims and runs chunks of loop `gen` until none is left, then counts them done at once.
  void run_chunks(uint32_t gen) {
    int64_t ran = 0;
    uint64_t c = claim.load(std::memory_order_acquire);
    for (;;) {
      const int64_t left = static_cast<int64_t>(c & 0xFFFFFFFFu);
      if (static_cast<uint32_t>(c >> 32) != gen || left == 0) break;
      if (!claim.compare_exchange_weak(c, c - 1, std::memory_order_acq_rel, std::memory_order_acquire))
        continue;
      const int64_t i = chunks - left;
      int64_t b, e;
      chunk_range(n, chunks, i, b, e);
      t_in_chunk = true;
      try {
        (*fn)(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> lk(err_mu);
        if (!err) err = std::current_exception();
      }
      t_in_chunk = false;
      ++ran;
      c = claim.load(std::memory_order_acquire);
    }
    if (ran == 0) return;
    const int64_t total = chunks;  // read before the last chunk is counted: the loop may end right after
    if (done.fetch_add(ran, std::memory_order_acq_rel) + ran == total) done.notify_one();
  }

  void worker() {
    uint32_t seen = 0;
    for (;;) {
      seen = spin_then_wait(generation, seen);
      if (stop) return;
      run_chunks(seen);
    }
  }
};

ThreadPool::ThreadPool(int threads) : state_(std::make_unique<State>()) {
  MP_USER_CHECK(threads >= 1, "ThreadPool: threads=", threads, " must be at least 1 (1 runs on the caller)");
  MP_USER_CHECK(threads <= 1024, "ThreadPool: threads=", threads, " is more than the 1024 a pool supports");
  state_->threads = threads;
  state_->workers.reserve(static_cast<size_t>(threads - 1));
  for (int i = 1; i < threads; ++i) state_->workers.emplace_back([s = state_.get()] { s->worker(); });
}

ThreadPool::~ThreadPool() {
  State& s = *state_;
  if (s.workers.empty()) return;
  std::lock_guard<std::mutex> lk(s.call_mu);
  s.stop = true;
  s.generation.fetch_add(1, std::memory_order_release);
  s.generation.notify_all();
  for (auto& t : s.workers) t.join();
}

int ThreadPool::threads() const { return state_->threads; }

int ThreadPool::default_threads() {
  unsigned h = std::thread::hardware_concurrency();
  return h == 0 ? 1 : static_cast<int>(h);
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  MP_USER_CHECK(n >= 0, "ThreadPool::parallel_for: n=", n, " must not be negative");
  if (n == 0) return;
  State& s = *state_;
  if (s.threads == 1 || n == 1 || t_in_chunk) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> lk(s.call_mu);
  s.fn = &fn;
  s.n = n;
  // A few chunks per thread, so that a worker the OS runs late delays the loop by one short chunk.
  const int64_t max_chunks = static_cast<int64_t>(s.threads) * kChunksPerThread;
  s.chunks = n < max_chunks ? n : max_chunks;
  s.err = nullptr;
  s.done.store(0, std::memory_order_relaxed);
  const uint32_t gen = s.generation.load(std::memory_order_relaxed) + 1;
  s.claim.store(static_cast<uint64_t>(gen) << 32 | static_cast<uint64_t>(s.chunks),
                std::memory_order_release);
  s.generation.store(gen, std::memory_order_release);
  s.generation.notify_all();
  s.run_chunks(gen);
  for (int64_t d = s.done.load(std::memory_order_acquire); d != s.chunks;) d = spin_then_wait(s.done, d);
  s.fn = nullptr;
  if (s.err) {
    std::exception_ptr e = s.err;
    s.err = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace mp
