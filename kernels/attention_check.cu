// Check and time the attention kernels on fresh random inputs: the routine the CLI, the GPU tests and the
// benchmark share. Outputs are poisoned with NaN bytes before each run; the comparison is against the CPU
// fp64 reference (attention_common.cpp), every row for small shapes, a sample of rows otherwise.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/gemm_check.h"

namespace mp::kernels {
namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail_user("attention check: ", what, ": ", cudaGetErrorString(e));
}

struct dbuf {
  void* p = nullptr;
  explicit dbuf(size_t bytes) { ck(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "cudaMalloc"); }
  ~dbuf() { cudaFree(p); }
  dbuf(const dbuf&) = delete;
  dbuf& operator=(const dbuf&) = delete;
};

float bf16_to_float(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::vector<float> download_bf16(const void* p, size_t n) {
  std::vector<uint16_t> raw(n);
  ck(cudaMemcpy(raw.data(), p, n * 2, cudaMemcpyDeviceToHost), "copy to host");
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = bf16_to_float(raw[i]);
  return f;
}
std::vector<float> download_f32(const void* p, size_t n) {
  std::vector<float> f(n);
  ck(cudaMemcpy(f.data(), p, n * 4, cudaMemcpyDeviceToHost), "copy to host");
  return f;
}
size_t count_nan(const std::vector<float>& v) {
  return size_t(std::count_if(v.begin(), v.end(), [](float x) { return std::isnan(x); }));
}
uint64_t fresh_seed() {
  return uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) * 0x9E3779B97F4A7C15ull | 1;
}

// The rows checked when the shape is too large for all: a few (batch, head) pairs, and in each the first
// and last rows, the rows around the 64- and 128-row tile edges and rows spread between.
std::vector<size_t> sample_rows(const AttentionShape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<size_t> rows;
  const int pairs = 6;
  for (int n = 0; n < pairs; ++n) {
    const int b = n == 0 ? 0 : n == 1 ? s.batch - 1 : int(rng() % uint64_t(s.batch));
    const int h = n == 0 ? 0 : n == 1 ? s.heads - 1 : int(rng() % uint64_t(s.heads));
    std::vector<int> is = {0, 1, 63, 64, 127, 128, s.seq_q / 2, s.seq_q - 2, s.seq_q - 1};
    for (int x = 0; x < 16; ++x) is.push_back(int(rng() % uint64_t(s.seq_q)));
    for (int i : is)
      if (i >= 0 && i < s.seq_q) rows.push_back((size_t(b) * s.heads + h) * s.seq_q + size_t(i));
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

// max |got - ref| / max |ref| over the given elements (inf when a compared value is NaN).
struct err_acc {
  double diff = 0, ref = 0;
  void add(double got, double want) {
    diff = std::isnan(got) ? INFINITY : std::max(diff, std::abs(got - want));
    ref = std::max(ref, std::abs(want));
  }
  double rel() const { return ref > 0 ? diff / ref : diff; }
};

// The tolerance each bf16 output is held to, relative to its largest reference value: bf16 keeps 8 bits of
// mantissa (a rounding of 2^-9 relative), and the forward also rounds P to bf16 before P V; 2e-2 leaves room
// for both on every element, where a wrong mask, tile or head shows as errors of order 1.
constexpr double rel_tolerance = 2e-2;
// LSE is computed in fp32 from exact bf16 products: an absolute bound.
constexpr double lse_tolerance = 1e-3;

}  // namespace

AttentionCheckResult check_attention(const AttentionShape& s, attention_pass pass,
                                     const AttentionCheckOptions& opt) {
  pass == attention_pass::decode ? check_attention_decode_shape(s) : check_attention_shape(s);
  AttentionCheckResult res;
  res.seed = opt.seed ? opt.seed : fresh_seed();
  res.tolerance = rel_tolerance;
  const double scale = opt.scale > 0 ? opt.scale : default_attention_scale(s.dim);
  const size_t nq = s.q_elems(), nkv = s.kv_elems(), nl = s.lse_elems();
  dbuf q(nq * 2), k(nkv * 2), v(nkv * 2), o(nq * 2), lse(nl * 4);
  fill_random_bf16(q.p, nq, res.seed * 4);
  fill_random_bf16(k.p, nkv, res.seed * 4 + 1);
  fill_random_bf16(v.p, nkv, res.seed * 4 + 2);
  ck(cudaMemset(o.p, 0xFF, nq * 2), "poison O");
  ck(cudaMemset(lse.p, 0xFF, nl * 4), "poison LSE");
  ck(cudaDeviceSynchronize(), "random inputs");
  if (pass == attention_pass::decode) {
    // With programmatic dependent launch, three launches back to back, so that each may be scheduled while
    // the one before ends: they share the workspace and the combine's counters, which the overlap must
    // leave intact (the result is the same as one launch's).
    for (int i = 0; i < (opt.decode.pdl ? 3 : 1); ++i)
      attention_decode(s, q.p, k.p, v.p, o.p, static_cast<float*>(lse.p), float(scale), opt.causal, nullptr,
                       opt.decode);
  } else
    attention_forward(s, q.p, k.p, v.p, o.p, static_cast<float*>(lse.p), float(scale), opt.causal, nullptr);
  ck(cudaDeviceSynchronize(), "the attention kernel");
  const auto hq = download_bf16(q.p, nq), hk = download_bf16(k.p, nkv), hv = download_bf16(v.p, nkv);
  const auto ho = download_bf16(o.p, nq), hl = download_f32(lse.p, nl);
  res.unwritten = count_nan(ho) + count_nan(hl);

  const long long work = 1ll * s.batch * s.heads * s.seq_q * s.seq_kv * s.dim;
  const bool full = work <= opt.full_reference_limit;
  const std::vector<size_t> rows = full ? std::vector<size_t>{} : sample_rows(s, res.seed);
  std::vector<double> ro(nq, 0.0), rl(nl, 0.0);
  attention_reference_forward(s, hq.data(), hk.data(), hv.data(), scale, opt.causal, ro.data(), rl.data(),
                              rows);
  err_acc eo;
  double lse_err = 0;
  auto compare_row = [&](size_t r) {
    for (int c = 0; c < s.dim; ++c) eo.add(ho[r * s.dim + c], ro[r * s.dim + c]);
    const double got = hl[r], want = rl[r];
    if (std::isinf(want) || std::isinf(got))
      lse_err = std::max(lse_err, got == want ? 0.0 : INFINITY);
    else
      lse_err = std::max(lse_err, std::isnan(got) ? INFINITY : std::abs(got - want));
  };
  if (full)
    for (size_t r = 0; r < nl; ++r) compare_row(r);
  else
    for (size_t r : rows) compare_row(r);
  res.checked_rows = full ? nl : rows.size();
  res.max_err_o = eo.rel();
  res.max_err_lse = lse_err;
  res.ok = res.unwritten == 0 && res.max_err_o <= rel_tolerance && res.max_err_lse <= lse_tolerance;
  if (pass != attention_pass::backward) return res;

  // The backward from the forward's O and LSE (the kernel's inputs), with dO random.
  dbuf d_o(nq * 2), dq(nq * 2), dk(nkv * 2), dv(nkv * 2);
  fill_random_bf16(d_o.p, nq, res.seed * 4 + 3);
  ck(cudaMemset(dq.p, 0xFF, nq * 2), "poison dQ");
  ck(cudaMemset(dk.p, 0xFF, nkv * 2), "poison dK");
  ck(cudaMemset(dv.p, 0xFF, nkv * 2), "poison dV");
  ck(cudaDeviceSynchronize(), "random dO");
  attention_backward(s, q.p, k.p, v.p, o.p, static_cast<const float*>(lse.p), d_o.p, dq.p, dk.p, dv.p,
                     float(scale), opt.causal, nullptr, opt.backward_impl);
  ck(cudaDeviceSynchronize(), "the attention backward");
  const auto hdo = download_bf16(d_o.p, nq), hdq = download_bf16(dq.p, nq), hdk = download_bf16(dk.p, nkv),
             hdv = download_bf16(dv.p, nkv);
  res.unwritten += count_nan(hdq) + count_nan(hdk) + count_nan(hdv);
  err_acc eq, ek, ev;
  if (full) {  // every gradient element against the fp64 backward (its own fp64 forward inside)
    std::vector<double> rq(nq), rk(nkv), rv(nkv);
    attention_reference_backward(s, hq.data(), hk.data(), hv.data(), hdo.data(), scale, opt.causal, rq.data(),
                                 rk.data(), rv.data());
    for (size_t i = 0; i < nq; ++i) eq.add(hdq[i], rq[i]);
    for (size_t i = 0; i < nkv; ++i) {
      ek.add(hdk[i], rk[i]);
      ev.add(hdv[i], rv[i]);
    }
  } else {
    // Sampled: dQ of the sampled rows and dK, dV of sampled keys, in fp64 from the inputs and the
    // forward's LSE and O (whose sampled rows were checked above against fp64): the gradient of the
    // forward the kernel was given, which is what a backward computes.
    const int d = s.dim, g = s.group();
    const int off = s.seq_kv - s.seq_q;
    auto sees = [&](int i, int j) { return !opt.causal || j <= i + off; };
    auto dot = [&](const float* a, const float* b) {
      double acc = 0;
      for (int c = 0; c < d; ++c) acc += double(a[c]) * double(b[c]);
      return acc;
    };
    auto delta = [&](size_t row) { return dot(&hdo[row * d], &ho[row * d]); };
    for (size_t row : rows) {
      const int b = int(row / (size_t(s.seq_q) * s.heads)), h = int(row / size_t(s.seq_q) % size_t(s.heads));
      const int i = int(row % size_t(s.seq_q));
      const size_t kv0 = (size_t(b) * s.kv_heads + h / g) * s.seq_kv;
      const double di = delta(row);
      std::vector<double> acc(size_t(d), 0.0);
      for (int j = 0; j < s.seq_kv; ++j) {
        if (!sees(i, j)) continue;
        const double p = std::exp(scale * dot(&hq[row * d], &hk[(kv0 + j) * d]) - double(hl[row]));
        const double ds = p * (dot(&hdo[row * d], &hv[(kv0 + j) * d]) - di);
        for (int c = 0; c < d; ++c) acc[size_t(c)] += scale * ds * double(hk[(kv0 + j) * d + c]);
      }
      for (int c = 0; c < d; ++c) eq.add(hdq[row * d + c], acc[size_t(c)]);
    }
    std::mt19937_64 rng(res.seed + 7);
    for (int n = 0; n < 24; ++n) {
      const int b = int(rng() % uint64_t(s.batch)), hk_ = int(rng() % uint64_t(s.kv_heads));
      const int j = n == 0 ? 0 : n == 1 ? s.seq_kv - 1 : int(rng() % uint64_t(s.seq_kv));
      const size_t key = (size_t(b) * s.kv_heads + hk_) * s.seq_kv + j;
      std::vector<double> ak(size_t(d), 0.0), av(size_t(d), 0.0);
      for (int h = hk_ * g; h < (hk_ + 1) * g; ++h)
        for (int i = 0; i < s.seq_q; ++i) {
          if (!sees(i, j)) continue;
          const size_t row = (size_t(b) * s.heads + h) * s.seq_q + i;
          const double p = std::exp(scale * dot(&hq[row * d], &hk[key * d]) - double(hl[row]));
          const double ds = p * (dot(&hdo[row * d], &hv[key * d]) - delta(row));
          for (int c = 0; c < d; ++c) {
            ak[size_t(c)] += scale * ds * double(hq[row * d + c]);
            av[size_t(c)] += p * double(hdo[row * d + c]);
          }
        }
      for (int c = 0; c < d; ++c) {
        ek.add(hdk[key * d + c], ak[size_t(c)]);
        ev.add(hdv[key * d + c], av[size_t(c)]);
      }
    }
  }
  res.max_err_dq = eq.rel(), res.max_err_dk = ek.rel(), res.max_err_dv = ev.rel();
  res.ok = res.ok && res.unwritten == 0 && res.max_err_dq <= rel_tolerance &&
           res.max_err_dk <= rel_tolerance && res.max_err_dv <= rel_tolerance;
  return res;
}

AttentionTiming time_attention(const AttentionShape& s, attention_pass pass, bool causal, int samples,
                               double batch_ms, attention_backward_impl impl,
                               const AttentionDecodeConfig& decode) {
  pass == attention_pass::decode ? check_attention_decode_shape(s) : check_attention_shape(s);
  MP_USER_CHECK(samples >= 1 && samples <= 10000, "attention timing: samples must be 1 to 10000, got ",
                samples);
  MP_USER_CHECK(batch_ms > 0 && batch_ms <= 5000, "attention timing: batch_ms must be in (0, 5000], got ",
                batch_ms);
  const size_t nq = s.q_elems(), nkv = s.kv_elems(), nl = s.lse_elems();
  const float scale = float(default_attention_scale(s.dim));
  dbuf q(nq * 2), k(nkv * 2), v(nkv * 2), o(nq * 2), lse(nl * 4);
  fill_random_bf16(q.p, nq, 11);
  fill_random_bf16(k.p, nkv, 12);
  fill_random_bf16(v.p, nkv, 13);
  std::unique_ptr<dbuf> d_o, dq, dk, dv;
  if (pass == attention_pass::backward) {
    d_o = std::make_unique<dbuf>(nq * 2), dq = std::make_unique<dbuf>(nq * 2);
    dk = std::make_unique<dbuf>(nkv * 2), dv = std::make_unique<dbuf>(nkv * 2);
    fill_random_bf16(d_o->p, nq, 14);
    attention_forward(s, q.p, k.p, v.p, o.p, static_cast<float*>(lse.p), scale, causal, nullptr);
  }
  auto once = [&] {
    if (pass == attention_pass::decode)
      attention_decode(s, q.p, k.p, v.p, o.p, static_cast<float*>(lse.p), scale, causal, nullptr, decode);
    else if (pass == attention_pass::forward)
      attention_forward(s, q.p, k.p, v.p, o.p, static_cast<float*>(lse.p), scale, causal, nullptr);
    else
      attention_backward(s, q.p, k.p, v.p, o.p, static_cast<const float*>(lse.p), d_o->p, dq->p, dk->p, dv->p,
                         scale, causal, nullptr, impl);
  };
  cudaEvent_t e0, e1;
  ck(cudaEventCreate(&e0), "event");
  ck(cudaEventCreate(&e1), "event");
  auto batch = [&](int n) {
    ck(cudaEventRecord(e0), "event");
    for (int i = 0; i < n; ++i) once();
    ck(cudaEventRecord(e1), "event");
    ck(cudaEventSynchronize(e1), "the timed launches");
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, e0, e1), "event time");
    return double(ms);
  };
  batch(3);  // warm-up: workspaces, tensor-map encoding, clocks
  const double one = std::max(1e-3, batch(3) / 3);
  AttentionTiming t;
  t.batch_launches = int(std::clamp(batch_ms / one, 1.0, 20000.0));
  batch(t.batch_launches);  // the clock settles at the batch's power draw before the timed samples
  std::vector<double> per;
  for (int i = 0; i < samples; ++i) per.push_back(batch(t.batch_launches) / t.batch_launches);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(per.begin(), per.end());
  t.ms = per[per.size() / 2];
  t.tflops = attention_flops(s, pass, causal) / (t.ms * 1e-3) / 1e12;
  return t;
}

}  // namespace mp::kernels
