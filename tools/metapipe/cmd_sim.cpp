// `metapipe sim`: a program compiled onto the simulated reconfigurable dataflow accelerator (Plasticine /
// SN40L presets or an architecture file), simulated cycle by cycle; plus its demo rows and `info` section.
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>

#include "backends/rdu/arch.h"
#include "backends/rdu/programs.h"
#include "backends/rdu/rdu.h"
#include "backends/rdu/report.h"
#include "core/compare.h"
#include "core/random.h"
#include "tools/metapipe/cli.h"

namespace mp::cli {
namespace {

// Runs `prog` functionally on the arch and compares every output tensor with the naive reference.
CompareResult functional_check(const rdu::Arch& arch, const rdu::GraphProgram& prog, const rdu::Params& p, uint64_t seed,
                               rdu::RunResult* out) {
  rdu::Graph g = prog.build(p, true, seed);
  auto ref = prog.reference(g, p);
  rdu::RunOptions o;
  o.functional = true;
  for (auto& [name, want] : ref)
    for (auto& t : g.tensors)
      if (t.name == name) t.host.assign(want.size(), std::nanf(""));  // poison outputs
  *out = rdu::run(arch, g, o);
  CompareResult worst;
  worst.ok = true;
  for (auto& [name, want] : ref)
    for (auto& t : g.tensors)
      if (t.name == name) {
        auto c = compare(std::span<const float>(t.host.data(), want.size()), std::span<const double>(want), 1e-4, 1e-3);
        if (!c.ok || c.max_rel_err >= worst.max_rel_err) worst = c;
      }
  return worst;
}

int run_sim(Args& a) {
  auto arch_name = a.value({"--arch"});
  auto sets = a.values({"--set"});
  bool json = a.flag({"--json"});
  bool functional = a.flag({"--functional"});
  auto svg = a.value({"--svg"});
  auto seed_opt = a.integer({"--seed"});
  auto pos = a.positionals();
  a.finish();
  if (pos.size() != 1) {
    std::string names;
    for (auto& p : rdu::graph_programs()) names += (names.empty() ? "" : ", ") + p.name;
    throw usage_error("metapipe sim needs one program (" + names + "); see metapipe sim --help");
  }
  const rdu::GraphProgram* prog = rdu::find_graph_program(pos[0]);
  if (!prog) {
    std::string names;
    for (auto& p : rdu::graph_programs()) names += (names.empty() ? "" : ", ") + p.name;
    throw usage_error("unknown program '" + pos[0] + "' for metapipe sim (programs: " + names + ")");
  }
  rdu::Arch arch = rdu::load_arch(arch_name.value_or("plasticine"));
  // --set NAME=VALUE: program parameters first, architecture keys otherwise.
  std::vector<std::string> prog_sets;
  for (auto& s : sets) {
    auto k = s.substr(0, s.find('='));
    if (prog->defaults.count(k)) prog_sets.push_back(s);
    else rdu::apply_override(arch, s);
  }
  rdu::Params p = rdu::resolve_params(*prog, prog_sets, functional);
  uint64_t seed = seed_opt ? uint64_t(*seed_opt) : fresh_seed();
  rdu::RunResult r;
  std::string check;
  bool ok = true;
  if (functional) {
    auto c = functional_check(arch, *prog, p, seed, &r);
    check = c.summary();
    ok = c.ok;
  } else {
    rdu::Graph g = prog->build(p, false, seed);
    r = rdu::run(arch, g);
  }
  if (svg) {
    std::ofstream f(*svg);
    if (!f) throw user_error("--svg: cannot write '" + *svg + "'");
    f << rdu::render_svg(arch, r, 0);
  }
  if (json) {
    rdu::print_json(std::cout, arch, r);
  } else {
    std::cout << "parameters:";
    for (auto& [k, v] : p) std::cout << " " << k << "=" << v;
    std::cout << "\n";
    rdu::print_text(std::cout, arch, r);
    if (functional) std::cout << "\nfunctional check vs naive C++ reference (seed " << seed << "): " << check << "\n";
    if (svg) std::cout << "placement picture: " << *svg << "\n";
  }
  return ok ? 0 : 1;
}

MP_REGISTER_COMMAND("sim", "simulate a program on the dataflow accelerator (Plasticine, SN40L, or an arch file)",
                    "usage: metapipe sim <program> [--arch NAME|FILE] [--set NAME=VALUE ...] [--json] [--svg FILE]\n"
                    "                    [--functional] [--seed N]\n\n"
                    "Maps the program's metapipeline onto a reconfigurable dataflow accelerator (stages to PCUs,\n"
                    "buffers to PMUs, loads and stores to AGCUs; several kernel calls when it does not fit), places\n"
                    "and routes it on the mesh, and simulates it cycle by cycle (event-driven, token-based, with a\n"
                    "DRAM model of bursts, banks, refresh and bus turnaround).\n\n"
                    "programs: dotproduct, outerproduct, tpchq6, blackscholes, gemm, gda, kmeans, matmul (slide 51)\n\n"
                    "  --arch NAME|FILE  preset (plasticine, sn40l; default plasticine) or an .arch file (docs/rdu.md)\n"
                    "  --set NAME=VALUE  a program parameter (e.g. N=4096, ts=512) or an architecture key\n"
                    "                    (e.g. pcu.lanes=32, memory.ddr.channels=1); repeatable\n"
                    "  --json            cycles, seconds, kernel_calls, utilization, off-chip bytes and bandwidth,\n"
                    "                    per-stage busy and stall cycles as JSON\n"
                    "  --svg FILE        the placement with routes and per-unit utilization\n"
                    "  --functional      small sizes; the simulated units compute real values, checked against a\n"
                    "                    naive C++ reference (exit 1 on mismatch)\n"
                    "  --seed N          seed of the random inputs\n",
                    run_sim);

std::vector<DemoRow> sim_rows(const DemoContext& ctx) {
  std::vector<DemoRow> rows;
  for (const char* an : {"plasticine", "sn40l"}) {
    rdu::Arch arch = rdu::load_arch(an);
    for (auto& prog : rdu::graph_programs()) {
      rdu::Params p = rdu::resolve_params(prog, {}, true);
      rdu::RunResult r;
      auto c = functional_check(arch, prog, p, fresh_seed(), &r);
      std::string measure = format_count((long long)r.cycles) + " cycles";
      if (!ctx.quick) {  // timing at the default sizes
        rdu::Graph g = prog.build(prog.defaults, false, 1);
        auto full = rdu::run(arch, g);
        measure = format_count((long long)full.cycles) + " cycles (" + format_ms(full.seconds * 1e3) + ", " +
                  std::to_string(full.kernel_calls) + " call" + (full.kernel_calls > 1 ? "s" : "") + ")";
      }
      rows.push_back(DemoRow{prog.name, std::string("rdu:") + an, c.summary(), measure, c.ok});
    }
  }
  return rows;
}
MP_REGISTER_DEMO("rdu", 50, sim_rows);

std::vector<std::string> sim_info() {
  std::vector<std::string> lines;
  for (auto& n : rdu::preset_names())
    for (auto& l : rdu::load_arch(n).summary()) lines.push_back(l);
  lines.push_back("(metapipe sim <program> --arch NAME|FILE; keys in docs/rdu.md)");
  return lines;
}
MP_REGISTER_INFO("simulated accelerators", sim_info);

}  // namespace
}  // namespace mp::cli
