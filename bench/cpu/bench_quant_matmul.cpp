// Microbenchmark of the quantized CPU kernels at SmolLM2-135M's shapes (d 576, FFN 1536, vocabulary 49152;
// Q4_1 matrices and a Q8_0 LM head), per kernel path and thread count.
//
// Each matvec cycles over enough copies of its matrix to fill `--ws_mb` (default 100 MB, the size of the
// model), so the weights come from where a decode step finds them rather than from a warm L2; the
// "hot" variants reuse one copy. bytes_per_second is weight bytes; llama.cpp's decode rate on the same
// file (tokens/s x file bytes) is the GB/s to compare with.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/quant_matmul.h"
#include "core/quant.h"
#include "core/thread_pool.h"

namespace {

using mp::ThreadPool;
using mp::cpu::QMatrix;
using mp::quant::QType;
namespace quant = mp::quant;

size_t g_ws_bytes = 100u << 20;

// Random blocks with sane half scales (the values do not change the speed, NaNs might).
std::vector<uint8_t> random_weights(QType t, int64_t rows, int64_t cols, uint64_t seed) {
  const uint64_t rb = *quant::row_bytes(t, cols);
  std::vector<uint8_t> m(rows * rb);
  std::mt19937_64 g(seed);
  for (size_t i = 0; i + 8 <= m.size(); i += 8) {
    uint64_t v = g();
    std::memcpy(m.data() + i, &v, 8);
  }
  const uint16_t h = quant::float_to_fp16(0.01f);
  const auto& ti = quant::info(t);
  const int64_t nblocks = rows * cols / ti.block_elems;
  for (int64_t k = 0; k < nblocks; ++k) {
    uint8_t* b = m.data() + k * ti.block_bytes;
    switch (t) {
      case QType::Q4_0:
      case QType::Q8_0:
        std::memcpy(b, &h, 2);
        break;
      case QType::Q4_1:
      case QType::Q4_K:
        std::memcpy(b, &h, 2), std::memcpy(b + 2, &h, 2);
        break;
      case QType::Q6_K:
        std::memcpy(b + offsetof(quant::BlockQ6_K, d), &h, 2);
        break;
      case QType::F16:
        std::memcpy(b, &h, 2);
        break;
      case QType::BF16:
        b[0] = 0, b[1] = 0x3c;
        break;
      case QType::F32: {
        float f = 0.01f;
        std::memcpy(b, &f, 4);
        break;
      }
    }
  }
  return m;
}

const char* kIsaNames[] = {"avx512-vnni", "avx2", "scalar"};

bool use_isa(benchmark::State& state, int isa) {
  for (const char* a : mp::cpu::detail::available_isas())
    if (std::string(a) == kIsaNames[isa]) {
      mp::cpu::detail::force_isa(a);
      return true;
    }
  state.SkipWithError("kernel path not available on this CPU");
  return false;
}

// Args: type id, rows, cols, threads, isa index, hot (1 = one copy of the matrix).
void BM_Matvec(benchmark::State& state) {
  const auto t = static_cast<QType>(state.range(0));
  const int64_t rows = state.range(1), cols = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  if (!use_isa(state, static_cast<int>(state.range(4)))) return;
  const bool hot = state.range(5) != 0;
  const uint64_t bytes = rows * *quant::row_bytes(t, cols);
  const size_t copies = hot ? 1 : std::max<size_t>(1, g_ws_bytes / bytes);
  std::vector<std::vector<uint8_t>> w;
  for (size_t i = 0; i < copies; ++i) w.push_back(random_weights(t, rows, cols, 7 + i));
  std::vector<float> x(static_cast<size_t>(cols)), y(static_cast<size_t>(rows));
  std::mt19937_64 g(3);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(g);
  ThreadPool pool(threads);
  size_t i = 0;
  for (auto _ : state) {
    mp::cpu::matvec(QMatrix{t, w[i].data(), rows, cols}, x.data(), y.data(), pool);
    benchmark::DoNotOptimize(y.data());
    if (++i == copies) i = 0;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.SetLabel(std::string(quant::to_string(t)) + " " + kIsaNames[state.range(4)] + (hot ? " hot" : ""));
  mp::cpu::detail::force_isa("auto");
}

// Prefill: n tokens at once. Args: type id, rows, cols, threads, n.
void BM_Matmul(benchmark::State& state) {
  const auto t = static_cast<QType>(state.range(0));
  const int64_t rows = state.range(1), cols = state.range(2), n = state.range(4);
  const int threads = static_cast<int>(state.range(3));
  auto w = random_weights(t, rows, cols, 11);
  std::vector<float> X(static_cast<size_t>(n * cols)), Y(static_cast<size_t>(n * rows));
  std::mt19937_64 g(5);
  std::normal_distribution<float> nd;
  for (auto& v : X) v = nd(g);
  ThreadPool pool(threads);
  for (auto _ : state) {
    mp::cpu::matmul(QMatrix{t, w.data(), rows, cols}, X.data(), n, Y.data(), pool);
    benchmark::DoNotOptimize(Y.data());
  }
  state.counters["GOP/s"] = benchmark::Counter(
      static_cast<double>(2 * rows * cols * n) * 1e-9 * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
  state.SetLabel(std::string(quant::to_string(t)) + " " + mp::cpu::kernel_isa());
}

// Every matvec of one SmolLM2-135M decode step, in order, on weights laid out as the model's are (30 layers
// of Q4_1 q/k/v/o/gate/up/down, a Q8_0 LM head: 98 MB): the matvec share of a token, to set against
// llama.cpp's whole token (1 / its tokens/s). Args: threads.
void BM_DecodeStep(benchmark::State& state) {
  struct Shape {
    int64_t rows, cols;
  };
  const Shape layer[] = {{576, 576},  {192, 576},  {192, 576}, {576, 576},
                         {1536, 576}, {1536, 576}, {576, 1536}};
  std::vector<std::vector<uint8_t>> w;
  std::vector<QMatrix> mats;
  for (int l = 0; l < 30; ++l)
    for (const Shape& sh : layer) {
      w.push_back(random_weights(QType::Q4_1, sh.rows, sh.cols, 100 + w.size()));
      mats.push_back(QMatrix{QType::Q4_1, w.back().data(), sh.rows, sh.cols});
    }
  w.push_back(random_weights(QType::Q8_0, 49152, 576, 99));
  mats.push_back(QMatrix{QType::Q8_0, w.back().data(), 49152, 576});
  uint64_t bytes = 0;
  for (const auto& m : mats) bytes += static_cast<uint64_t>(m.rows) * *quant::row_bytes(m.type, m.cols);
  std::vector<float> x(1536), y(49152);
  std::mt19937_64 g(3);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(g);
  ThreadPool pool(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    for (const auto& m : mats) mp::cpu::matvec(m, x.data(), y.data(), pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.SetLabel(std::string(mp::cpu::kernel_isa()) + ", " + std::to_string(bytes >> 20) + " MiB of weights");
}

// The pool's cost of one parallel_for that does nothing: what every matvec pays on top of its work.
void BM_PoolDispatch(benchmark::State& state) {
  ThreadPool pool(static_cast<int>(state.range(0)));
  int64_t sink = 0;
  for (auto _ : state) {
    pool.parallel_for(pool.threads(), [&](int64_t b, int64_t) { benchmark::DoNotOptimize(sink += b); });
  }
}

constexpr int64_t kQ4_1 = static_cast<int64_t>(QType::Q4_1), kQ8_0 = static_cast<int64_t>(QType::Q8_0),
                  kQ4_0 = static_cast<int64_t>(QType::Q4_0), kQ4_K = static_cast<int64_t>(QType::Q4_K),
                  kQ6_K = static_cast<int64_t>(QType::Q6_K), kF16 = static_cast<int64_t>(QType::F16),
                  kF32 = static_cast<int64_t>(QType::F32), kBF16 = static_cast<int64_t>(QType::BF16);

void matvec_args(benchmark::internal::Benchmark* b) {
  // The SmolLM2 shapes, both thread counts, every path.
  for (int isa = 0; isa < 3; ++isa)
    for (int threads : {1, 2}) {
      b->Args({kQ4_1, 576, 576, threads, isa, 0});
      b->Args({kQ4_1, 1536, 576, threads, isa, 0});
      b->Args({kQ4_1, 576, 1536, threads, isa, 0});
      b->Args({kQ8_0, 49152, 576, threads, isa, 0});
    }
  // Cache-resident weights, and the other types at an FFN shape, on the chosen path.
  for (int threads : {1, 2}) {
    b->Args({kQ4_1, 576, 576, threads, 0, 1});
    b->Args({kQ4_1, 1536, 576, threads, 0, 1});
    for (int64_t t : {kQ4_0, kQ4_K, kQ6_K, kF16, kBF16, kF32}) b->Args({t, 1536, 1536, threads, 0, 0});
  }
}

BENCHMARK(BM_Matvec)
    ->Apply(matvec_args)
    ->ArgNames({"type", "rows", "cols", "threads", "isa", "hot"})
    ->UseRealTime();
BENCHMARK(BM_Matmul)
    ->Args({kQ4_1, 1536, 576, 1, 64})
    ->Args({kQ4_1, 1536, 576, 2, 64})
    ->Args({kQ4_1, 1536, 576, 2, 256})
    ->ArgNames({"type", "rows", "cols", "threads", "n"})
    ->UseRealTime();
BENCHMARK(BM_DecodeStep)->Arg(1)->Arg(2)->ArgName("threads")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PoolDispatch)->Arg(1)->Arg(2)->ArgName("threads")->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  // Own flag first: --ws_mb=N, the working set the cold matvecs cycle over.
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--ws_mb=", 0) == 0)
      g_ws_bytes = static_cast<size_t>(std::strtoull(a.c_str() + 8, nullptr, 10)) << 20;
    else
      rest.push_back(argv[i]);
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
