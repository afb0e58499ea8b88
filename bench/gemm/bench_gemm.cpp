// bf16 GEMM benchmark: the tile-layer GEMM against cuBLAS in the same process, on square and LLM
// projection shapes. Each row is checked against CPU fp64 (sampled) before it is timed; times are medians
// of CUDA-event samples over rotating inputs, interleaved with cuBLAS (bench/harness). Prints one line per
// row as it finishes and the table last. Also the GEMM's tuning and trace tool: --shape picks shapes,
// --schedule overrides the plan, --power reads energy and clocks, --trace prints a launch's timeline,
// --data-only / --compute-only time the loads or the wgmma alone.
//   usage: bench_gemm --help
// Batches of 1 s by default: the H200 runs these GEMMs at its 700 W cap, where the clock lags the power
// drawn; in 200 ms batches the mean SM clock was 1.58 GHz against 1.50 GHz in 1 s batches, and the
// 4096^3 ratio of repeated medians ranged 0.986-1.012 against 1.008-1.010 (bench/RESULTS.md, GEMM).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "bench/harness/gemm_timing.h"
#include "core/device.h"
#include "core/error.h"
#include "kernels/gemm_check.h"

using namespace mp::kernels;

namespace {
// A row that runs for minutes has a kernel that never finishes: say which, keep the rows already printed,
// and exit instead of hanging until the caller's timeout.
std::atomic<long long> row_started_ms{0};
std::atomic<bool> bench_done{false};
char row_name[160];
long long now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
void watch_rows(int limit_s) {
  while (!bench_done.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const long long t0 = row_started_ms.load();
    if (t0 > 0 && now_ms() - t0 > limit_s * 1000ll) {
      std::printf("  row %s: FAIL, not finished after %d s (a kernel that never completes?); stopping\n",
                  row_name, limit_s);
      std::fflush(stdout);
      std::_Exit(1);
    }
  }
}

// --trace: each timeline point's spread over the blocks, in microseconds from the first block's start.
void print_trace(const std::vector<unsigned long long>& t) {
  constexpr int P = gemm_trace_points;
  const size_t blocks = t.size() / P;
  if (blocks == 0) {
    std::cout << "trace:  no block recorded a timeline\n";
    return;
  }
  unsigned long long t0 = ~0ull;
  for (size_t b = 0; b < blocks; ++b) t0 = std::min(t0, t[b * P]);
  std::printf("trace:  one launch after another of the same GEMM, %zu blocks; us from the first block's "
              "start\n        %-38s %8s %8s %8s %8s\n",
              blocks, "point", "blocks", "min", "median", "max");
  for (int p = 0; p < gemm_trace_times; ++p) {
    std::vector<double> us;
    for (size_t b = 0; b < blocks; ++b)
      if (t[b * P + p] >= t0) us.push_back(double(t[b * P + p] - t0) * 1e-3);
    if (us.empty()) continue;  // e.g. no split tiles: no fixup
    std::sort(us.begin(), us.end());
    std::printf("        %-38s %8zu %8.2f %8.2f %8.2f\n", gemm_trace_point_names[p], us.size(), us.front(),
                us[us.size() / 2], us.back());
  }
  // K steps (the block's last item, SM cycles; c: consumer stage full, w: its wgmma wait done, p: the
  // producer has the stage): per step, the consumer's wait for data (w[i-1] -> c[i]) and its wgmma
  // issue and wait (c[i] -> w[i]); the producer's cycles per step (p[i-1] -> p[i]) and how long after the
  // producer had a stage the consumer found it full (p[i] -> c[i]). Medians over blocks of the per-block
  // mean over steps 2.. .
  constexpr int S0 = gemm_trace_times + 1, NS = gemm_trace_step_count;
  std::vector<double> cols[4];
  int steps_seen = 0;
  for (size_t b = 0; b < blocks; ++b) {
    const unsigned long long* s = &t[b * P + S0];
    int n = 0;
    while (n < NS && s[3 * n] != 0 && s[3 * n + 1] != 0 && s[3 * n + 2] != 0) ++n;
    if (n < 2) continue;
    double sum[4] = {0, 0, 0, 0};
    for (int i = 1; i < n; ++i) {
      const double c = double(s[3 * i]), w = double(s[3 * i + 1]), p = double(s[3 * i + 2]);
      sum[0] += c - double(s[3 * i - 2]);
      sum[1] += w - c;
      sum[2] += p - double(s[3 * i - 1]);
      sum[3] += c - p;
    }
    for (int k = 0; k < 4; ++k) cols[k].push_back(sum[k] / (n - 1));
    steps_seen = std::max(steps_seen, n);
  }
  if (cols[0].empty()) return;
  std::printf("        K steps 2..%d of the last item, SM cycles per step (median block; min, max):\n", steps_seen);
  const char* names[4] = {"consumer: waiting for the stage to fill", "consumer: wgmma issue and wait",
                          "producer: cycles per step", "producer has the stage -> consumer sees it full"};
  for (int k = 0; k < 4; ++k) {
    std::sort(cols[k].begin(), cols[k].end());
    std::printf("          %-48s %8.0f  (%.0f, %.0f)\n", names[k], cols[k][cols[k].size() / 2], cols[k].front(),
                cols[k].back());
  }
}


const char* usage =
    "usage: bench_gemm [--quick] [--shape M,N,K ...] [--layout nk|kn|both] [--out bf16|f32]\n"
    "                  [--samples N] [--batch-ms T] [--graphs] [--schedule KEY=VALUE,...]\n"
    "                  [--power] [--trace] [--data-only | --compute-only]\n"
    "  --quick          three shapes (2048^3, 4096^3, 128 x 4096 x 4096) instead of all seven\n"
    "  --shape M,N,K    time this shape instead (repeatable)\n"
    "  --layout L       nk (A*B^T, default), kn (A*B) or both\n"
    "  --out TYPE       bf16 (default) or f32 output\n"
    "  --samples N      batches per variant, the median taken (default 3)\n"
    "  --batch-ms T     work per batch in ms, 0 < T <= 2000 (default 1000)\n"
    "  --graphs         launch each batch as one replayed CUDA graph\n"
    "  --schedule S     override the plan (the keys of metapipe gemm --help)\n"
    "  --power          energy per launch, watts and SM clock (NVML) for ours and cuBLAS\n"
    "  --trace          one launch's timeline per block (builds with -DMP_PIPELINE_TRACE=ON)\n"
    "  --data-only      diagnostic: the loads alone, no wgmma (nothing computed, check skipped)\n"
    "  --compute-only   diagnostic: the wgmma alone, no loads (nothing computed, check skipped)\n";

int bad_usage(const std::string& why) {
  std::fprintf(stderr, "bench_gemm: %s\n%s", why.c_str(), usage);
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  bool quick = false, graphs = false, power = false, trace = false;
  std::string layout = "nk", out = "bf16";
  int samples = 3;
  double batch_ms = 1000.0;
  GemmSchedule sched;
  struct S {
    int m, n, k;
    std::string what;
  };
  std::vector<S> asked;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--help" || a == "-h") {
      std::printf("%s", usage);
      return 0;
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--graphs") {
      graphs = true;
    } else if (a == "--power") {
      power = true;
    } else if (a == "--trace") {
      trace = true;
    } else if (a == "--data-only") {
      sched.data_only = true;
    } else if (a == "--compute-only") {
      sched.compute_only = true;
    } else if (a == "--layout" && has_value) {
      layout = argv[++i];
      if (layout != "nk" && layout != "kn" && layout != "both") return bad_usage("--layout is nk, kn or both");
    } else if (a == "--out" && has_value) {
      out = argv[++i];
      if (out != "bf16" && out != "f32") return bad_usage("--out is bf16 or f32");
    } else if (a == "--samples" && has_value) {
      samples = std::atoi(argv[++i]);
      if (samples < 1 || samples > 1000) return bad_usage("--samples is 1 to 1000");
    } else if (a == "--batch-ms" && has_value) {
      batch_ms = std::atof(argv[++i]);
      if (!(batch_ms > 0 && batch_ms <= 2000)) return bad_usage("--batch-ms is a number of ms in (0, 2000]");
    } else if (a == "--shape" && has_value) {
      // three whole numbers up to 2^30 (check_gemm_shape then says what else is wrong with them)
      const std::string v = argv[++i];
      long long d[3] = {0, 0, 0};
      size_t at = 0;
      bool ok = true;
      for (int j = 0; j < 3 && ok; ++j) {
        size_t end = at;
        while (end < v.size() && v[end] >= '0' && v[end] <= '9') ++end;
        ok = end > at && end - at <= 10 && (j == 2 ? end == v.size() : end < v.size() && v[end] == ',');
        if (ok) d[j] = std::stoll(v.substr(at, end - at)), ok = d[j] <= (1ll << 30);
        at = end + 1;
      }
      if (!ok) return bad_usage("--shape is M,N,K (whole numbers up to 2^30), got '" + v + "'");
      asked.push_back({int(d[0]), int(d[1]), int(d[2]), "asked"});
    } else if (a == "--schedule" && has_value) {
      try {
        apply_schedule(argv[++i], sched);
      } catch (const mp::user_error& e) {
        return bad_usage(std::string("--schedule: ") + e.what());
      }
    } else {
      return bad_usage("unknown option or missing value: '" + a + "'");
    }
  }
  if (sched.data_only && sched.compute_only) return bad_usage("--data-only and --compute-only exclude each other");
  const bool diagnostic = sched.data_only || sched.compute_only;
  auto gpu = mp::query_gpu();
  if (!gpu || !mp::gpu_is_hopper(*gpu)) {
    std::printf("bench_gemm: skipped, no Hopper GPU (%s)\n",
                gpu ? gpu->name.c_str() : mp::gpu_absent_reason().c_str());
    return 0;
  }
  std::vector<S> shapes = {{2048, 2048, 2048, "square"},          {4096, 4096, 4096, "square"},
                           {8192, 8192, 8192, "square"},          {4096, 14336, 4096, "LLM up-proj"},
                           {16384, 4096, 14336, "LLM down-proj"}, {8192, 128256, 4096, "LLM lm-head"},
                           {128, 4096, 4096, "LLM decode M=128"}};
  if (quick)
    shapes = {
        {2048, 2048, 2048, "square"}, {4096, 4096, 4096, "square"}, {128, 4096, 4096, "LLM decode M=128"}};
  if (!asked.empty()) shapes = asked;
  std::vector<b_layout> layouts;
  if (layout == "nk" || layout == "both") layouts.push_back(b_layout::nk);
  if (layout == "kn" || layout == "both") layouts.push_back(b_layout::kn);
  const out_type ot = out == "f32" ? out_type::f32 : out_type::bf16;

  std::printf(
      "bench_gemm on %s (%d SMs): bf16 inputs, %s output, fp32 accumulation, %s, each sample a batch of "
      "~%g ms of launches, median of %d\n",
      gpu->name.c_str(), gpu->sm_count, out.c_str(),
      graphs ? "samples launched as CUDA graphs (direct launches where a capture fails)"
             : "samples launched directly",
      batch_ms, samples);
  std::thread watchdog(watch_rows, 120);
  std::vector<std::string> table;
  bool all_ok = true;
  for (b_layout bl : layouts)
    for (const S& s : shapes) {
      const char* op = bl == b_layout::nk ? "A*B^T" : "A*B  ";
      char buf[512];
      std::snprintf(row_name, sizeof row_name, "%d x %d x %d %s", s.m, s.n, s.k, op);
      row_started_ms.store(now_ms());
      try {
        GemmCheckOptions check;
        check.full_reference_limit = 1ll << 28;
        check.schedule = sched;
        const GemmCheckResult r = check_gemm(s.m, s.n, s.k, bl, ot, check);
        mp::bench::GemmTimingOptions opt;
        opt.samples = samples;
        opt.graphs = graphs;
        opt.batch_ms = batch_ms;
        opt.schedule = sched;
        opt.power = power;
        opt.trace = trace;
        const auto t = mp::bench::time_gemm(s.m, s.n, s.k, bl, ot, opt);
        const char* verdict = diagnostic ? "not computed" : r.ok ? "ok" : "FAIL";
        std::snprintf(buf, sizeof buf, "| %5d x %6d x %5d | %-16s | %s | %7.1f | %7.1f | %5.3f | %.1e | %s | %s |",
                      s.m, s.n, s.k, s.what.c_str(), op, t.ours_tflops, t.cublas_tflops, t.ratio(), r.rel_err,
                      verdict, r.plan.c_str());
        all_ok = all_ok && (r.ok || diagnostic);
        std::printf("  %s\n", buf);
        if (power) {
          if (!t.power_note.empty())
            std::printf("    power: not measured (%s)\n", t.power_note.c_str());
          else
            for (auto [who, p] : {std::pair{"ours:  ", t.ours_power}, std::pair{"cuBLAS:", t.cublas_power}})
              std::printf("    power: %s %.1f mJ per launch, %.0f W, SM clock %.0f MHz\n", who, p.mj_per_launch,
                          p.watts, p.sm_mhz);
        }
        if (trace) print_trace(t.trace);
      } catch (const std::exception& e) {  // a CUDA error: this row fails, the others still print
        std::snprintf(buf, sizeof buf, "| %5d x %6d x %5d | %-16s | %s | - | - | - | - | FAIL | error: %.200s |",
                      s.m, s.n, s.k, s.what.c_str(), op, e.what());
        std::printf("  %s\n", buf);
        all_ok = false;
      }
      row_started_ms.store(0);
      std::fflush(stdout);
      table.push_back(buf);
    }
  bench_done.store(true);
  watchdog.join();
  std::printf("\n| M x N x K | shape | op | ours TFLOP/s | cuBLAS TFLOP/s | ratio | rel err vs fp64 | check | plan |\n"
              "|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& row : table) std::printf("%s\n", row.c_str());
  return all_ok ? 0 : 1;
}
