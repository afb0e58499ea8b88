// `metapipe gemm M N K`: the tile-layer bf16 GEMM on the GPU, checked against cuBLAS and a CPU fp64
// reference, timed against cuBLAS in the same run; and its rows in `metapipe demo`.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "kernels/gemm.h"
#include "kernels/gemm_check.h"
#include "tools/metapipe/cli.h"

namespace mp::cli {
namespace {

std::string tflops(double t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f TFLOP/s", t);
  return buf;
}

// --trace: each timeline point's spread over the blocks, in microseconds from the first block's start.
void print_trace(const std::vector<unsigned long long>& t) {
  constexpr int P = kernels::gemm_trace_points;
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
  for (int p = 0; p < kernels::gemm_trace_times; ++p) {
    std::vector<double> us;
    for (size_t b = 0; b < blocks; ++b)
      if (t[b * P + p] >= t0) us.push_back(double(t[b * P + p] - t0) * 1e-3);
    if (us.empty()) continue;  // e.g. no split tiles: no fixup
    std::sort(us.begin(), us.end());
    std::printf("        %-38s %8zu %8.2f %8.2f %8.2f\n", kernels::gemm_trace_point_names[p], us.size(), us.front(),
                us[us.size() / 2], us.back());
  }
  // K steps (the block's last item, SM cycles; c: consumer stage full, w: its wgmma wait done, p: the
  // producer has the stage): per step, the consumer's wait for data (w[i-1] -> c[i]) and its wgmma
  // issue and wait (c[i] -> w[i]); the producer's cycles per step (p[i-1] -> p[i]) and how long after the
  // producer had a stage the consumer found it full (p[i] -> c[i]). Medians over blocks of the per-block
  // mean over steps 2.. .
  constexpr int S0 = kernels::gemm_trace_times + 1, NS = kernels::gemm_trace_step_count;
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

int run_gemm(Args& a) {
  const bool bt = a.flag({"--bt"});
  const std::string out = a.value({"--out"}).value_or("bf16");
  const auto samples = a.integer({"--samples"});
  const bool no_time = a.flag({"--no-time"});
  const bool graphs = a.flag({"--graphs"});
  const bool power = a.flag({"--power"});
  const auto batch_ms = a.value({"--batch-ms"});
  double batch_ms_v = kernels::GemmCheckOptions{}.batch_ms;
  if (batch_ms) {
    char* end = nullptr;
    batch_ms_v = std::strtod(batch_ms->c_str(), &end);
    if (end == batch_ms->c_str() || *end != '\0' || !(batch_ms_v >= 0.01 && batch_ms_v <= 2000))
      throw usage_error("metapipe gemm: --batch-ms is a number of ms from 0.01 to 2000, got '" + *batch_ms +
                        "'");
  }
  const bool plan_only = a.flag({"--plan"});
  const auto sms = a.integer({"--sms"});
  if (sms && !plan_only)
    throw usage_error("metapipe gemm: --sms goes with --plan (the SM count to plan for)");
  if (sms && (*sms < 1 || *sms > 1024)) throw usage_error("metapipe gemm: --sms is 1 to 1024");
  kernels::GemmSchedule sched;
  if (auto v = a.integer({"--block-m"})) sched.block_m = int(*v);
  if (auto v = a.integer({"--block-n"})) sched.block_n = int(*v);
  if (auto v = a.integer({"--split-k"})) sched.split_k = int(*v);
  if (auto v = a.integer({"--group-m"})) sched.group_m = int(*v);
  if (auto v = a.integer({"--split-lead"})) {
    if (*v < 0 || *v > 1024) throw usage_error("metapipe gemm: --split-lead is 0 to 1024 K steps");
    sched.split_lead = int(*v);
  }
  if (auto v = a.value({"--split-reduce"}))
    if (!kernels::parse_split_reduce(*v, sched.reduce))
      throw usage_error("metapipe gemm: --split-reduce is workspace or cluster, got '" + *v + "'");
  if (auto v = a.integer({"--cluster"})) sched.cluster = int(*v);
  if (a.flag({"--no-persistent"})) sched.persistent = false;
  if (auto v = a.integer({"--mma-pending"})) {
    if (*v < 0 || *v > 2) throw usage_error("metapipe gemm: --mma-pending is 0, 1 or 2");
    sched.mma_pending = int(*v);
  }
  if (auto v = a.integer({"--prefetch"})) {
    if (*v < 0 || *v > 64) throw usage_error("metapipe gemm: --prefetch is 0 to 64");
    sched.prefetch = int(*v);
  }
  if (auto v = a.integer({"--fixed-reducer"})) {
    if (*v != 0 && *v != 1) throw usage_error("metapipe gemm: --fixed-reducer is 0 or 1");
    sched.fixed_reducer = *v == 1;
  }
  if (auto v = a.value({"--stream-k"}))
    if (!kernels::parse_stream_k_mode(*v, sched.stream_k))
      throw usage_error("metapipe gemm: --stream-k is auto, 0 or 1, got '" + *v + "'");
  if (auto v = a.value({"--l2"})) {  // A,B,C priorities, or none, or auto
    const std::string err = "metapipe gemm: --l2 is auto, none, or three of normal|first|last|auto for "
                            "A,B,C (e.g. last,first,first), got '" + *v + "'";
    if (*v == "none" || *v == "auto") {
      sched.l2_a = sched.l2_b = sched.l2_c =
          *v == "none" ? kernels::l2_priority::normal : kernels::l2_priority::automatic;
    } else {
      kernels::l2_priority* to[3] = {&sched.l2_a, &sched.l2_b, &sched.l2_c};
      size_t from = 0;
      for (int i = 0; i < 3; ++i) {
        const size_t comma = i < 2 ? v->find(',', from) : v->size();
        if (comma == std::string::npos || !kernels::parse_l2_priority(v->substr(from, comma - from), *to[i]))
          throw usage_error(err);
        from = comma + 1;
      }
    }
  }
  if (auto v = a.value({"--epilogue"})) {
    if (*v == "auto")
      sched.epilogue = kernels::epilogue_mode::automatic;
    else if (*v == "immediate")
      sched.epilogue = kernels::epilogue_mode::immediate;
    else if (*v == "deferred")
      sched.epilogue = kernels::epilogue_mode::deferred;
    else if (*v == "whole")
      sched.epilogue = kernels::epilogue_mode::whole;
    else
      throw usage_error("metapipe gemm: --epilogue is auto, immediate, deferred or whole, got '" + *v + "'");
  }
  if (auto v = a.integer({"--pdl"})) {
    if (*v != 0 && *v != 1) throw usage_error("metapipe gemm: --pdl is 0 or 1");
    sched.overlap_launch = *v == 1;
  }
  const bool trace = a.flag({"--trace"});
  sched.data_only = a.flag({"--data-only"});
  sched.compute_only = a.flag({"--compute-only"});
  if (sched.data_only && sched.compute_only)
    throw usage_error("metapipe gemm: --data-only and --compute-only exclude each other");
  if (auto v = a.value({"--schedule"}))
    if (!kernels::parse_consumer_schedule(*v, sched.consumers))
      throw usage_error("metapipe gemm: --schedule is cooperative or pingpong, got '" + *v + "'");
  if (sched.consumers == kernels::consumer_schedule::pingpong && sched.cluster == 2)
    throw usage_error("metapipe gemm: --schedule pingpong runs without clusters (no --cluster 2)");
  if (sched.cluster < 0 || sched.cluster > 2) throw usage_error("metapipe gemm: --cluster is 1 or 2");
  if (sched.block_m != 0 && sched.block_m != 64 && sched.block_m != 128)
    throw usage_error("metapipe gemm: --block-m is 64 or 128");
  if (sched.block_n != 0 && sched.block_n != 64 && sched.block_n != 128 && sched.block_n != 256)
    throw usage_error("metapipe gemm: --block-n is 64, 128 or 256");
  if (sched.split_k < 0 || sched.group_m < 1)
    throw usage_error("metapipe gemm: --split-k >= 0 and --group-m >= 1");
  auto pos = a.positionals();
  a.finish();
  if (pos.size() != 3) throw usage_error("metapipe gemm takes three sizes: M N K (see metapipe gemm --help)");
  long long mnk[3];
  for (int i = 0; i < 3; ++i) {
    try {
      size_t used = 0;
      mnk[i] = std::stoll(pos[i], &used);
      if (used != pos[i].size()) throw std::invalid_argument("");
    } catch (const std::exception&) {
      throw usage_error("metapipe gemm: '" + pos[i] + "' is not a size (M N K are positive integers)");
    }
  }
  if (out != "bf16" && out != "f32")
    throw usage_error("metapipe gemm: --out is bf16 or f32, got '" + out + "'");
  kernels::check_gemm_shape(mnk[0], mnk[1], mnk[2]);
  auto gpu = query_gpu();
  if (plan_only) {  // the schedule the shape gets, computed on the host: no GPU needed
    const bool hopper = gpu && gpu_is_hopper(*gpu);
    const int count = sms ? int(*sms) : hopper ? gpu->sm_count : 132;
    const std::string on = sms      ? std::to_string(count) + " SMs (--sms)" + (hopper ? "" : ", an H200's 60 MiB of L2")
                           : hopper ? gpu->name + ", " + std::to_string(count) + " SMs"
                                    : "132 SMs and 60 MiB of L2, an H200's (no Hopper GPU here; --sms sets another SM count)";
    const auto p = kernels::plan_gemm(int(mnk[0]), int(mnk[1]), int(mnk[2]), sched, count,
                                      out == "f32" ? kernels::out_type::f32 : kernels::out_type::bf16,
                                      hopper ? (long long)gpu->l2_bytes : kernels::h200_l2_bytes);
    std::cout << "gemm " << mnk[0] << " x " << mnk[1] << " x " << mnk[2]
              << ": C = " << (bt ? "A * B^T" : "A * B") << ", " << out << " output, planned for " << on
              << "\n"
              << "plan:   " << kernels::describe_plan(p, sched) << "\n";
    return 0;
  }
  // (no "metapipe gemm" in these messages: the error line names the command once)
  if (!gpu) fail_user("needs a Hopper GPU (sm_90): ", gpu_absent_reason(), " ('--plan' shows the schedule without one)");
  if (!gpu_is_hopper(*gpu))
    fail_user("needs a Hopper GPU (sm_90); found ", gpu->name, " ('--plan' shows the schedule without one)");

  const int m = int(mnk[0]), n = int(mnk[1]), k = int(mnk[2]);
  const auto bl = bt ? kernels::b_layout::nk : kernels::b_layout::kn;
  const auto ot = out == "f32" ? kernels::out_type::f32 : kernels::out_type::bf16;
  kernels::GemmCheckOptions opt;
  opt.time = !no_time;
  opt.schedule = sched;
  if (samples) opt.samples = int(std::max(1ll, *samples));
  opt.trace = trace;
  opt.graphs = graphs;
  opt.batch_ms = batch_ms_v;
  opt.power = power;
  auto r = kernels::check_gemm(m, n, k, bl, ot, opt);
  std::cout << "gemm " << m << " x " << n << " x " << k << ": C = " << (bt ? "A * B^T" : "A * B")
            << ", bf16 inputs, " << out << " output, on " << gpu->name << "\n"
            << "plan:   " << r.plan << "\n"
            << "check:  "
            << (sched.data_only || sched.compute_only
                    ? std::string("skipped: a diagnostic run (--data-only / --compute-only) computes nothing")
                                : r.summary() + " against CPU fp64 on " + format_count((long long)r.checked) +
                                      " elements (seed " + std::to_string(r.seed) + ")")
            << "\n";
  if (opt.time) {
    std::printf(
        "ours:   %s  %s\ncuBLAS: %s  %s\nratio:  %.3fx cuBLAS (median of %d, %s, %d launches per sample)\n",
        format_ms(r.ours_ms).c_str(), tflops(r.ours_tflops).c_str(), format_ms(r.cublas_ms).c_str(),
        tflops(r.cublas_tflops).c_str(), r.cublas_ms / r.ours_ms, opt.samples, r.timing_method.c_str(),
        r.batch_launches);
  }
  if (opt.time && power) {
    if (!r.power_note.empty())
      std::printf("power:  not measured (%s)\n", r.power_note.c_str());
    else
      for (auto [who, p] : {std::pair{"ours:  ", r.ours_power}, std::pair{"cuBLAS:", r.cublas_power}})
        std::printf("power:  %s %.1f mJ per launch, %.0f W, SM clock %.0f MHz\n", who, p.mj_per_launch,
                    p.watts, p.sm_mhz);
  }
  if (trace) print_trace(r.trace);
  return r.ok || sched.data_only || sched.compute_only ? 0 : 1;
}

MP_REGISTER_COMMAND(
    "gemm", "bf16 GEMM on the GPU with the tile layer, checked and timed against cuBLAS",
    "usage: metapipe gemm M N K [--bt] [--out bf16|f32] [--samples N] [--graphs] [--batch-ms T]\n"
    "                          [--power] [--no-time] [--plan [--sms N]] [schedule options]\n\n"
    "Runs C = A * B (A: M x K, B: K x N, row-major bf16) with the tile layer's Hopper GEMM on fresh\n"
    "random inputs, checks it against a CPU fp64 reference (every element for small shapes, a\n"
    "sample for large ones) and against cuBLAS, then times both (median, CUDA events) and prints\n"
    "TFLOP/s and the ratio to cuBLAS. M, N and K must be multiples of 16. Needs a Hopper GPU;\n"
    "without one it says so and exits 1.\n\n"
    "  --bt           B is stored N x K: C = A * B^T\n"
    "  --out TYPE     output type: bf16 (default) or f32; accumulation is always fp32\n"
    "  --samples N    timed samples (default 20)\n"
    "  --graphs       time each sample's batch of launches as one replayed CUDA graph (for\n"
    "                 kernels as short as a launch: the host's pace stays out of the time)\n"
    "  --batch-ms T   each sample is a batch of launches of about T ms of work (default 200);\n"
    "                 ours and cuBLAS alternate by sample. At the GPU's power cap the clock\n"
    "                 lags the power drawn: long batches time each at its own settled clock\n"
    "                 (on an H200 200 ms is not quite settled: use 1000 for ratios to quote)\n"
    "  --power        also read the GPU's energy counter and SM clock (NVML) around each\n"
    "                 sample: energy per launch, watts and MHz for ours and cuBLAS (the\n"
    "                 counter lags, which blurs the two energies toward each other)\n"
    "  --no-time      check only\n"
    "  --plan         print the schedule the shape gets and stop (no GPU needed; on the GPU\n"
    "                 present, else an H200's 132 SMs and 60 MiB of L2)\n"
    "  --sms N        with --plan: plan for N SMs\n\n"
    "schedule options (the defaults are chosen from the shape):\n"
    "  --block-m N      tile height: 128 (two consumer warpgroups; 128 or 256 wide) or 64\n"
    "                   (one; 64 or 128 wide, for shapes with few 128-row tiles)\n"
    "  --block-n N      tile width: 64, 128 or 256\n"
    "  --split-k N      split K N ways (1: never)\n"
    "  --split-reduce R how split tiles are added up: workspace (default: partials through\n"
    "                   global memory) or cluster (64 x 128 tiles split 2 ways: the two halves\n"
    "                   on a block pair, added through distributed shared memory)\n"
    "  --split-lead N   split tiles: each split but the last N K steps (of 64) shorter than\n"
    "                   an even share, the last the rest, so the others' partials are written\n"
    "                   while it still computes (default: chosen from the plan)\n"
    "  --fixed-reducer 0|1  split tiles (workspace): the split with the last K range adds the\n"
    "                   partials up (1, the default), or whichever finishes last (0); stream-K\n"
    "                   tiles: the block holding the tile's first K range, or the last to finish\n"
    "  --group-m N      walk tiles in groups of N M-tiles (L2 reuse; 1: row by row)\n"
    "  --cluster N      1, or 2: block pairs share the B tile (TMA multicast)\n"
    "  --stream-k auto|0|1  share the last, partial wave's tiles out by K ranges (default auto: where\n"
    "                   that wave leaves at least a third of the GPU idle; 1: wherever there is one)\n"
    "  --epilogue E     auto (default): whole where it applies on the persistent grid with\n"
    "                   more tiles than SMs, else immediate; immediate: write a tile after\n"
    "                   its last K step, its 64-column chunks taking turns in two buffers;\n"
    "                   whole (bf16, 128 x 256 tiles, cluster 1): all chunks at once, one\n"
    "                   ring stage fewer; deferred (bf16): the last two chunks during the\n"
    "                   next tile's first K steps\n"
    "  --l2 A,B,C       L2 eviction priorities of the A and B loads and the C stores, each\n"
    "                   normal, first, last or auto; none: no hints; auto (default): A kept\n"
    "                   (last), B and C replaced first where the operands exceed half the L2\n"
    "                   and a tile group's A rows fit in a third of it, else none\n"
    "  --mma-pending N  wgmma groups left in flight per K step, 0, 1 or 2\n"
    "  --prefetch N     prefetch A and B tiles into L2 N K steps ahead (0: off)\n"
    "  --data-only      diagnostic: time the loads alone (no wgmma; the result is not\n"
    "                   computed, so the check is skipped)\n"
    "  --compute-only   diagnostic: time the wgmma alone (no loads; not computed either)\n"
    "  --no-persistent  one block per tile instead of one block per SM\n"
    "  --pdl 0|1        programmatic dependent launch: start launching while the previous\n"
    "                   kernel in the stream finishes (default 0; needs a build with\n"
    "                   -DMP_PIPELINE_PDL=1, otherwise ignored)\n"
    "  --trace          diagnostic: after the timing, print one launch's timeline per block\n"
    "                   (start, first data, mainloop, fixup, finish, end; min / median / max)\n"
    "  --schedule S     cooperative (default): both consumer warpgroups share a 128-row tile;\n"
    "                   pingpong: each owns its own tile, 64 x 256 (or 128 x 128 with\n"
    "                   --block-n 128), and they alternate mainloop and epilogue (opt-in)\n",
    run_gemm);

std::vector<DemoRow> gemm_rows(const DemoContext& ctx) {
  if (!ctx.gpu) return {};  // the tile GEMM needs a Hopper GPU
  const int s = ctx.quick ? 1024 : 4096;
  std::vector<DemoRow> rows;
  for (bool bt : {true, false}) {
    kernels::GemmCheckOptions opt;
    opt.samples = ctx.quick ? 5 : 20;
    auto r = kernels::check_gemm(s, s, s, bt ? kernels::b_layout::nk : kernels::b_layout::kn,
                                 kernels::out_type::bf16, opt);
    char measure[128];
    std::snprintf(measure, sizeof measure, "%s, %.0f TFLOP/s (%.2fx cuBLAS)", format_ms(r.ours_ms).c_str(),
                  r.ours_tflops, r.cublas_ms / r.ours_ms);
    rows.push_back({"gemm-tile " + std::to_string(s) + "^3 bf16 " + (bt ? "A*B^T" : "A*B"), "cuda",
                    r.summary(), measure, r.ok});
  }
  return rows;
}
MP_REGISTER_DEMO("gemm-tile", 40, gemm_rows);

}  // namespace
}  // namespace mp::cli
