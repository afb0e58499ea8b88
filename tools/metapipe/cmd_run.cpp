// `metapipe run`: run an example program on the CPU (reference interpreter and metapipelined executor)
// on fresh random inputs, check it against its naive reference, print the check, timings and the
// per-stage report. Also the demo rows of the example programs.
#include <cstdio>
#include <iostream>
#include <sstream>

#include "backends/cuda/lower/runtime.h"
#include "core/random.h"
#include "core/table.h"
#include "examples/run.h"
#include "core/text.h"
#include "tools/metapipe/cli.h"
#include "tools/metapipe/limits.h"

namespace mp::cli {
namespace {

std::string jstr(const std::string& s) { return "\"" + json_escape(s) + "\""; }
std::string jnum(double x) {
  std::ostringstream os;
  os << x;
  return std::isfinite(x) ? os.str() : "null";
}

// One program lowered onto the GPU (backends/cuda/lower) and checked like the CPU runs: the same inputs
// (same seed), the program's naive reference, the tolerance of its output dtype.
struct CudaRun {
  examples::CpuRun check;  // target "cuda", checks, device time
  cuda::RunReport report;
};
CudaRun run_on_cuda(const examples::ProgramSpec& spec, const examples::Params& params, uint64_t seed,
                    std::ostream* log, int timed_runs) {
  ir::Program p = examples::build(spec, params);
  ir::Program compiled = passes::compile(p, examples::compile_options(params));
  (void)cuda::lower(compiled);  // a node the lowering cannot handle is reported before the GPU is asked for
  std::string why;
  MP_USER_CHECK(cuda::available(&why), "no CUDA GPU: ", why, "; --target cpu runs everywhere");
  auto in = examples::make_inputs(spec, params, p, seed);
  auto ref = spec.reference(params, in);
  auto mags = examples::magnitudes_of(spec, params, in);
  ir::Memory mem = ir::make_memory(compiled, in);
  CudaRun r;
  cuda::RunOptions opt;
  opt.log = log;
  opt.timed_runs = timed_runs;
  r.report = cuda::run(compiled, mem, opt);
  r.check.target = "cuda";
  r.check.rtol = examples::output_tolerance(p);
  // With --repeat the reported time is the median of the warm runs; without, the checked (cold) run's.
  r.check.ms = r.report.timed_runs > 0 ? r.report.timed_ms : r.report.ms;
  r.check.ok = true;
  for (auto& [name, want] : ref) {
    auto cmp = compare(mem.at(name).data, want, r.check.rtol, examples::check_atol(name, want, mags, r.check.rtol));
    r.check.ok = r.check.ok && cmp.ok;
    r.check.checks.push_back({name, cmp});
  }
  return r;
}

int run_run(Args& a) {
  auto sets = a.values({"--set"});
  auto target = a.value({"--target"}).value_or("cpu");
  bool json = a.flag({"--json"});
  bool verbose = a.flag({"--verbose"});
  auto seed_opt = a.integer({"--seed"});
  auto repeat_opt = a.integer({"--repeat"});
  const int64_t max_memory = limit_option(a, "--max-memory", cpu::kDefaultMaxMemory);
  auto pos = a.positionals();
  a.finish();
  if (pos.size() != 1) throw usage_error("expected one program name (see metapipe list)");
  if (repeat_opt && (*repeat_opt < 1 || *repeat_opt > 10000))
    throw usage_error("--repeat " + std::to_string(*repeat_opt) + " is out of range: give 1 to 10000 timed runs");
  if (repeat_opt && target != "cuda") throw usage_error("--repeat times the GPU only: add --target cuda");
  std::vector<examples::CpuMode> modes;
  if (target == "cpu")
    modes = {examples::CpuMode::Interpreter, examples::CpuMode::Executor};
  else if (target == "cpu:interp")
    modes = {examples::CpuMode::Interpreter};
  else if (target == "cpu:metapipe")
    modes = {examples::CpuMode::Executor};
  else if (target != "cuda")
    throw usage_error(
        "unknown --target '" + target +
        "' for run (cpu = interpreter and metapipelined executor, cpu:interp, cpu:metapipe, cuda; the "
        "simulated accelerator is metapipe sim)");
  const auto& spec = examples::find_program(pos[0]);
  auto params = examples::resolve(spec, sets);
  check_memory(spec, params, max_memory);
  uint64_t seed = seed_opt ? uint64_t(*seed_opt) : fresh_seed() % 1000000;
  std::vector<examples::CpuRun> runs;
  for (auto m : modes) runs.push_back(examples::run_on_cpu(spec, params, m, seed));
  std::string device;
  if (target == "cuda") {
    auto r = run_on_cuda(spec, params, seed, verbose ? &std::cerr : nullptr, repeat_opt ? int(*repeat_opt) : 0);
    device = r.report.device;
    runs.push_back(std::move(r.check));
  }
  bool ok = true;
  for (auto& r : runs) ok = ok && r.ok;

  if (json) {
    std::cout << "{\"program\": " << jstr(spec.name) << ", \"params\": {";
    bool first = true;
    for (auto& [k, v] : params.values)
      std::cout << (first ? "" : ", ") << jstr(k) << ": " << jstr(v), first = false;
    std::cout << "}, \"seed\": " << seed << ", \"runs\": [";
    for (size_t i = 0; i < runs.size(); ++i) {
      auto& r = runs[i];
      std::cout << (i ? ", " : "") << "{\"target\": " << jstr(r.target)
                << ", \"ok\": " << (r.ok ? "true" : "false") << ", \"ms\": " << jnum(r.ms)
                << ", \"rtol\": " << jnum(r.rtol) << ", \"checks\": [";
      for (size_t k = 0; k < r.checks.size(); ++k)
        std::cout << (k ? ", " : "") << "{\"tensor\": " << jstr(r.checks[k].tensor)
                  << ", \"ok\": " << (r.checks[k].cmp.ok ? "true" : "false")
                  << ", \"max_rel_err\": " << jnum(r.checks[k].cmp.max_rel_err)
                  << ", \"max_abs_err\": " << jnum(r.checks[k].cmp.max_abs_err) << "}";
      std::cout << "]";
      if (r.report) {
        std::cout << ", \"wall_ms\": " << jnum(r.report->wall_ms) << ", \"stages\": [";
        for (size_t k = 0; k < r.report->stages.size(); ++k) {
          auto& s = r.report->stages[k];
          std::cout << (k ? ", " : "") << "{\"name\": " << jstr(s.name) << ", \"nodes\": " << jstr(s.ops)
                    << ", \"iterations\": " << s.iterations << ", \"busy_ms\": " << jnum(s.busy_ms)
                    << ", \"stall_in_ms\": " << jnum(s.wait_in_ms)
                    << ", \"stall_out_ms\": " << jnum(s.wait_out_ms) << "}";
        }
        std::cout << "], \"loops\": [";
        for (size_t k = 0; k < r.report->loops.size(); ++k) {
          auto& l = r.report->loops[k];
          std::cout << (k ? ", " : "") << "{\"name\": " << jstr(l.name) << ", \"stages\": " << l.stages
                    << ", \"runs\": " << l.invocations << ", \"wall_ms\": " << jnum(l.wall_ms)
                    << ", \"busy_sum_ms\": " << jnum(l.busy_sum_ms)
                    << ", \"overlap_ms\": " << jnum(l.overlap_ms) << "}";
        }
        std::cout << "]";
      }
      std::cout << "}";
    }
    std::cout << "], \"ok\": " << (ok ? "true" : "false") << "}\n";
  } else {
    std::cout << "metapipe run " << spec.name << " (";
    bool first = true;
    for (auto& p : spec.params)
      std::cout << (first ? "" : ", ") << p.name << "=" << params.s(p.name), first = false;
    std::cout << ") seed " << seed << "\n\n";
    Table t({"target", "check vs naive C++ reference", "time"});
    for (auto& r : runs)
      t.add({r.target == "cpu"            ? "cpu (interpreter)"
             : r.target == "cpu:metapipe" ? "cpu:metapipe (executor)"
                                          : "cuda (" + device + ", lowered)",
             r.summary(), format_ms(r.ms)});
    t.print(std::cout);
    for (auto& r : runs)
      if (r.report) std::cout << "\nper-stage report of the metapipelined executor:\n" << r.report->format();
    std::cout << "\n" << (ok ? "check passed" : "CHECK FAILED") << "\n";
  }
  return ok ? 0 : 1;
}

MP_REGISTER_COMMAND(
    "run", "run an example program on the CPU and check it against its reference",
    "usage: metapipe run PROGRAM [--target cpu|cpu:interp|cpu:metapipe|cuda] [--set NAME=VALUE ...]\n"
    "                    [--seed N] [--repeat N] [--json] [--verbose]\n\n"
    "Compiles PROGRAM (see metapipe list), runs it on fresh random inputs with the reference\n"
    "interpreter and the metapipelined executor (stages on threads over bounded N-buffers),\n"
    "checks every output against the program's naive C++ reference (fp32: 1e-5 relative,\n"
    "bf16: 1e-2) and prints the checks, timings and the executor's per-stage busy / stall\n"
    "report. Exits 0 only when every check passes.\n\n"
    "  --target T        cpu (both, default), cpu:interp, cpu:metapipe, cuda (the program lowered\n"
    "                    to CUDA C++, compiled with NVRTC, run on the GPU; needs an sm_90 GPU)\n"
    "  --verbose         cuda: print the device, the NVRTC cache file and each kernel's launch\n"
    "  --repeat N        cuda: after the checked run, two warm-up runs, then N timed batches of\n"
    "                    10 runs of all kernels back to back; the time shown is the median batch\n"
    "                    over 10 (default: the checked run's, cold first launches included)\n"
    "  --set NAME=VALUE  a program or compile parameter (repeatable)\n"
    "  --seed N          input seed (default: fresh, printed)\n"
    "  --max-memory B    refuse a program whose tensors need more than B bytes of host memory\n"
    "                    (default 8GiB; suffixes k, M, G, T, Ki, Mi, Gi, Ti, optional B)\n"
    "  --json            machine-readable output\n\n"
    "With --target cuda the lowering's speed choices come from MP_CUDA_LOWER_RING, _THREADS, _FUSE,\n"
    "_BARRIERS, _COPY, _MATMUL, _ROWS, _STORE, _PREFETCH, _PRODUCER and _MATH (docs/cuda-lowering.md,\n"
    "\"Speed\"); every choice computes the same results within the dtype's tolerance (_MATH=exact: f32\n"
    "division and square roots IEEE rounded instead of the hardware's 1-2 ulp approximations).\n",
    run_run);

// The demo sizes of the seed's programs (every other program runs at its defaults).
struct Case {
  const char* program;
  std::vector<std::string> sets, quick_sets;
};
const std::vector<Case>& demo_cases() {
  static const std::vector<Case> cases = {
      {"softmax", {"R=256", "C=128"}, {"R=64", "C=32"}},
      {"matmul", {"M=128", "N=128", "K=64", "MM=32", "NN=32"}, {"M=64", "N=64", "K=32", "MM=32", "NN=16"}},
      {"gda", {}, {"R=96", "C=8", "TR=32"}},
      {"flash_attention", {"S=128", "D=32", "BR=32", "BC=32"}, {"S=64", "D=16", "BR=16", "BC=16"}},
      {"llama_decoder", {}, {"layers=1", "tokens=2", "past=6", "ffn=64"}},
  };
  return cases;
}

// Demo rows: every example program through the interpreter and the executor (small sizes with --quick).
std::vector<DemoRow> example_rows(const DemoContext& ctx) {
  if (!ctx.wants("cpu")) return {};
  const auto& cases = demo_cases();
  std::vector<DemoRow> rows;
  uint64_t seed = fresh_seed() % 1000000;
  for (auto& c : cases) {
    const examples::ProgramSpec* spec = nullptr;
    for (auto* s : examples::programs())
      if (s->name == c.program) spec = s;
    if (!spec) continue;
    auto params = examples::resolve(*spec, ctx.quick ? c.quick_sets : c.sets);
    for (auto mode : {examples::CpuMode::Interpreter, examples::CpuMode::Executor}) {
      auto r = examples::run_on_cpu(*spec, params, mode, seed);
      rows.push_back({c.program, r.target, r.summary(), format_ms(r.ms), r.ok});
    }
  }
  // Every other registered program (e.g. the Plasticine/Spatial benchmarks) at its default sizes.
  for (auto* spec : examples::programs()) {
    bool seen = false;
    for (auto& c : cases) seen = seen || spec->name == c.program;
    if (seen) continue;
    auto params = examples::resolve(*spec, {});
    for (auto mode : {examples::CpuMode::Interpreter, examples::CpuMode::Executor}) {
      auto r = examples::run_on_cpu(*spec, params, mode, seed);
      rows.push_back({spec->name, r.target, r.summary(), format_ms(r.ms), r.ok});
    }
  }
  return rows;
}
MP_REGISTER_DEMO("examples-cpu", 10, example_rows);

// Demo rows: every example program lowered onto the GPU, at the CPU rows' sizes.
std::vector<DemoRow> example_cuda_rows(const DemoContext& ctx) {
  if (!ctx.wants("cuda")) return {};
  std::string why;
  bool gpu = ctx.gpu && cuda::available(&why);
  uint64_t seed = fresh_seed() % 1000000;
  std::vector<DemoRow> rows;
  for (auto* spec : examples::programs()) {
    std::vector<std::string> sets;
    for (auto& c : demo_cases())
      if (spec->name == c.program) sets = ctx.quick ? c.quick_sets : c.sets;
    if (!gpu) {
      rows.push_back({spec->name, "cuda", "skipped: no CUDA GPU", "-", true});
      continue;
    }
    try {
      auto r = run_on_cuda(*spec, examples::resolve(*spec, sets), seed, nullptr, 0);
      rows.push_back({spec->name, "cuda", r.check.summary(), format_ms(r.check.ms), r.check.ok});
    } catch (const cuda::cuda_not_supported& e) {
      rows.push_back({spec->name, "cuda", e.what(), "-", false});
    } catch (const std::exception& e) {
      rows.push_back({spec->name, "cuda", std::string("FAIL: ") + e.what(), "-", false});
    }
  }
  // The slide-51 matmul in bf16 at a size where its lowering onto the tile layer's wgmma pipeline
  // (docs/cuda-lowering.md, "MatMul on wgmma") shows its speed: timed over 20 batches of warm runs.
  {
    const examples::ProgramSpec* mm = &examples::find_program("matmul");
    const int64_t n = ctx.quick ? 512 : 2048;
    const std::string label = "matmul-bf16";  // the check column says the size and the path
    if (!gpu) {
      rows.push_back({label, "cuda", "skipped: no CUDA GPU", "-", true});
    } else {
      try {
        const std::string d = std::to_string(n);
        auto r = run_on_cuda(*mm,
                             examples::resolve(*mm, {"dtype=bf16", "M=" + d, "N=" + d, "K=" + d, "MM=128", "NN=256"}),
                             seed, nullptr, 20);
        char measure[96];
        std::snprintf(measure, sizeof measure, "%s, %.0f TFLOP/s", format_ms(r.check.ms).c_str(),
                      2.0 * double(n) * double(n) * double(n) / (r.check.ms * 1e9));
        rows.push_back({label, "cuda", std::to_string(n) + "^3 on wgmma: " + r.check.summary(), measure, r.check.ok});
      } catch (const std::exception& e) {
        rows.push_back({label, "cuda", std::string("FAIL: ") + e.what(), "-", false});
      }
    }
  }
  return rows;
}
MP_REGISTER_DEMO("examples-cuda", 11, example_cuda_rows);

}  // namespace
}  // namespace mp::cli
