// check_gemm(): random bf16 inputs made on the GPU, the output poisoned with NaN before every run, the
// tile GEMM and cuBLAS compared against a CPU fp64 reference.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/random.h"
#include "kernels/gemm_check.h"

namespace mp::kernels {
namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail_user("gemm check: ", what, ": ", cudaGetErrorString(e));
}

__global__ void fill_random_bf16_kernel(__nv_bfloat16* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 32;
    p[i] = __float2bfloat16_rn(float(x & 0xFFFFFF) / float(1 << 23) - 1.f);  // uniform in [-1, 1)
  }
}

template <class T>
__global__ void count_nan(const T* p, size_t n, unsigned long long* count) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float v;
    if constexpr (std::is_same_v<T, float>)
      v = p[i];
    else
      v = __bfloat162float(p[i]);
    local += isnan(v) ? 1 : 0;
  }
  if (local) atomicAdd(count, local);
}

struct dbuf {
  void* p = nullptr;
  explicit dbuf(size_t bytes) { ck(cudaMalloc(&p, bytes), "cudaMalloc"); }
  ~dbuf() { cudaFree(p); }
  dbuf(const dbuf&) = delete;
  dbuf& operator=(const dbuf&) = delete;
};

std::vector<float> to_host_bf16(const void* d, size_t n) {
  std::vector<uint16_t> b(n);
  ck(cudaMemcpy(b.data(), d, n * 2, cudaMemcpyDeviceToHost), "copy to host");
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = bf16_bits_to_float(b[i]);
  return f;
}
std::vector<double> to_host_out(const void* d, size_t n, out_type out) {
  std::vector<double> v(n);
  if (out == out_type::f32) {
    std::vector<float> f(n);
    ck(cudaMemcpy(f.data(), d, n * 4, cudaMemcpyDeviceToHost), "copy to host");
    for (size_t i = 0; i < n; ++i) v[i] = f[i];
  } else {
    std::vector<uint16_t> b(n);
    ck(cudaMemcpy(b.data(), d, n * 2, cudaMemcpyDeviceToHost), "copy to host");
    for (size_t i = 0; i < n; ++i) v[i] = bf16_bits_to_float(b[i]);
  }
  return v;
}

}  // namespace

void fill_random_bf16(void* p, size_t n, uint64_t seed) {
  fill_random_bf16_kernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
  ck(cudaGetLastError(), "random fill");
}

std::string GemmCheckResult::summary() const {
  char buf[256];
  if (ok)
    std::snprintf(buf, sizeof buf, "ok (rel err %.1e, cuBLAS %.1e)", rel_err, rel_err_cublas);
  else
    std::snprintf(buf, sizeof buf, "FAIL: rel err %.1e (cuBLAS %.1e), %zu unwritten, max diff vs cuBLAS %.1e",
                  rel_err, rel_err_cublas, unwritten, max_diff_vs_cublas);
  return buf;
}

GemmCheckResult check_gemm(int m, int n, int k, b_layout bl, out_type out, const GemmCheckOptions& opt) {
  check_gemm_shape(m, n, k);
  GemmCheckResult res;
  res.plan = describe_gemm(m, n, k, bl, out, opt.schedule);
  res.seed = opt.seed ? opt.seed : fresh_seed();
  const size_t na = size_t(m) * k, nb = size_t(n) * k, nc = size_t(m) * n;
  const size_t ob = out == out_type::f32 ? 4 : 2;
  std::vector<std::unique_ptr<dbuf>> as, bs;
  as.push_back(std::make_unique<dbuf>(na * 2));
  bs.push_back(std::make_unique<dbuf>(nb * 2));
  fill_random_bf16(as[0]->p, na, res.seed * 2);
  fill_random_bf16(bs[0]->p, nb, res.seed * 2 + 1000);
  ck(cudaGetLastError(), "random fill");
  dbuf c(nc * ob), cref(nc * ob);
  ck(cudaMemset(c.p, 0xff, nc * ob), "poison");  // 0xffff.. is NaN in bf16 and fp32
  ck(cudaMemset(cref.p, 0xff, nc * ob), "poison");
  gemm_bf16(as[0]->p, bs[0]->p, c.p, m, n, k, bl, out, nullptr, opt.schedule);
  ck(cudaGetLastError(), "tile GEMM launch");
  if (opt.cublas) gemm_bf16_cublas(as[0]->p, bs[0]->p, cref.p, m, n, k, bl, out, nullptr);
  ck(cudaDeviceSynchronize(), "tile GEMM run");

  // Correctness against the CPU fp64 reference: every element for small shapes; for large ones a
  // 64 x 64 grid of random rows and columns (only those rows of A and rows / columns of B are fetched).
  const bool full = (long long)m * n * k <= opt.full_reference_limit;
  std::vector<int> rows, cols;
  std::vector<double> want, got, cub;
  if (full) {
    auto ha = to_host_bf16(as[0]->p, na), hb = to_host_bf16(bs[0]->p, nb);
    want = gemm_reference_cpu(ha, hb, m, n, k, bl);
    got = to_host_out(c.p, nc, out);
    if (opt.cublas) cub = to_host_out(cref.p, nc, out);
  } else {
    std::mt19937_64 gen(res.seed);
    for (int i = 0; i < 64; ++i) rows.push_back(int(gen() % m)), cols.push_back(int(gen() % n));
    const auto* A = static_cast<const uint16_t*>(as[0]->p);
    const auto* B = static_cast<const uint16_t*>(bs[0]->p);
    std::vector<float> ar(size_t(64) * k), bc(size_t(64) * k);
    std::vector<uint16_t> tmp(k);
    for (int i = 0; i < 64; ++i) {
      ck(cudaMemcpy(tmp.data(), A + size_t(rows[i]) * k, size_t(k) * 2, cudaMemcpyDeviceToHost),
         "copy A row");
      for (int kk = 0; kk < k; ++kk) ar[size_t(i) * k + kk] = bf16_bits_to_float(tmp[kk]);
      if (bl == b_layout::nk)
        ck(cudaMemcpy(tmp.data(), B + size_t(cols[i]) * k, size_t(k) * 2, cudaMemcpyDeviceToHost),
           "copy B row");
      else
        ck(cudaMemcpy2D(tmp.data(), 2, B + cols[i], size_t(n) * 2, 2, k, cudaMemcpyDeviceToHost),
           "copy B column");
      for (int kk = 0; kk < k; ++kk) bc[size_t(i) * k + kk] = bf16_bits_to_float(tmp[kk]);
    }
    want = gemm_reference_cpu(ar, bc, 64, 64, k, b_layout::nk);
    auto fetch = [&](const void* d, int r, int col) {
      if (out == out_type::f32) {
        float v;
        ck(cudaMemcpy(&v, static_cast<const float*>(d) + size_t(r) * n + col, 4, cudaMemcpyDeviceToHost),
           "copy C");
        return double(v);
      }
      uint16_t v;
      ck(cudaMemcpy(&v, static_cast<const uint16_t*>(d) + size_t(r) * n + col, 2, cudaMemcpyDeviceToHost),
         "copy C");
      return double(bf16_bits_to_float(v));
    };
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < 64; ++j) {
        got.push_back(fetch(c.p, rows[i], cols[j]));
        if (opt.cublas) cub.push_back(fetch(cref.p, rows[i], cols[j]));
      }
  }
  double num = 0, den = 0, numc = 0, maxref = 0, md = 0;
  for (size_t s = 0; s < want.size(); ++s) {
    const double w = want[s], g = got[s];
    num += (g - w) * (g - w);
    den += w * w;
    maxref = std::max(maxref, std::fabs(w));
    if (opt.cublas) {
      numc += (cub[s] - w) * (cub[s] - w);
      md = std::max(md, std::fabs(g - cub[s]));
    }
  }
  res.checked = want.size();
  res.rel_err = std::isnan(num) ? INFINITY : std::sqrt(num / std::max(den, 1e-300));
  res.rel_err_cublas = std::sqrt(numc / std::max(den, 1e-300));
  res.max_diff_vs_cublas = md / std::max(maxref, 1e-300);
  // Every element written: none may still hold the NaN poison.
  {
    dbuf cnt(8);
    ck(cudaMemset(cnt.p, 0, 8), "memset");
    auto* cp = static_cast<unsigned long long*>(cnt.p);
    if (out == out_type::f32)
      count_nan<<<1024, 256>>>(static_cast<const float*>(c.p), nc, cp);
    else
      count_nan<<<1024, 256>>>(static_cast<const __nv_bfloat16*>(c.p), nc, cp);
    unsigned long long h = 0;
    ck(cudaMemcpy(&h, cp, 8, cudaMemcpyDeviceToHost), "NaN count");
    res.unwritten = h;
  }
  const double tol = out == out_type::f32 ? 1e-4 : 1e-2;
  res.ok = res.unwritten == 0 && res.rel_err <= tol && std::isfinite(res.rel_err);

  return res;
}

GemmCheckResult check_gemm_chain(int m, int n, int steps, b_layout bl, const GemmSchedule& sched) {
  check_gemm_shape(m, n, n);
  MP_USER_CHECK(steps >= 1, "gemm chain: at least one step");
  GemmCheckResult res;
  res.plan = describe_gemm(m, n, n, bl, out_type::bf16, sched);
  res.seed = fresh_seed();
  const size_t nx = size_t(m) * n, nw = size_t(n) * n;
  std::vector<std::unique_ptr<dbuf>> xs, ws;
  for (int i = 0; i <= steps; ++i) xs.push_back(std::make_unique<dbuf>(nx * 2));
  for (int i = 0; i < steps; ++i) {
    ws.push_back(std::make_unique<dbuf>(nw * 2));
    fill_random_bf16(ws[i]->p, nw, res.seed * 2 + 1000 + i);
  }
  fill_random_bf16(xs[0]->p, nx, res.seed * 2);
  for (int i = 1; i <= steps; ++i) ck(cudaMemset(xs[i]->p, 0xff, nx * 2), "poison");
  ck(cudaDeviceSynchronize(), "chain set-up");
  for (int i = 0; i < steps; ++i)  // back to back, no synchronisation
    gemm_bf16(xs[i]->p, ws[i]->p, xs[i + 1]->p, m, n, n, bl, out_type::bf16, nullptr, sched);
  ck(cudaDeviceSynchronize(), "chain run");
  res.ok = true;
  for (int i = 0; i < steps; ++i) {
    const auto x = to_host_bf16(xs[i]->p, nx), w = to_host_bf16(ws[i]->p, nw);
    const auto want = gemm_reference_cpu(x, w, m, n, n, bl);
    const auto got = to_host_out(xs[i + 1]->p, nx, out_type::bf16);
    double num = 0, den = 0;
    size_t nan = 0;
    for (size_t e = 0; e < nx; ++e) {
      if (std::isnan(got[e])) ++nan;
      num += (got[e] - want[e]) * (got[e] - want[e]);
      den += want[e] * want[e];
    }
    const double err = nan ? INFINITY : std::sqrt(num / std::max(den, 1e-300));
    res.rel_err = std::max(res.rel_err, err);
    res.unwritten += nan;
    res.checked += nx;
  }
  res.ok = res.unwritten == 0 && std::isfinite(res.rel_err) && res.rel_err <= 1e-2;
  return res;
}

}  // namespace mp::kernels
