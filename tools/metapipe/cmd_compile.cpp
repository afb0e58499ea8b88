// `metapipe compile`: build a program, run the pass pipeline and print the IR (after each pass on request).
#include <iostream>

#include "backends/cuda/lower/lower.h"
#include "examples/registry.h"
#include "ir/analysis.h"
#include "ir/printer.h"
#include "passes/pipeline.h"
#include "tools/metapipe/cli.h"

namespace mp::cli {
namespace {

int run_compile(Args& a) {
  auto sets = a.values({"--set"});
  auto dump = a.value({"--dump-ir"});
  auto emit = a.value({"--emit"}).value_or("ir");
  auto pos = a.positionals();
  a.finish();
  if (emit != "ir" && emit != "cuda")
    throw usage_error("unknown --emit '" + emit + "' (ir = the compiled IR and its summary, cuda = the CUDA C++ "
                      "translation unit of the lowering)");
  if (emit == "cuda" && dump) throw usage_error("--dump-ir prints IR: it does not combine with --emit cuda");
  if (pos.size() != 1) throw usage_error("expected one program name (see metapipe list)");
  const auto& spec = examples::find_program(pos[0]);
  auto params = examples::resolve(spec, sets);
  auto opt = examples::compile_options(params);
  opt.dump = dump.value_or("none");
  opt.dump_to = &std::cout;
  std::vector<passes::PassRecord> log;
  ir::Program p = passes::compile(examples::build(spec, params), opt, &log);
  if (emit == "cuda") {
    std::cout << cuda::lower(p, cuda::options_from_env()).source;  // the MP_CUDA_LOWER_* speed variables
    return 0;
  }
  if (opt.dump == "none") std::cout << ir::print(p) << "\n";
  std::cout << "passes:";
  for (auto& r : log) std::cout << " " << r.name << " (" << format_ms(r.ms) << ")";
  std::cout << "\n";
  int64_t bytes = 0;
  auto bufs = ir::all_buffers(p);
  for (auto& b : bufs) bytes += b.buffer->bytes();
  auto w = ir::program_work(p);
  std::cout << "buffers: " << bufs.size() << " (" << bytes / 1024.0
            << " KiB in all); work: " << (long long)w.flops << " flops, " << w.elem_ops << " element ops, "
            << w.load_bytes << " bytes loaded, " << w.store_bytes << " bytes stored\n";
  return 0;
}

MP_REGISTER_COMMAND("compile", "compile an example program and print its IR (after each pass on request)",
                    "usage: metapipe compile PROGRAM [--set NAME=VALUE ...] [--dump-ir=WHEN] [--emit ir|cuda]\n\n"
                    "Builds PROGRAM (see metapipe list) with its parameters, runs the pass pipeline\n"
                    "tile -> fuse -> parallelize -> metapipeline (each followed by the verifier) and prints\n"
                    "the final IR with its stages, buffers and stage graph.\n\n"
                    "  --set NAME=VALUE   a program or compile parameter (repeatable)\n"
                    "  --emit cuda        print the CUDA C++ translation unit the program lowers to (one\n"
                    "                     kernel per top-level statement; nvcc -arch=sm_90a compiles it;\n"
                    "                     a unit with a bf16 matmul on wgmma includes the tile layer:\n"
                    "                     nvcc -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr\n"
                    "                     -std=c++20 -I<repository root>, as its header comment says), with\n"
                    "                     the speed choices of the MP_CUDA_LOWER_* variables (metapipe run\n"
                    "                     --help)\n"
                    "  --dump-ir=WHEN     none (default: the final IR only), after-all, after-tile,\n"
                    "                     after-fuse, after-parallelize or after-metapipeline\n",
                    run_compile);

}  // namespace
}  // namespace mp::cli
