// bf16 GEMM benchmark: the tile-layer GEMM against cuBLAS in the same process, on the shapes of issue 3
// (squares and LLM projections). Each row is checked against CPU fp64 (sampled) before it is timed;
// times are medians of CUDA-event samples over rotating inputs, interleaved with cuBLAS. Every consumer
// schedule gets a row per shape: cooperative (the default), and the opt-in ping-pong with 64 x 256
// ("pingpong") and 128 x 128 ("pingpong-128") tiles, each timed against its own interleaved cuBLAS. All
// cooperative rows run first, so a failing ping-pong kernel cannot take them down. Prints one table,
// last, each shape's schedules side by side.
//   usage: bench_gemm [--quick] [--layout nk|kn|both] [--out bf16|f32] [--samples N] [--graphs]
//                     [--batch-ms T] [--schedule all|both|cooperative|pingpong|pingpong-128]
//                     (both: the first two schedules)
// --graphs: each sample's batch of launches is one replayed CUDA graph (GemmCheckOptions::graphs).
// --batch-ms: work per sample (default 1000 ms: each variant timed at the clock it settles to under the
// card's power cap, not the one the other variant's sample left behind). --samples: batches per variant
// (default 3), the median taken. The eighteenth session found GemmCheckOptions' 200 ms batches too short
// for that on the H200: the mean SM clock in them was 1.58 GHz against 1.50 GHz in 1 s batches, and the
// 4096^3 ratio of repeated medians ranged 0.986-1.012 against 1.008-1.010 (bench/RESULTS.md).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

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
}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string layout = "nk", out = "bf16", schedule = "all";
  int samples = 3;
  bool graphs = false;
  double batch_ms = 1000.0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick")
      quick = true;
    else if (a == "--graphs")
      graphs = true;
    else if (a == "--layout" && i + 1 < argc)
      layout = argv[++i];
    else if (a == "--out" && i + 1 < argc)
      out = argv[++i];
    else if (a == "--samples" && i + 1 < argc)
      samples = std::atoi(argv[++i]);
    else if (a == "--schedule" && i + 1 < argc)
      schedule = argv[++i];
    else if (a == "--batch-ms" && i + 1 < argc && std::atof(argv[i + 1]) > 0 &&
             std::atof(argv[i + 1]) <= 2000)
      batch_ms = std::atof(argv[++i]);
    else {
      std::fprintf(
          stderr,
          "usage: bench_gemm [--quick] [--layout nk|kn|both] [--out bf16|f32] [--samples N] [--graphs] "
          "[--batch-ms T (0 < T <= 2000)] [--schedule all|both|cooperative|pingpong|pingpong-128]\n");
      return 2;
    }
  }
  struct Variant {
    const char* name;
    GemmSchedule sched;
  };
  GemmSchedule pp, pp128;
  pp.consumers = pp128.consumers = consumer_schedule::pingpong;
  pp128.block_n = 128;
  const std::vector<Variant> all = {{"cooperative", {}}, {"pingpong", pp}, {"pingpong-128", pp128}};
  std::vector<Variant> schedules;
  for (size_t v = 0; v < all.size(); ++v)
    if (schedule == "all" || schedule == all[v].name || (schedule == "both" && v < 2))
      schedules.push_back(all[v]);
  if (schedules.empty()) {
    std::fprintf(stderr,
                 "bench_gemm: --schedule is all, both, cooperative, pingpong or pingpong-128, got '%s'\n",
                 schedule.c_str());
    return 2;
  }
  auto gpu = mp::query_gpu();
  if (!gpu || !mp::gpu_is_hopper(*gpu)) {
    std::printf("bench_gemm: skipped, no Hopper GPU (%s)\n",
                gpu ? gpu->name.c_str() : mp::gpu_absent_reason().c_str());
    return 0;
  }
  struct S {
    int m, n, k;
    const char* what;
  };
  std::vector<S> shapes = {{2048, 2048, 2048, "square"},          {4096, 4096, 4096, "square"},
                           {8192, 8192, 8192, "square"},          {4096, 14336, 4096, "LLM up-proj"},
                           {16384, 4096, 14336, "LLM down-proj"}, {8192, 128256, 4096, "LLM lm-head"},
                           {128, 4096, 4096, "LLM decode M=128"}};
  if (quick)
    shapes = {
        {2048, 2048, 2048, "square"}, {4096, 4096, 4096, "square"}, {128, 4096, 4096, "LLM decode M=128"}};
  std::vector<b_layout> layouts;
  if (layout == "nk" || layout == "both") layouts.push_back(b_layout::nk);
  if (layout == "kn" || layout == "both") layouts.push_back(b_layout::kn);
  const out_type ot = out == "f32" ? out_type::f32 : out_type::bf16;

  std::printf(
      "bench_gemm on %s (%d SMs): bf16 inputs, %s output, fp32 accumulation, %s, each sample a batch of "
      "~%g ms of launches\n",
      gpu->name.c_str(), gpu->sm_count, out.c_str(),
      graphs ? "samples launched as CUDA graphs (direct launches where a capture fails)"
             : "samples launched directly",
      batch_ms);
  std::thread watchdog(watch_rows, 120);
  // The last table has one line per (layout, shape) and a cell per schedule: "ours/cuBLAS TFLOP/s ratio
  // check", each ratio against the cuBLAS samples interleaved with that schedule's. Full rows (error, plan)
  // are printed as they finish.
  std::map<std::pair<int, int>, std::vector<std::string>> cells;
  bool all_ok = true;
  for (int sc = 0; sc < int(schedules.size()); ++sc)
    for (int li = 0; li < int(layouts.size()); ++li)
      for (int si = 0; si < int(shapes.size()); ++si) {
        const auto bl = layouts[li];
        const auto& s = shapes[si];
        GemmCheckOptions opt;
        opt.samples = samples;
        opt.graphs = graphs;
        opt.batch_ms = batch_ms;
        opt.full_reference_limit = 1ll << 28;
        opt.schedule = schedules[sc].sched;
        const char* sname = schedules[sc].name;
        const char* op = bl == b_layout::nk ? "A*B^T" : "A*B  ";
        char buf[400], cell[96];
        GemmCheckResult r;
        std::snprintf(row_name, sizeof row_name, "%d x %d x %d %s %s", s.m, s.n, s.k, op, sname);
        row_started_ms.store(now_ms());
        try {
          r = check_gemm(s.m, s.n, s.k, bl, ot, opt);
          std::snprintf(buf, sizeof buf,
                        "| %5d x %6d x %5d | %-16s | %s | %-12s | %7.1f | %7.1f | %5.3f | %.1e | %s | %s |",
                        s.m, s.n, s.k, s.what, op, sname, r.ours_tflops, r.cublas_tflops,
                        r.cublas_ms / r.ours_ms, r.rel_err, r.ok ? "ok" : "FAIL", r.plan.c_str());
          std::snprintf(cell, sizeof cell, "%.1f/%.1f %.3f %s", r.ours_tflops, r.cublas_tflops,
                        r.cublas_ms / r.ours_ms, r.ok ? "ok" : "FAIL");
          all_ok = all_ok && r.ok;
        } catch (const std::exception& e) {  // a CUDA error: this row fails, the others still print
          std::snprintf(buf, sizeof buf,
                        "| %5d x %6d x %5d | %-16s | %s | %-12s | - | - | - | - | FAIL | error: %.200s |",
                        s.m, s.n, s.k, s.what, op, sname, e.what());
          std::snprintf(cell, sizeof cell, "FAIL (error)");
          all_ok = false;
        }
        row_started_ms.store(0);
        std::printf("  %s\n", buf);
        std::fflush(stdout);
        cells[{li, si}].push_back(cell);
      }
  bench_done.store(true);
  watchdog.join();
  std::printf("\n| M x N x K | shape | op |");
  for (auto& v : schedules) std::printf(" %s: ours/cuBLAS TFLOP/s, ratio |", v.name);
  std::printf("\n|---|---|---|");
  for (size_t v = 0; v < schedules.size(); ++v) std::printf("---|");
  std::printf("\n");
  for (auto& [key, row] : cells) {
    const auto& s = shapes[key.second];
    std::printf("| %5d x %6d x %5d | %-16s | %s |", s.m, s.n, s.k, s.what,
                layouts[key.first] == b_layout::nk ? "A*B^T" : "A*B  ");
    for (auto& c : row) std::printf(" %-24s |", c.c_str());
    std::printf("\n");
  }
  return all_ok ? 0 : 1;
}
