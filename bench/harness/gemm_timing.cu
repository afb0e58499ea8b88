// time_gemm(): the tile GEMM and cuBLAS timed with CUDA events over rotating input buffers (so small
// problems are not timed out of L2), interleaved sample by sample, optionally as CUDA graphs and with the
// GPU's energy counter and SM clock read around each sample.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "bench/harness/gemm_timing.h"
#include "bench/harness/power.h"
#include "core/device.h"
#include "core/error.h"
#include "kernels/gemm_check.h"

namespace mp::bench {
namespace {
using namespace mp::kernels;

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail_user("gemm timing: ", what, ": ", cudaGetErrorString(e));
}

struct dbuf {
  void* p = nullptr;
  explicit dbuf(size_t bytes) { ck(cudaMalloc(&p, bytes), "cudaMalloc"); }
  ~dbuf() { cudaFree(p); }
  dbuf(const dbuf&) = delete;
  dbuf& operator=(const dbuf&) = delete;
};

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

GemmTiming time_gemm(int m, int n, int k, b_layout bl, out_type out, const GemmTimingOptions& opt) {
  check_gemm_shape(m, n, k);
  MP_USER_CHECK(opt.samples >= 1, "gemm timing: samples must be at least 1, got ", opt.samples);
  GemmTiming res;
  const size_t na = size_t(m) * k, nb = size_t(n) * k, nc = size_t(m) * n;
  const size_t ob = out == out_type::f32 ? 4 : 2;
  // Enough input copies that one pass over them exceeds the L2 several times over.
  const size_t in_bytes = (na + nb) * 2;
  const int copies = int(std::clamp<size_t>((512ull << 20) / in_bytes, 1, 8));
  std::vector<std::unique_ptr<dbuf>> as, bs;
  for (int i = 0; i < copies; ++i) {
    as.push_back(std::make_unique<dbuf>(na * 2));
    bs.push_back(std::make_unique<dbuf>(nb * 2));
    fill_random_bf16(as[i]->p, na, opt.seed * 2 + i);
    fill_random_bf16(bs[i]->p, nb, opt.seed * 2 + 1000 + i);
  }
  dbuf c(nc * ob), cref(nc * ob);
  const double flop = 2.0 * m * n * k;
  // A batch of launches per sample, about opt.batch_ms of work, rotating over the input copies.
  MP_USER_CHECK(opt.batch_ms > 0 && opt.batch_ms <= 2000, "gemm timing: batch_ms must be in (0, 2000], got ",
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
  auto power_of = [](const VariantSamples& v, GemmTiming::Power& p) {
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
  if (opt.trace) {
    // Room for every block a launch can have (one per work item at most, as many as the SMs or more).
    const auto gpu = query_gpu();
    const int sms = gpu ? gpu->sm_count : 0;
    const GemmPlan p = plan_gemm(m, n, k, opt.schedule, sms);
    const int blocks = std::max(p.tiles * p.splits, sms);
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

}  // namespace mp::bench
