// The quantized CPU matvec / matmul against fp64 dot products of quant::dequantize_row, for every weight
// type on every kernel path this CPU runs; and the ThreadPool they run on.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/quant_matmul.h"
#include "core/error.h"
#include "core/quant.h"
#include "core/thread_pool.h"

namespace {

using mp::ThreadPool;
using mp::cpu::QMatrix;
using mp::quant::QType;
namespace quant = mp::quant;

// ---------------------------------------------------------------------------------------------------------
// ThreadPool

TEST(ThreadPool, EveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 4, 7, 100, 1001}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<int> calls{0};
      pool.parallel_for(n, [&](int64_t b, int64_t e) {
        EXPECT_LT(b, e);  // no empty chunk is handed out
        calls.fetch_add(1);
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i)
        EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n=" << n << " i=" << i;
      EXPECT_LE(calls.load(), std::min<int64_t>(n, 4 * threads)) << "n=" << n << " threads=" << threads;
      if (n == 0) {
        EXPECT_EQ(calls.load(), 0);
      }
    }
  }
}

TEST(ThreadPool, ChunksAreContiguousAndBalanced) {
  for (int64_t n : {5, 10, 100, 1003}) {
    ThreadPool pool(3);
    std::vector<std::pair<int64_t, int64_t>> got;
    std::mutex mu;
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      std::lock_guard<std::mutex> lk(mu);
      got.emplace_back(b, e);
    });
    std::sort(got.begin(), got.end());
    ASSERT_FALSE(got.empty());
    EXPECT_LE(got.size(), static_cast<size_t>(std::min<int64_t>(n, 3 * 4)));
    int64_t lo = n, hi = 0, next = 0;
    for (auto [b, e] : got) {
      EXPECT_EQ(b, next) << "n=" << n;  // contiguous, no overlap, no gap
      next = e;
      lo = std::min(lo, e - b);
      hi = std::max(hi, e - b);
    }
    EXPECT_EQ(next, n);
    EXPECT_LE(hi - lo, 1) << "n=" << n;  // near-equal
  }
}

TEST(ThreadPool, UsesTheWorkers) {
  // A chunk that waits until another thread has run a chunk: only a working pool gets past it.
  ThreadPool pool(2);
  std::mutex mu;
  std::set<std::thread::id> ids;
  std::atomic<int> started{0};
  pool.parallel_for(2, [&](int64_t, int64_t) {
    started.fetch_add(1);
    {
      std::lock_guard<std::mutex> lk(mu);
      ids.insert(std::this_thread::get_id());
    }
    while (started.load() < 2) std::this_thread::yield();
  });
  EXPECT_EQ(ids.size(), 2u);
}

TEST(ThreadPool, ExceptionReachesTheCaller) {
  ThreadPool pool(3);
  for (int64_t thrower : {0, 1, 2}) {  // whichever thread runs the throwing chunk
    std::atomic<int> done{0};
    try {
      pool.parallel_for(3, [&](int64_t b, int64_t) {
        if (b == thrower) throw std::runtime_error("chunk " + std::to_string(b));
        done.fetch_add(1);
      });
      ADD_FAILURE() << "no exception from chunk " << thrower;
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "chunk " + std::to_string(thrower));
    }
    EXPECT_EQ(done.load(), 2);  // the other chunks still ran
  }
  // When every chunk throws, exactly one of their exceptions comes back, and the pool stays usable.
  try {
    pool.parallel_for(3, [](int64_t b, int64_t) { throw std::runtime_error("chunk " + std::to_string(b)); });
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("chunk ", 0), 0u);
  }
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
}

TEST(ThreadPool, NestedLoopRunsInline) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallel_for(10, [&](int64_t b2, int64_t e2) {
        for (int64_t j = b2; j < e2; ++j) sum += i * 10 + j;
      });
  });
  EXPECT_EQ(sum.load(), 780);  // sum of 0..39
}

TEST(ThreadPool, ManyShortLoops) {
  ThreadPool pool(2);
  int64_t total = 0;
  std::vector<int64_t> part(2);
  for (int it = 0; it < 2000; ++it) {
    part.assign(2, 0);
    pool.parallel_for(2, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) part[static_cast<size_t>(i)] = it + i;
    });
    total += part[0] + part[1];
  }
  EXPECT_EQ(total, 2 * (1999 * 2000 / 2) + 2000);
}

TEST(ThreadPool, BadArguments) {
  try {
    ThreadPool p(0);
    ADD_FAILURE();
  } catch (const mp::user_error& e) {
    EXPECT_NE(std::string(e.what()).find("threads=0 must be at least 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ThreadPool(-3), mp::user_error);
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(-1, [](int64_t, int64_t) {}), mp::user_error);
  EXPECT_GE(ThreadPool::default_threads(), 1);
}

// ---------------------------------------------------------------------------------------------------------
// Quantized matvec / matmul

// A random half in +-[lo, hi) (a scale or min of a block).
uint16_t random_half(std::mt19937_64& g, float lo, float hi) {
  std::uniform_real_distribution<float> mag(lo, hi);
  float v = mag(g) * ((g() & 1) ? -1.0f : 1.0f);
  return quant::float_to_fp16(v);
}

// `rows` rows of random blocks of type t: every byte of the quantized fields random (so every nibble, every
// 6-bit scale and every int8 appears), the scales random halves.
std::vector<uint8_t> random_matrix(QType t, int64_t rows, int64_t cols, std::mt19937_64& g) {
  const uint64_t rb = *quant::row_bytes(t, cols);
  std::vector<uint8_t> m(rows * rb);
  for (auto& b : m) b = static_cast<uint8_t>(g());
  const int64_t nblocks = rows * cols / quant::info(t).block_elems;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t k = 0; k < nblocks; ++k) {
    switch (t) {
      case QType::F32: {
        float v = u(g);
        std::memcpy(m.data() + 4 * k, &v, 4);
        break;
      }
      case QType::F16: {
        uint16_t h = quant::float_to_fp16(u(g));
        std::memcpy(m.data() + 2 * k, &h, 2);
        break;
      }
      case QType::BF16: {
        float v = u(g);
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        uint16_t h = static_cast<uint16_t>(bits >> 16);
        std::memcpy(m.data() + 2 * k, &h, 2);
        break;
      }
      case QType::Q4_0:
        reinterpret_cast<quant::BlockQ4_0*>(m.data())[k].d = random_half(g, 0.01f, 0.2f);
        break;
      case QType::Q4_1: {
        auto& b = reinterpret_cast<quant::BlockQ4_1*>(m.data())[k];
        b.d = random_half(g, 0.01f, 0.2f);
        b.m = random_half(g, 0.0f, 1.0f);
        break;
      }
      case QType::Q8_0:
        reinterpret_cast<quant::BlockQ8_0*>(m.data())[k].d = random_half(g, 0.001f, 0.02f);
        break;
      case QType::Q4_K: {
        auto& b = reinterpret_cast<quant::BlockQ4_K*>(m.data())[k];
        b.d = random_half(g, 0.001f, 0.01f);
        b.dmin = random_half(g, 0.001f, 0.01f);
        break;
      }
      case QType::Q6_K:
        reinterpret_cast<quant::BlockQ6_K*>(m.data())[k].d = random_half(g, 0.0001f, 0.002f);
        break;
    }
  }
  return m;
}

bool is_float_type(QType t) { return t == QType::F32 || t == QType::F16 || t == QType::BF16; }

// The largest |error| that the activation quantization and fp32 accumulation allow for one row: each
// activation of a block of B (32, or 256 for K-quants) is off by at most half its step max|x|/127, so the
// dot is off by at most sum over blocks of (max|x| / 254) * sum |w| in that block; fp32 accumulation adds
// a few ulps of sum |w||x| per block summed.
double error_bound(QType t, const float* w, const float* x, int64_t cols) {
  double abs_sum = 0.0, quant_err = 0.0;
  for (int64_t c = 0; c < cols; ++c) abs_sum += std::fabs(static_cast<double>(w[c]) * x[c]);
  int64_t ab = 0;
  if (!is_float_type(t)) ab = (t == QType::Q4_K || t == QType::Q6_K) ? 256 : 32;
  if (ab) {
    for (int64_t b = 0; b < cols; b += ab) {
      double amax = 0.0, wsum = 0.0;
      for (int64_t c = b; c < b + ab; ++c) {
        amax = std::max(amax, std::fabs(static_cast<double>(x[c])));
        wsum += std::fabs(static_cast<double>(w[c]));
      }
      quant_err += amax / 254.0 * wsum;
    }
  }
  const double terms = ab ? static_cast<double>(cols / ab) + 8.0 : static_cast<double>(cols) + 8.0;
  return quant_err * 1.001 + 2.0 * terms * 6e-8 * abs_sum + 1e-30;
}

struct Shape {
  int64_t rows, cols;
};

std::vector<Shape> shapes_for(QType t) {
  // Float rows of any length, so every vector tail is exercised.
  if (is_float_type(t)) return {{1, 1}, {7, 45}, {37, 83}, {130, 576}, {3, 7}, {2, 129}};
  const int64_t b = quant::info(t).block_elems;
  // Rows not a multiple of the row group (8) or of the thread count; one shape large enough to be split
  // over the threads.
  return {{1, b}, {7, 2 * b}, {37, 3 * b}, {130, b == 256 ? 512 : 576}};
}

// Activations: normal values; with `outliers`, one all-zero block (a zero scale) and one block dominated by
// a single large value (most of its quantized values round to 0) when the row is long enough.
std::vector<float> random_activations(int64_t cols, std::mt19937_64& g, bool outliers = true) {
  std::vector<float> x(static_cast<size_t>(cols));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(g);
  if (outliers && cols >= 3 * 32) {
    std::fill(x.begin() + 32, x.begin() + 64, 0.0f);
    x[70] = 300.0f;
  }
  return x;
}

constexpr QType kTypes[] = {QType::F32,  QType::F16,  QType::BF16, QType::Q4_0,
                            QType::Q4_1, QType::Q8_0, QType::Q4_K, QType::Q6_K};

class QuantMatmul : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { mp::cpu::detail::force_isa(GetParam()); }
  void TearDown() override { mp::cpu::detail::force_isa("auto"); }
};

TEST_P(QuantMatmul, MatvecAgainstDequantizedReference) {
  ASSERT_STREQ(mp::cpu::kernel_isa(), GetParam());
  std::mt19937_64 g(1234);
  ThreadPool pool(2);
  for (QType t : kTypes) {
    for (Shape s : shapes_for(t))
      for (bool outliers : {false, true}) {
        auto wq = random_matrix(t, s.rows, s.cols, g);
        const uint64_t rb = *quant::row_bytes(t, s.cols);
        std::vector<float> x = random_activations(s.cols, g, outliers);
        std::vector<float> y(static_cast<size_t>(s.rows), std::nanf(""));  // poisoned
        mp::cpu::matvec(QMatrix{t, wq.data(), s.rows, s.cols}, x.data(), y.data(), pool);
        std::vector<float> w(static_cast<size_t>(s.cols));
        for (int64_t r = 0; r < s.rows; ++r) {
          quant::dequantize_row(t, wq.data() + r * rb, w.data(), s.cols);
          double ref = 0.0, abs_sum = 0.0;
          for (int64_t c = 0; c < s.cols; ++c) {
            ref += static_cast<double>(w[c]) * x[c];
            abs_sum += std::fabs(static_cast<double>(w[c]) * x[c]);
          }
          const double bound = error_bound(t, w.data(), x.data(), s.cols);
          if (!outliers) {
            ASSERT_LT(bound, 0.05 * abs_sum + 1e-20);  // the check means something
          }
          ASSERT_NEAR(y[r], ref, bound)
              << quant::to_string(t) << " " << s.rows << "x" << s.cols << " row " << r;
        }
      }
  }
}

TEST_P(QuantMatmul, MatmulOfNTokens) {
  std::mt19937_64 g(99);
  ThreadPool pool(3);
  for (QType t : kTypes) {
    const Shape s = shapes_for(t)[2];
    auto wq = random_matrix(t, s.rows, s.cols, g);
    const uint64_t rb = *quant::row_bytes(t, s.cols);
    const QMatrix W{t, wq.data(), s.rows, s.cols};
    for (int64_t n = 1; n <= 5; ++n) {
      std::vector<float> X;
      for (int64_t tk = 0; tk < n; ++tk) {
        auto x = random_activations(s.cols, g);
        X.insert(X.end(), x.begin(), x.end());
      }
      std::vector<float> Y(static_cast<size_t>(n * s.rows), std::nanf(""));
      mp::cpu::matmul(W, X.data(), n, Y.data(), pool);
      std::vector<float> w(static_cast<size_t>(s.cols)), y1(static_cast<size_t>(s.rows));
      for (int64_t tk = 0; tk < n; ++tk) {
        const float* x = X.data() + tk * s.cols;
        mp::cpu::matvec(W, x, y1.data(), pool);
        for (int64_t r = 0; r < s.rows; ++r) {
          quant::dequantize_row(t, wq.data() + r * rb, w.data(), s.cols);
          double ref = 0.0;
          for (int64_t c = 0; c < s.cols; ++c) ref += static_cast<double>(w[c]) * x[c];
          const float got = Y[static_cast<size_t>(tk * s.rows + r)];
          ASSERT_NEAR(got, ref, error_bound(t, w.data(), x, s.cols))
              << quant::to_string(t) << " n=" << n << " token " << tk << " row " << r;
          // A token of a matmul is the matvec of that token, to the bit.
          ASSERT_EQ(got, y1[static_cast<size_t>(r)]) << quant::to_string(t) << " n=" << n << " row " << r;
        }
      }
    }
  }
}

// Every row is computed by one thread from start to end, so the thread count (more threads than rows
// included) and concurrent callers sharing a pool do not change a bit of the result.
TEST_P(QuantMatmul, SameBitsForAnyThreadCountAndConcurrentCallers) {
  std::mt19937_64 g(7);
  for (QType t : {QType::Q4_1, QType::Q8_0, QType::Q4_K, QType::F16}) {
    const int64_t cols = quant::info(t).block_elems == 256 ? 512 : 576;
    for (int64_t rows : {3, 200}) {
      auto wq = random_matrix(t, rows, cols, g);
      const QMatrix W{t, wq.data(), rows, cols};
      auto x = random_activations(cols, g);
      ThreadPool one(1), many(5);
      std::vector<float> y1(static_cast<size_t>(rows)), y5(static_cast<size_t>(rows), std::nanf(""));
      mp::cpu::matvec(W, x.data(), y1.data(), one);
      mp::cpu::matvec(W, x.data(), y5.data(), many);
      ASSERT_EQ(0, std::memcmp(y1.data(), y5.data(), y1.size() * sizeof(float))) << quant::to_string(t);
      // Two threads of the caller's own, each looping over matvecs on the shared pool.
      std::vector<float> ya(static_cast<size_t>(rows)), yb(static_cast<size_t>(rows));
      bool ok_a = true, ok_b = true;
      auto loop = [&](std::vector<float>& y, bool& ok) {
        for (int i = 0; i < 20 && ok; ++i) {
          std::fill(y.begin(), y.end(), std::nanf(""));
          mp::cpu::matvec(W, x.data(), y.data(), many);
          ok = std::memcmp(y1.data(), y.data(), y.size() * sizeof(float)) == 0;
        }
      };
      std::thread ta(loop, std::ref(ya), std::ref(ok_a)), tb(loop, std::ref(yb), std::ref(ok_b));
      ta.join();
      tb.join();
      EXPECT_TRUE(ok_a && ok_b) << quant::to_string(t) << " rows=" << rows;
    }
  }
}

std::vector<const char*> isas() { return mp::cpu::detail::available_isas(); }
INSTANTIATE_TEST_SUITE_P(Isa, QuantMatmul, ::testing::ValuesIn(isas()),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           std::string s = i.param;
                           for (auto& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

TEST(QuantMatmulIsa, DispatchChoosesTheBest) {
  auto v = isas();
  ASSERT_FALSE(v.empty());
  EXPECT_STREQ(v.back(), "scalar");
  EXPECT_STREQ(mp::cpu::kernel_isa(), v.front());
  try {
    mp::cpu::detail::force_isa("sse9");
    ADD_FAILURE();
  } catch (const mp::user_error& e) {
    EXPECT_NE(std::string(e.what()).find("'sse9' is not a kernel path"), std::string::npos) << e.what();
  }
  EXPECT_STREQ(mp::cpu::kernel_isa(), v.front());
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const mp::user_error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(QuantMatmulErrors, BadArgumentsAreUserErrors) {
  ThreadPool pool(1);
  std::vector<uint8_t> buf(4096);
  std::vector<float> x(512), y(512);
  EXPECT_NE(error_of([&] {
              mp::cpu::matvec(QMatrix{QType::Q4_1, buf.data(), 4, 100}, x.data(), y.data(), pool);
            }).find("cols=100 is not a multiple of the Q4_1 block of 32 elements"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              mp::cpu::matvec(QMatrix{QType::Q4_K, buf.data(), 1, 32}, x.data(), y.data(), pool);
            }).find("cols=32 is not a multiple of the Q4_K block of 256"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              mp::cpu::matvec(QMatrix{QType::Q8_0, nullptr, 4, 32}, x.data(), y.data(), pool);
            }).find("has no data"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              mp::cpu::matvec(QMatrix{QType::Q8_0, buf.data(), -1, 32}, x.data(), y.data(), pool);
            }).find("negative dimension"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              mp::cpu::matmul(QMatrix{QType::Q8_0, buf.data(), 2, 32}, x.data(), -2, y.data(), pool);
            }).find("n=-2 tokens must not be negative"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              mp::cpu::matvec(QMatrix{static_cast<QType>(7), buf.data(), 2, 32}, x.data(), y.data(), pool);
            }).find("weight type id 7 is not one of"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              mp::cpu::matvec(QMatrix{QType::F32, buf.data(), 2, 32}, nullptr, y.data(), pool);
            }).find("input is a null pointer"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              mp::cpu::matvec(QMatrix{QType::Q8_0, buf.data(), INT64_MAX / 8, 64}, x.data(), y.data(), pool);
            }).find("more bytes than a 64-bit size holds"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] {
        mp::cpu::matmul(QMatrix{QType::Q8_0, buf.data(), 1LL << 40, 32}, x.data(), 1LL << 30, y.data(), pool);
      }).find("larger than a 64-bit size holds"),
      std::string::npos);
  EXPECT_NE(error_of([&] {
              mp::cpu::matvec(QMatrix{QType::F32, buf.data(), 32, 32}, x.data(), x.data() + 16, pool);
            }).find("output overlaps the input"),
            std::string::npos);
  // Empty shapes are fine: nothing to do, or zeros for zero columns.
  y.assign(512, 1.0f);
  mp::cpu::matvec(QMatrix{QType::Q4_1, buf.data(), 3, 0}, x.data(), y.data(), pool);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_EQ(y[3], 1.0f);
  mp::cpu::matvec(QMatrix{QType::Q4_1, nullptr, 0, 32}, x.data(), y.data(), pool);
}

}  // namespace
