// bf16 GEMM benchmark: the tile-layer GEMM against cuBLAS in the same process, on the shapes of issue 3
// (squares and LLM projections). Each row is checked against CPU fp64 (sampled) before it is timed;
// times are medians of CUDA-event samples over rotating inputs. Prints one table, last.
//   usage: bench_gemm [--quick] [--layout nk|kn|both] [--out bf16|f32] [--samples N]
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "kernels/gemm_check.h"

using namespace mp::kernels;

int main(int argc, char** argv) {
  bool quick = false;
  std::string layout = "nk", out = "bf16";
  int samples = 20;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick")
      quick = true;
    else if (a == "--layout" && i + 1 < argc)
      layout = argv[++i];
    else if (a == "--out" && i + 1 < argc)
      out = argv[++i];
    else if (a == "--samples" && i + 1 < argc)
      samples = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: bench_gemm [--quick] [--layout nk|kn|both] [--out bf16|f32] [--samples N]\n");
      return 2;
    }
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

  std::printf("bench_gemm on %s (%d SMs): bf16 inputs, %s output, fp32 accumulation\n", gpu->name.c_str(),
              gpu->sm_count, out.c_str());
  std::vector<std::string> lines;
  bool all_ok = true;
  for (auto bl : layouts)
    for (auto s : shapes) {
      GemmCheckOptions opt;
      opt.samples = samples;
      opt.full_reference_limit = 1ll << 28;
      GemmCheckResult r;
      try {
        r = check_gemm(s.m, s.n, s.k, bl, ot, opt);
      } catch (const std::exception& e) {
        std::printf("  %d x %d x %d: error: %s\n", s.m, s.n, s.k, e.what());
        all_ok = false;
        continue;
      }
      all_ok = all_ok && r.ok;
      char buf[400];
      std::snprintf(buf, sizeof buf,
                    "| %5d x %6d x %5d | %-16s | %s | %7.1f | %7.1f | %5.3f | %.1e | %s | %s |", s.m, s.n,
                    s.k, s.what, bl == b_layout::nk ? "A*B^T" : "A*B  ", r.ours_tflops, r.cublas_tflops,
                    r.cublas_ms / r.ours_ms, r.rel_err, r.ok ? "ok" : "FAIL", r.plan.c_str());
      std::printf("  %s\n", buf);
      std::fflush(stdout);
      lines.push_back(buf);
    }
  std::printf(
      "\n| M x N x K | shape | op | ours TFLOP/s | cuBLAS TFLOP/s | ratio | rel err vs fp64 | check | plan "
      "|\n"
      "|---|---|---|---|---|---|---|---|---|\n");
  for (auto& l : lines) std::printf("%s\n", l.c_str());
  return all_ok ? 0 : 1;
}
