// `metapipe gemm M N K`: the tile-layer bf16 GEMM on the GPU, checked against cuBLAS and a CPU fp64
// reference, timed against cuBLAS in the same run (bench/harness); and its rows in `metapipe demo`.
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "bench/harness/gemm_timing.h"
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

int run_gemm(Args& a) {
  const bool bt = a.flag({"--bt"});
  const std::string out = a.value({"--out"}).value_or("bf16");
  const auto samples = a.integer({"--samples"});
  const bool no_time = a.flag({"--no-time"});
  const bool graphs = a.flag({"--graphs"});
  const auto batch_ms = a.value({"--batch-ms"});
  double batch_ms_v = bench::GemmTimingOptions{}.batch_ms;
  if (batch_ms) {
    char* end = nullptr;
    batch_ms_v = std::strtod(batch_ms->c_str(), &end);
    if (end == batch_ms->c_str() || *end != '\0' || !(batch_ms_v >= 0.01 && batch_ms_v <= 2000))
      throw usage_error("--batch-ms is a number of ms from 0.01 to 2000, got '" + *batch_ms + "'");
  }
  if (samples && (*samples < 1 || *samples > 10000)) throw usage_error("--samples is 1 to 10000");
  const bool plan_only = a.flag({"--plan"});
  const auto sms = a.integer({"--sms"});
  if (sms && !plan_only) throw usage_error("--sms goes with --plan (the SM count to plan for)");
  if (sms && (*sms < 1 || *sms > 1024)) throw usage_error("--sms is 1 to 1024");
  kernels::GemmSchedule sched;
  if (auto v = a.value({"--schedule"})) {
    try {
      kernels::apply_schedule(*v, sched);
    } catch (const usage_error&) {
      throw;
    } catch (const user_error& e) {  // the library's message, named for the option
      std::string msg = e.what();
      const std::string prefix = "gemm schedule: ";
      if (msg.rfind(prefix, 0) == 0) msg = msg.substr(prefix.size());
      throw usage_error("--schedule: " + msg);
    }
  }
  auto pos = a.positionals();
  a.finish();
  if (pos.size() != 3) throw usage_error("three sizes are needed: M N K (see --help)");
  long long mnk[3];
  for (int i = 0; i < 3; ++i) {
    try {
      size_t used = 0;
      mnk[i] = std::stoll(pos[i], &used);
      if (used != pos[i].size()) throw std::invalid_argument("");
    } catch (const std::exception&) {
      throw usage_error("'" + pos[i] + "' is not a size (M N K are positive integers)");
    }
  }
  if (out != "bf16" && out != "f32") throw usage_error("--out is bf16 or f32, got '" + out + "'");
  kernels::check_gemm_shape(mnk[0], mnk[1], mnk[2]);
  const auto ot = out == "f32" ? kernels::out_type::f32 : kernels::out_type::bf16;
  auto gpu = query_gpu();
  if (plan_only) {  // the schedule the shape gets, computed on the host: no GPU needed
    const bool hopper = gpu && gpu_is_hopper(*gpu);
    const int count = sms ? int(*sms) : hopper ? gpu->sm_count : 132;
    const std::string on = sms      ? std::to_string(count) + " SMs (--sms)" + (hopper ? "" : ", an H200's 60 MiB of L2")
                           : hopper ? gpu->name + ", " + std::to_string(count) + " SMs"
                                    : "132 SMs and 60 MiB of L2, an H200's (no Hopper GPU here; --sms sets another SM count)";
    const auto p = kernels::plan_gemm(int(mnk[0]), int(mnk[1]), int(mnk[2]), sched, count, ot,
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
  kernels::GemmCheckOptions check;
  check.schedule = sched;
  const auto r = kernels::check_gemm(m, n, k, bl, ot, check);
  std::cout << "gemm " << m << " x " << n << " x " << k << ": C = " << (bt ? "A * B^T" : "A * B")
            << ", bf16 inputs, " << out << " output, on " << gpu->name << "\n"
            << "plan:   " << r.plan << "\n"
            << "check:  " << r.summary() << " against CPU fp64 on " << format_count((long long)r.checked)
            << " elements (seed " << r.seed << ")\n";
  if (!no_time) {
    bench::GemmTimingOptions opt;
    opt.schedule = sched;
    if (samples) opt.samples = int(*samples);
    opt.graphs = graphs;
    opt.batch_ms = batch_ms_v;
    const auto t = bench::time_gemm(m, n, k, bl, ot, opt);
    std::printf(
        "ours:   %s  %s\ncuBLAS: %s  %s\nratio:  %.3fx cuBLAS (median of %d, %s, %d launches per sample)\n",
        format_ms(t.ours_ms).c_str(), tflops(t.ours_tflops).c_str(), format_ms(t.cublas_ms).c_str(),
        tflops(t.cublas_tflops).c_str(), t.ratio(), opt.samples, t.timing_method.c_str(), t.batch_launches);
  }
  return r.ok ? 0 : 1;
}

MP_REGISTER_COMMAND(
    "gemm", "bf16 GEMM on the GPU with the tile layer, checked and timed against cuBLAS",
    std::string(
        "usage: metapipe gemm M N K [--bt] [--out bf16|f32] [--samples N] [--batch-ms T] [--graphs]\n"
        "                          [--no-time] [--plan [--sms N]] [--schedule KEY=VALUE,...]\n\n"
        "Runs C = A * B (A: M x K, B: K x N, row-major bf16) with the tile layer's Hopper GEMM on fresh\n"
        "random inputs, checks it against a CPU fp64 reference (every element for small shapes, a\n"
        "sample for large ones) and against cuBLAS, then times both (median, CUDA events) and prints\n"
        "TFLOP/s and the ratio to cuBLAS. M, N and K must be multiples of 16. Needs a Hopper GPU;\n"
        "without one it says so and exits 1. Tuning and trace tools: bench/gemm (bench_gemm --help).\n\n"
        "  --bt           B is stored N x K: C = A * B^T\n"
        "  --out TYPE     output type: bf16 (default) or f32; accumulation is always fp32\n"
        "  --samples N    timed samples of each, ours and cuBLAS alternating (default 20)\n"
        "  --batch-ms T   each sample is a batch of launches of about T ms of work (default 200).\n"
        "                 At the GPU's power cap the clock lags the power drawn: long batches time\n"
        "                 each at its own settled clock (use 1000 for ratios to quote)\n"
        "  --graphs       time each sample's batch as one replayed CUDA graph (for kernels as\n"
        "                 short as a launch: the host's pace stays out of the time)\n"
        "  --no-time      check only\n"
        "  --plan         print the schedule the shape gets and stop (no GPU needed; on the GPU\n"
        "                 present, else an H200's 132 SMs and 60 MiB of L2)\n"
        "  --sms N        with --plan: plan for N SMs\n"
        "  --schedule S   override the schedule chosen from the shape, as comma-separated\n"
        "                 KEY=VALUE pairs (e.g. --schedule block_m=64,split_k=2,l2=none):\n") +
        kernels::gemm_schedule_keys,
    run_gemm);

std::vector<DemoRow> gemm_rows(const DemoContext& ctx) {
  if (!ctx.gpu) return {};  // the tile GEMM needs a Hopper GPU
  const int s = ctx.quick ? 1024 : 4096;
  std::vector<DemoRow> rows;
  for (bool bt : {true, false}) {
    const auto bl = bt ? kernels::b_layout::nk : kernels::b_layout::kn;
    const auto r = kernels::check_gemm(s, s, s, bl, kernels::out_type::bf16);
    bench::GemmTimingOptions opt;
    opt.samples = ctx.quick ? 5 : 20;
    const auto t = bench::time_gemm(s, s, s, bl, kernels::out_type::bf16, opt);
    char measure[128];
    std::snprintf(measure, sizeof measure, "%s, %.0f TFLOP/s (%.2fx cuBLAS)", format_ms(t.ours_ms).c_str(),
                  t.ours_tflops, t.ratio());
    rows.push_back({"gemm-tile " + std::to_string(s) + "^3 bf16 " + (bt ? "A*B^T" : "A*B"), "cuda",
                    r.summary(), measure, r.ok});
  }
  return rows;
}
MP_REGISTER_DEMO("gemm-tile", 40, gemm_rows);

}  // namespace
}  // namespace mp::cli
