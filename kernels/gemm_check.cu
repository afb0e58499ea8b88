// check_gemm(): random bf16 inputs made on the GPU, the output poisoned with NaN before every run, the
// tile GEMM and cuBLAS compared against a CPU fp64 reference, then both timed with CUDA events over
// rotating input buffers (so small problems are not timed out of L2).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/power.h"
#include "core/random.h"
#include "kernels/gemm_check.h"

namespace mp::kernels {
namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail_user("gemm check: ", what, ": ", cudaGetErrorString(e));
}

__global__ void fill_random_bf16(__nv_bfloat16* p, size_t n, uint64_t seed) {
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

// What one variant's samples measured: per-launch times (ms), and with a power probe the energy and the
// SM clock over its batches.
struct VariantSamples {
  std::vector<float> ms;
  double energy_mj = 0, busy_ms = 0;  // energy counted over its batches, and their length
  long long launches = 0;
  double clock_sum = 0;  // SM clock readings (MHz) taken while its batches ran
  int clocks = 0;
  double median() {
    if (ms.empty()) return 0;
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }
};

// Two variants' samples, interleaved (ABAB...) so that both see the same temperature and power state.
// Each sample is one batch of `reps` launches that issue_first / issue_second put on `stream`, between two
// events. With a power probe, the GPU's energy counter is read before and after each batch, and its SM
// clock every ms or so while the batch runs (long batches; short ones are over before a reading).
template <class F, class G>
std::pair<VariantSamples, VariantSamples> interleaved_samples(F&& issue_first, G&& issue_second,
                                                              bool with_second, int reps, int samples,
                                                              cudaStream_t stream, const PowerProbe* probe) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  VariantSamples v1, v2;
  auto sample = [&](auto& issue, VariantSamples& out) {
    const auto before = probe ? probe->energy_mj() : std::nullopt;
    cudaEventRecord(e0, stream);
    issue();
    cudaEventRecord(e1, stream);
    if (probe)  // clock readings while the batch runs, one a ms
      while (cudaEventQuery(e1) == cudaErrorNotReady) {
        if (auto c = probe->sm_clock_mhz()) out.clock_sum += *c, ++out.clocks;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    ck(cudaEventSynchronize(e1), "timing");
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    out.ms.push_back(ms / reps);
    const auto after = probe ? probe->energy_mj() : std::nullopt;
    if (before && after) {
      out.energy_mj += *after - *before;
      out.busy_ms += ms;
      out.launches += reps;
    }
  };
  for (int s = 0; s < samples; ++s) {
    sample(issue_first, v1);
    if (with_second) sample(issue_second, v2);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return {std::move(v1), std::move(v2)};
}

// Direct launches on the default stream: f(r, stream) issues launch r of a batch.
template <class F, class G>
std::pair<VariantSamples, VariantSamples> samples_direct(F&& first, G&& second, bool with_second, int reps,
                                                         int samples, const PowerProbe* probe) {
  return interleaved_samples(
      [&] {
        for (int r = 0; r < reps; ++r) first(r, nullptr);
      },
      [&] {
        for (int r = 0; r < reps; ++r) second(r, nullptr);
      },
      with_second, reps, samples, nullptr, probe);
}

// Each variant's batch captured once into a CUDA graph on `stream` (f(r, stream) issues launch r) and
// replayed per sample. Returns false, leaving no capture open and no error pending, if a capture or
// instantiation fails.
template <class F, class G>
bool samples_graphs(F&& first, G&& second, bool with_second, int reps, int samples, cudaStream_t stream,
                    const PowerProbe* probe, std::pair<VariantSamples, VariantSamples>& out) {
  auto capture = [&](auto& f, cudaGraphExec_t& exec) {
    exec = nullptr;
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed) != cudaSuccess) return false;
    for (int r = 0; r < reps; ++r) f(r, stream);
    cudaGraph_t graph = nullptr;
    const bool ok = cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph != nullptr &&
                    cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    if (graph) cudaGraphDestroy(graph);
    if (!ok) {
      exec = nullptr;
      cudaGetLastError();  // clear the failed capture's error
    }
    return ok;
  };
  cudaGraphExec_t g1 = nullptr, g2 = nullptr;
  if (!capture(first, g1) || (with_second && !capture(second, g2))) {
    if (g1) cudaGraphExecDestroy(g1);
    return false;
  }
  auto replay = [&](cudaGraphExec_t g) { ck(cudaGraphLaunch(g, stream), "graph launch"); };
  // One replay each first: the graphs' own first launch (upload) stays out of the samples.
  replay(g1);
  if (g2) replay(g2);
  ck(cudaStreamSynchronize(stream), "graph warm-up");
  out = interleaved_samples([&] { replay(g1); }, [&] { replay(g2); }, g2 != nullptr, reps, samples, stream,
                            probe);
  cudaGraphExecDestroy(g1);
  if (g2) cudaGraphExecDestroy(g2);
  return true;
}

}  // namespace

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
  // Enough input copies that one pass over them exceeds the L2 several times over.
  const size_t in_bytes = (na + nb) * 2;
  const int copies = opt.time ? int(std::clamp<size_t>((512ull << 20) / in_bytes, 1, 8)) : 1;
  std::vector<std::unique_ptr<dbuf>> as, bs;
  for (int i = 0; i < copies; ++i) {
    as.push_back(std::make_unique<dbuf>(na * 2));
    bs.push_back(std::make_unique<dbuf>(nb * 2));
    fill_random_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(as[i]->p), na, res.seed * 2 + i);
    fill_random_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(bs[i]->p), nb, res.seed * 2 + 1000 + i);
  }
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

  if (opt.time) {
    const double flop = 2.0 * m * n * k;
    // A batch of launches per sample, about opt.batch_ms of work, rotating over the input copies.
    MP_USER_CHECK(opt.batch_ms > 0 && opt.batch_ms <= 2000, "gemm check: batch_ms must be in (0, 2000], got ",
                  opt.batch_ms);
    const int reps = int(std::clamp(opt.batch_ms * 1e-3 / (flop / 700e12), 1.0, 20000.0));
    res.batch_launches = reps;
    // Launch r of a batch, on `st`.
    auto ours = [&](int r, cudaStream_t st) {
      gemm_bf16(as[r % copies]->p, bs[r % copies]->p, c.p, m, n, k, bl, out, st, opt.schedule);
    };
    auto theirs = [&](int r, cudaStream_t st) {
      gemm_bf16_cublas(as[r % copies]->p, bs[r % copies]->p, cref.p, m, n, k, bl, out, st);
    };
    // Direct launches go to the default stream; graphs are captured on one stream of their own (created
    // once: the GEMM keeps a workspace per stream).
    static cudaStream_t graph_stream = nullptr;
    if (opt.graphs && !graph_stream)
      ck(cudaStreamCreateWithFlags(&graph_stream, cudaStreamNonBlocking), "timing stream");
    const cudaStream_t warm = opt.graphs ? graph_stream : nullptr;
    for (int w = 0; w < 10; ++w) {  // warm-up (module load, handle creation, per-stream workspace, clocks)
      ours(w, warm);
      if (opt.cublas) theirs(w, warm);
    }
    ck(cudaDeviceSynchronize(), "warm-up");
    // The power probe (NVML) for this GPU, when present: energy per launch and the clock it ran at.
    std::optional<PowerProbe> probe;
    if (opt.power) {
      int dev = 0;
      char bus[32] = "";
      if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetPCIBusId(bus, sizeof bus, dev) == cudaSuccess)
        probe.emplace(bus);
      res.power_note = !probe ? "no PCI bus id for the GPU" : probe->available() ? "" : probe->why();
      if (probe && !probe->available()) probe.reset();
    }
    const PowerProbe* pp = probe ? &*probe : nullptr;
    std::pair<VariantSamples, VariantSamples> vs;
    const bool graphed =
        opt.graphs && samples_graphs(ours, theirs, opt.cublas, reps, opt.samples, graph_stream, pp, vs);
    if (!graphed) vs = samples_direct(ours, theirs, opt.cublas, reps, opt.samples, pp);
    res.timing_method = graphed ? "CUDA graphs" : "direct launches";
    auto power_of = [](const VariantSamples& v, GemmCheckResult::Power& p) {
      if (v.launches > 0 && v.busy_ms > 0) {
        p.mj_per_launch = v.energy_mj / double(v.launches);
        p.watts = v.energy_mj / v.busy_ms;
      }
      if (v.clocks > 0) p.sm_mhz = v.clock_sum / v.clocks;
    };
    power_of(vs.first, res.ours_power);
    power_of(vs.second, res.cublas_power);
    const double o = vs.first.median(), t = vs.second.median();
    res.ours_ms = o;
    res.ours_tflops = flop / (res.ours_ms * 1e-3) / 1e12;
    if (opt.cublas) {
      res.cublas_ms = t;
      res.cublas_tflops = flop / (res.cublas_ms * 1e-3) / 1e12;
    }
    ck(cudaGetLastError(), "timed runs");
  }
  if (opt.trace) {
    // Room for every block a launch can have (one per work item at most, as many as the SMs or more).
    const auto gpu = query_gpu();
    const int sms = gpu ? gpu->sm_count : 0;
    const GemmPlan p = plan_gemm(m, n, k, opt.schedule, sms);
    const int blocks = std::max(p.tiles * p.splits * p.cluster, sms);
    dbuf tb(size_t(blocks) * gemm_trace_points * 8);
    ck(cudaMemset(tb.p, 0, size_t(blocks) * gemm_trace_points * 8), "trace clear");
    GemmSchedule ts = opt.schedule;
    ts.trace = static_cast<unsigned long long*>(tb.p);
    ts.trace_blocks = blocks;
    gemm_bf16(as[0]->p, bs[0]->p, c.p, m, n, k, bl, out, nullptr, opt.schedule);  // the one before
    gemm_bf16(as[copies > 1 ? 1 : 0]->p, bs[copies > 1 ? 1 : 0]->p, c.p, m, n, k, bl, out, nullptr, ts);
    ck(cudaDeviceSynchronize(), "traced run");
    std::vector<unsigned long long> h(size_t(blocks) * gemm_trace_points);
    ck(cudaMemcpy(h.data(), tb.p, h.size() * 8, cudaMemcpyDeviceToHost), "trace copy");
    for (int b = 0; b < blocks; ++b)  // launched blocks wrote their start
      if (h[size_t(b) * gemm_trace_points] != 0)
        res.trace.insert(res.trace.end(), h.begin() + size_t(b) * gemm_trace_points,
                         h.begin() + size_t(b + 1) * gemm_trace_points);
  }
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
    fill_random_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(ws[i]->p), nw, res.seed * 2 + 1000 + i);
  }
  fill_random_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(xs[0]->p), nx, res.seed * 2);
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
