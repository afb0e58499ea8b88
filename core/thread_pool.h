// A pool of persistent worker threads for data-parallel loops with low dispatch overhead: the quantized
// matvecs of a decode step run thousands of times per second, so a dispatch must cost microseconds.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

namespace mp {

// parallel_for(n, fn) splits [0, n) into contiguous chunks of near-equal size (a few per thread, at most
// n) and calls fn(begin, end) once per chunk, on the caller and the workers, whichever is free first. It
// returns when every chunk is done; the first exception a chunk throws is rethrown to the caller (the other
// chunks still run to completion). Workers spin briefly after a loop before they sleep, so back-to-back loops
// do not pay a wake-up. Calls from several threads are serialized; a parallel_for inside fn runs on the
// calling thread.
class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads >= 1 (1 = run on the caller); user_error otherwise
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const;
  void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn);
  static int default_threads();  // std::thread::hardware_concurrency(), at least 1

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace mp
