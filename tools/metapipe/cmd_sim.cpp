// `metapipe sim`: a program compiled onto the simulated reconfigurable dataflow accelerator (Plasticine /
// SN40L presets or an architecture file), simulated cycle by cycle; plus its demo rows and `info` section.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "backends/rdu/arch.h"
#include "backends/rdu/lower.h"
#include "backends/rdu/rdu.h"
#include "backends/rdu/report.h"
#include "backends/rdu/tile_choice.h"
#include "core/compare.h"
#include "core/random.h"
#include "examples/registry.h"
#include "examples/run.h"
#include "ir/eval.h"
#include "tools/metapipe/cli.h"
#include "tools/metapipe/limits.h"
#include "tools/metapipe/progress.h"
#include "tools/metapipe/sim_llama.h"

namespace mp::cli {
namespace {

struct SimOutcome {
  rdu::RunResult r;
  std::string params;  // "K=... M=..."
  std::string check;   // functional only
  bool ok = true;
};

bool is_arch_key(const std::string& assignment) {
  std::string k = assignment.substr(0, assignment.find('='));
  return k.find('.') != std::string::npos || k == "clock_ghz" || k == "program_memory";
}

// A registry program: build, compile (tile -> fuse -> parallelize -> metapipeline), lower, simulate; with
// `functional`, the simulated stages evaluate the IR on tiles and the outputs are checked like `metapipe
// run`.
struct Limits {
  int64_t work = rdu::kDefaultMaxEvents, memory = cpu::kDefaultMaxMemory;
  bool quiet = false;  // --quiet: no progress line
};

// Refuses, before the simulation starts, a graph whose estimated events exceed the limit.
void check_work(const rdu::Arch& arch, const rdu::Graph& g, const examples::ProgramSpec& spec,
                int64_t limit) {
  const int64_t events = rdu::estimate_events(arch, g);
  if (events > limit)
    throw user_error("program '" + spec.name + "' with these parameters needs about " + short_count(events) +
                     " simulation events (stage iterations and memory bursts), above the limit " +
                     short_count(limit) + "; make its sizes smaller (--set), or raise --max-work");
}

SimOutcome sim_ir(const rdu::Arch& arch, const examples::ProgramSpec& spec,
                  const std::vector<std::string>& sets, bool functional, uint64_t seed, const Limits& lim) {
  SimOutcome out;
  examples::Params params = examples::resolve(spec, sets);
  ir::Program p = examples::build(spec, params);
  ir::Program c = passes::compile(p, examples::compile_options(params));
  if (!functional) {
    rdu::Graph g = rdu::lower(c);
    check_work(arch, g, spec, lim.work);
    Progress bar("metapipe sim", lim.quiet);
    rdu::RunOptions o;
    o.progress = [&](double f) { bar.update(f, 1); };
    // Tiles the user did not fix are chosen for the architecture (rdu/tile_choice.h); --set keeps one.
    rdu::TileSearch ts;
    for (auto& prm : spec.params) {
      const bool fixed = std::any_of(sets.begin(), sets.end(),
                                     [&](const std::string& x) { return x.rfind(prm.name + "=", 0) == 0; });
      if (!fixed && prm.def.find_first_not_of("0123456789") == std::string::npos && !prm.def.empty())
        ts.defaults[prm.name] = params.i(prm.name);
    }
    ts.max_events = lim.work;
    ts.build = [&](const rdu::TileValues& v) {
      std::vector<std::string> with = sets;
      for (auto& [k, x] : v) with.push_back(k + "=" + std::to_string(x));
      examples::Params pv = examples::resolve(spec, with);
      return rdu::lower(passes::compile(examples::build(spec, pv), examples::compile_options(pv)));
    };
    rdu::TileChoice choice = rdu::choose_tiles(arch, ts, o);
    out.r = std::move(choice.result);
    if (choice.changed) {
      std::vector<std::string> with = sets;
      for (auto& [k, x] : choice.values) with.push_back(k + "=" + std::to_string(x));
      params = examples::resolve(spec, with);
      out.r.notes.insert(out.r.notes.begin(), choice.why);
    }
    for (auto& [k, v] : params.values) out.params += " " + k + "=" + v;
    return out;
  }
  for (auto& [k, v] : params.values) out.params += " " + k + "=" + v;
  check_memory(spec, params, lim.memory);
  check_work(arch, rdu::lower(c), spec, lim.work);
  examples::HostInputs in = examples::make_inputs(spec, params, p, seed);
  examples::HostOutputs ref = spec.reference(params, in);
  ir::Memory mem = ir::make_memory(c, in);
  rdu::Graph g = rdu::lower(c, &mem);
  rdu::RunOptions o;
  o.functional = true;
  Progress bar("metapipe sim", lim.quiet);
  o.progress = [&](double f) { bar.update(f, 1); };
  out.r = rdu::run(arch, g, o);
  bar.finish();
  const double rtol = examples::output_tolerance(c);
  const examples::HostOutputs mags = examples::magnitudes_of(spec, params, in);
  double worst = 0;
  for (auto& [name, want] : ref) {
    auto cmp = compare(mem.at(name).data, want, rtol, examples::check_atol(name, want, mags, rtol));
    if (!cmp.ok && out.ok) out.check = name + ": " + cmp.summary(), out.ok = false;
    worst = std::max(worst, cmp.max_rel_err);
  }
  if (out.ok) {
    char b[64];
    std::snprintf(b, sizeof b, "ok (max rel %.1e)", worst);
    out.check = b;
  }
  return out;
}
std::string program_names() {
  std::string names;
  for (auto* p : examples::programs()) names += (names.empty() ? "" : ", ") + p->name;
  return names;
}

// NAME: a registry program, compiled and lowered (front end -> IR -> passes -> lowering -> simulation).
SimOutcome simulate(const rdu::Arch& arch, const std::string& name, const std::vector<std::string>& sets,
                    bool functional, uint64_t seed, const Limits& lim) {
  for (auto* p : examples::programs())
    if (p->name == name) return sim_ir(arch, *p, sets, functional, seed, lim);
  throw usage_error("unknown program '" + name + "' for metapipe sim (programs: " + program_names() + ")");
}

int run_sim(Args& a) {
  if (is_sim_llama(a)) return run_sim_llama(a);
  auto arch_name = a.value({"--arch"});
  auto sets = a.values({"--set"});
  bool json = a.flag({"--json"});
  bool functional = a.flag({"--functional"});
  auto svg = a.value({"--svg"});
  auto seed_opt = a.integer({"--seed"});
  Limits lim;
  lim.work = limit_option(a, "--max-work", rdu::kDefaultMaxEvents);
  lim.memory = limit_option(a, "--max-memory", cpu::kDefaultMaxMemory);
  lim.quiet = a.flag({"--quiet"});
  auto pos = a.positionals();
  a.finish();
  if (pos.size() != 1)
    throw usage_error("metapipe sim needs one program (" + program_names() + "); see metapipe sim --help");
  rdu::Arch arch = rdu::load_arch(arch_name.value_or("plasticine"));
  // --set NAME=VALUE: architecture keys (dotted, clock_ghz, program_memory) or program parameters.
  std::vector<std::string> prog_sets;
  for (auto& s : sets) {
    if (is_arch_key(s))
      rdu::apply_override(arch, s);
    else
      prog_sets.push_back(s);
  }
  uint64_t seed = seed_opt ? uint64_t(*seed_opt) : fresh_seed();
  SimOutcome o = simulate(arch, pos[0], prog_sets, functional, seed, lim);
  const rdu::RunResult& r = o.r;
  if (svg) {
    std::ofstream f(*svg);
    if (!f) throw user_error("--svg: cannot write '" + *svg + "'");
    f << rdu::render_svg(arch, r, 0);
  }
  if (json) {
    rdu::print_json(std::cout, arch, r);
  } else {
    std::cout << "parameters:" << o.params << "\n";
    rdu::print_text(std::cout, arch, r);
    if (functional)
      std::cout << "\nfunctional check vs naive C++ reference (seed " << seed << "): " << o.check << "\n";
    if (svg) std::cout << "placement picture: " << *svg << "\n";
  }
  return o.ok ? 0 : 1;
}

MP_REGISTER_COMMAND(
    "sim", "simulate a program on the dataflow accelerator (Plasticine, SN40L, or an arch file)",
    "usage: metapipe sim <program> [--arch NAME|FILE] [--set NAME=VALUE ...] [--json] [--svg FILE]\n"
    "                    [--functional] [--seed N] [--quiet]\n"
    "       metapipe sim llama [--arch NAME|FILE] [--model FILE.gguf | --shapes PRESET] [--tokens N]\n"
    "                    [--context C] [--fuse per-op|per-layer|all] [--sockets S] [--weight-tile ROWS]\n"
    "                    [--layers K] [--details] [--no-place] [--functional] [--json]\n"
    "                    (one Llama decode token; docs/rdu.md, \"Llama on the SN40L\")\n\n"
    "Maps the program's metapipeline onto a reconfigurable dataflow accelerator (stages to PCUs,\n"
    "buffers to PMUs, loads and stores to AGCUs; several kernel calls when it does not fit), places\n"
    "and routes it on the mesh, and simulates it cycle by cycle (event-driven, token-based, with a\n"
    "DRAM model of bursts, banks, refresh and bus turnaround).\n\n"
    "programs: those of `metapipe list` (written in the front end), compiled by tile -> fuse ->\n"
    "parallelize -> metapipeline and lowered to the simulator's stage graph\n\n"
    "  --arch NAME|FILE  preset (plasticine, sn40l; default plasticine) or an .arch file (docs/rdu.md)\n"
    "  --set NAME=VALUE  a program parameter (e.g. N=4096) or an architecture key (dotted names,\n"
    "                    clock_ghz, program_memory)\n"
    "                    e.g. pcu.lanes=32, memory.ddr.channels=1; repeatable. The tiles of a\n"
    "                    streaming program not fixed here are chosen for the architecture by a\n"
    "                    search on the cycle model (the report's \"tile chosen\" note)\n"
    "  --json            cycles, seconds, kernel_calls, utilization, off-chip bytes and bandwidth,\n"
    "                    per-stage busy and stall cycles as JSON\n"
    "  --svg FILE        the placement with routes and per-unit utilization\n"
    "  --functional      the simulated units compute real values, checked against the program's\n"
    "                    naive C++ reference (exit 1 on mismatch)\n"
    "  --seed N          seed of the random inputs\n"
    "  --max-work N      refuse a program whose estimated simulation events (stage iterations and\n"
    "                    memory bursts) exceed N (default 500M; suffixes k, M, G, T)\n"
    "  --max-memory B    with --functional, refuse a program whose tensors need more than B bytes\n"
    "                    of host memory (default 8GiB; suffixes k, M, G, T, Ki, Mi, Gi, Ti)\n"
    "  --quiet           no progress line (shown on stderr, when it is a terminal, once a\n"
    "                    simulation takes 2 s)\n",
    run_sim);

std::vector<DemoRow> sim_rows(const DemoContext& ctx) {
  if (!ctx.wants("rdu")) return {};
  std::vector<DemoRow> rows;
  for (const char* an : {"plasticine", "sn40l"}) {
    rdu::Arch arch = rdu::load_arch(an);
    for (auto* spec : examples::programs()) {  // functional at the programs' default sizes
      try {
        const uint64_t seed = fresh_seed();
        SimOutcome o = sim_ir(arch, *spec, {}, true, seed, Limits{});
        // a failure names its seed, so that `metapipe sim NAME --arch A --functional --seed N` repeats it
        if (!o.ok) o.check += " seed " + std::to_string(seed);
        rows.push_back(DemoRow{spec->name, std::string("rdu:") + an, o.check,
                               format_count((long long)o.r.cycles) + " cycles (" +
                                   format_ms(o.r.seconds * 1e3) + ", " + std::to_string(o.r.kernel_calls) +
                                   " call" + (o.r.kernel_calls > 1 ? "s" : "") + ")",
                               o.ok});
      } catch (const not_supported& e) {
        rows.push_back(
            DemoRow{spec->name, std::string("rdu:") + an, std::string("skipped: ") + e.what(), "-", true});
      }
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
