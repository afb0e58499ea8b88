// The quantized matvec / matmul driver: checks the arguments, quantizes the activations once per call,
// splits the rows over the thread pool, and calls the kernels of the ISA chosen at run time.
#include "backends/cpu/quant_matmul.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "backends/cpu/quant_kernels.h"
#include "core/error.h"

namespace mp::cpu {
namespace {

using quant::QType;

#if defined(__x86_64__)
// From CPUID directly: clang before 15 does not accept "f16c" in __builtin_cpu_supports.
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

const qk::Kernels* best_kernels() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (qk::kernels_avx512() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
      __builtin_cpu_supports("fma") && has_f16c())
    return qk::kernels_avx512();
  if (qk::kernels_avx2() && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c())
    return qk::kernels_avx2();
#endif
  return &qk::kernels_scalar();
}

std::atomic<const qk::Kernels*> g_forced{nullptr};

const qk::Kernels& kernels() {
  static const qk::Kernels* best = best_kernels();
  const qk::Kernels* f = g_forced.load(std::memory_order_relaxed);
  return f ? *f : *best;
}

// What the activation row of one token is quantized to, and the kernel that pairs with the weight type.
enum class Act { Q8, Q8K, F32 };
struct Plan {
  Act act;
  qk::DotFn dot;
  qk::Dot4Fn dot4;     // nullptr when the type has no 4-token kernel on this path
  int64_t block;       // elements per weight block (and per activation block)
  int64_t act_bytes;   // bytes of one token's activation row
  uint64_t row_bytes;  // bytes of one weight row
};

Plan make_plan(const QMatrix& W, const qk::Kernels& k, const char* op) {
  MP_USER_CHECK(W.rows >= 0 && W.cols >= 0, op, ": a ", W.rows, " x ", W.cols,
                " weight matrix has a negative dimension");
  const auto* ti = quant::qtype_info(static_cast<uint32_t>(W.type)) ? &quant::info(W.type) : nullptr;
  MP_USER_CHECK(ti, op, ": weight type id ", static_cast<uint32_t>(W.type),
                " is not one of F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K");
  auto rb = quant::row_bytes(W.type, W.cols);
  MP_USER_CHECK(rb.has_value(), op, ": cols=", W.cols, " is not a multiple of the ", ti->name, " block of ",
                ti->block_elems, " elements");
  MP_USER_CHECK(W.rows == 0 || W.cols == 0 || W.data != nullptr, op, ": the ", W.rows, " x ", W.cols, " ",
                ti->name, " weight matrix has no data (null pointer)");
  MP_USER_CHECK(*rb == 0 || static_cast<uint64_t>(W.rows) <= UINT64_MAX / *rb, op, ": a ", W.rows, " x ",
                W.cols, " ", ti->name, " weight matrix has more bytes than a 64-bit size holds");
  Plan p{Act::Q8, nullptr, nullptr, ti->block_elems, 0, *rb};
  switch (W.type) {
    case QType::Q4_0:
      p.dot = k.dot_q4_0, p.dot4 = k.dot4_q4_0;
      break;
    case QType::Q4_1:
      p.dot = k.dot_q4_1, p.dot4 = k.dot4_q4_1;
      break;
    case QType::Q8_0:
      p.dot = k.dot_q8_0, p.dot4 = k.dot4_q8_0;
      break;
    case QType::Q4_K:
      p.dot = k.dot_q4_k;
      p.act = Act::Q8K;
      break;
    case QType::Q6_K:
      p.dot = k.dot_q6_k;
      p.act = Act::Q8K;
      break;
    case QType::F32:
      p.dot = k.dot_f32;
      p.act = Act::F32;
      break;
    case QType::F16:
      p.dot = k.dot_f16;
      p.act = Act::F32;
      break;
    case QType::BF16:
      p.dot = k.dot_bf16;
      p.act = Act::F32;
      break;
  }
  const int64_t nb = W.cols / p.block;
  p.act_bytes = p.act == Act::Q8    ? nb * static_cast<int64_t>(sizeof(qk::BlockQ8))
                : p.act == Act::Q8K ? nb * static_cast<int64_t>(sizeof(qk::BlockQ8K))
                                    : W.cols * 4;
  return p;
}

// Per-thread scratch for the quantized activations, kept between calls (a decode step makes hundreds).
struct Scratch {
  void* p = nullptr;
  size_t n = 0;
  ~Scratch() { ::operator delete(p, std::align_val_t(64)); }
  void* get(size_t bytes) {
    if (bytes > n) {
      ::operator delete(p, std::align_val_t(64));
      p = nullptr;
      n = 0;
      p = ::operator new(bytes, std::align_val_t(64));
      n = bytes;
    }
    return p;
  }
};
thread_local Scratch t_scratch;

// Quantizes (or, for float weights, points at) the activation rows of n tokens.
const uint8_t* prepare_activations(const Plan& p, const qk::Kernels& k, const float* X, int64_t n,
                                   int64_t cols, ThreadPool& pool) {
  if (p.act == Act::F32) return reinterpret_cast<const uint8_t*>(X);
  auto* buf = static_cast<uint8_t*>(t_scratch.get(static_cast<size_t>(n * p.act_bytes)));
  const int64_t nb = cols / p.block;
  auto quantize = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (p.act == Act::Q8)
        k.quantize_q8(X + t * cols, reinterpret_cast<qk::BlockQ8*>(buf + t * p.act_bytes), nb);
      else
        k.quantize_q8k(X + t * cols, reinterpret_cast<qk::BlockQ8K*>(buf + t * p.act_bytes), nb);
    }
  };
  if (n >= 4 * pool.threads())
    pool.parallel_for(n, quantize);
  else
    quantize(0, n);
  return buf;
}

// Below this many weight bytes a matrix is done on the caller: waking the workers costs more.
constexpr uint64_t kMinParallelBytes = 32 * 1024;
// Rows of one group: their weights stay in L1 while every token of a token block passes over them.
constexpr int64_t kRowGroup = 8;
constexpr int64_t kTokenBlock = 64;
// A matvec streams each weight once, from L3 or DRAM. The hardware prefetchers alone leave one core's dot
// products waiting on that stream; asking for the lines this far ahead of the row being computed cut the
// matvec time of a SmolLM2 decode step by about a third (bench_quant_matmul's BM_DecodeStep, 1 thread:
// 4 KiB and 8 KiB ahead measured alike, 1 KiB about half the gain).
constexpr uint64_t kPrefetchBytes = 4096;

// Asks the cache for `bytes` bytes of w from offset `from` on, not past `end`.
inline void prefetch(const uint8_t* w, uint64_t from, uint64_t end, uint64_t bytes) {
  const uint64_t to = std::min(end, from + bytes);
  for (uint64_t o = from; o < to; o += 64) __builtin_prefetch(w + o);
}

void run(const QMatrix& W, const float* X, int64_t n, float* Y, ThreadPool& pool, const char* op) {
  const qk::Kernels& k = kernels();
  Plan p = make_plan(W, k, op);
  MP_USER_CHECK(n >= 0, op, ": n=", n, " tokens must not be negative");
  if (W.rows == 0 || n == 0) return;
  MP_USER_CHECK(
      n <= INT64_MAX / 4 / std::max(W.rows, W.cols) && (p.act_bytes == 0 || n <= INT64_MAX / p.act_bytes), op,
      ": n=", n, " tokens of a ", W.rows, " x ", W.cols,
      " matrix make inputs or outputs larger than a 64-bit size holds");
  MP_USER_CHECK(Y != nullptr, op, ": the output is a null pointer");
  if (W.cols == 0) {
    std::memset(Y, 0, static_cast<size_t>(n * W.rows) * sizeof(float));
    return;
  }
  MP_USER_CHECK(X != nullptr, op, ": the input is a null pointer");
  {  // The output is written while float weights still read the input.
    const auto x0 = reinterpret_cast<uintptr_t>(X),
               x1 = x0 + static_cast<uintptr_t>(n * W.cols) * sizeof(float);
    const auto y0 = reinterpret_cast<uintptr_t>(Y),
               y1 = y0 + static_cast<uintptr_t>(n * W.rows) * sizeof(float);
    MP_USER_CHECK(x1 <= y0 || y1 <= x0, op, ": the output overlaps the input; give it its own buffer");
  }
  const uint8_t* act = prepare_activations(p, k, X, n, W.cols, pool);
  const int64_t nb = W.cols / p.block;
  const int64_t dot_len = p.act == Act::F32 ? W.cols : nb;
  const auto* w = static_cast<const uint8_t*>(W.data);
  const int64_t rows = W.rows;
  const uint64_t total_bytes = static_cast<uint64_t>(rows) * p.row_bytes;
  auto body = [&](int64_t g0, int64_t g1) {
    const int64_t r0 = g0 * kRowGroup, r1 = std::min(rows, g1 * kRowGroup);
    for (int64_t t0 = 0; t0 < n; t0 += kTokenBlock) {
      const int64_t t1 = std::min(n, t0 + kTokenBlock);
      for (int64_t rg = r0; rg < r1; rg += kRowGroup) {
        const int64_t rge = std::min(r1, rg + kRowGroup);
        int64_t t = t0;
        if (p.dot4)  // 4 tokens per pass over a weight row: its blocks are unpacked once for the 4
          for (; t + 4 <= t1; t += 4)
            for (int64_t r = rg; r < rge; ++r) {
              if (t == t0) prefetch(w, r * p.row_bytes + kPrefetchBytes, total_bytes, p.row_bytes);
              float out[4];
              p.dot4(w + static_cast<uint64_t>(r) * p.row_bytes, act + t * p.act_bytes, p.act_bytes, dot_len,
                     out);
              for (int i = 0; i < 4; ++i) Y[(t + i) * rows + r] = out[i];
            }
        for (; t < t1; ++t) {
          const uint8_t* a = act + t * p.act_bytes;
          float* y = Y + t * rows;
          for (int64_t r = rg; r < rge; ++r) {
            prefetch(w, r * p.row_bytes + kPrefetchBytes, total_bytes, p.row_bytes);
            y[r] = p.dot(w + static_cast<uint64_t>(r) * p.row_bytes, a, dot_len);
          }
        }
      }
    }
  };
  const int64_t groups = (rows + kRowGroup - 1) / kRowGroup;
  if (static_cast<uint64_t>(rows) * p.row_bytes * static_cast<uint64_t>(n) < kMinParallelBytes)
    body(0, groups);
  else
    pool.parallel_for(groups, body);
}

}  // namespace

void matvec(const QMatrix& W, const float* x, float* y, ThreadPool& pool) { run(W, x, 1, y, pool, "matvec"); }

void matmul(const QMatrix& W, const float* X, int64_t n, float* Y, ThreadPool& pool) {
  run(W, X, n, Y, pool, "matmul");
}

const char* kernel_isa() { return kernels().name; }

namespace detail {

std::vector<const char*> available_isas() {
  std::vector<const char*> v;
  const qk::Kernels* best = best_kernels();
  if (best == qk::kernels_avx512()) v.push_back(qk::kernels_avx512()->name);
  if (best == qk::kernels_avx512() || best == qk::kernels_avx2())
    if (qk::kernels_avx2()) v.push_back(qk::kernels_avx2()->name);
  v.push_back(qk::kernels_scalar().name);
  return v;
}

void force_isa(const char* isa) {
  MP_USER_CHECK(isa != nullptr, "force_isa: null ISA name");
  std::string s = isa;
  if (s == "auto") {
    g_forced.store(nullptr);
    return;
  }
  const qk::Kernels* cands[] = {qk::kernels_avx512(), qk::kernels_avx2(), &qk::kernels_scalar()};
  for (const char* a : available_isas())
    if (s == a)
      for (const qk::Kernels* c : cands)
        if (c && s == c->name) {
          g_forced.store(c);
          return;
        }
  std::string list;
  for (const char* a : available_isas()) list += std::string(list.empty() ? "" : ", ") + a;
  fail_user("force_isa: '", s, "' is not a kernel path this CPU runs (", list, ", or auto)");
}

}  // namespace detail
}  // namespace mp::cpu
