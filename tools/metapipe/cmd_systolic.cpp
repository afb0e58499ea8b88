// `metapipe systolic`: the systolic-array model on SCALE-Sim v2 config and topology files, writing
// SCALE-Sim's reports; plus the systolic rows of `metapipe demo`.
#include <chrono>
#include <fstream>
#include <iostream>

#include "core/compare.h"
#include "core/random.h"
#include "core/table.h"
#include "systolic/scalesim.h"
#include "systolic/systolic.h"
#include "tools/metapipe/cli.h"
#include "tools/metapipe/limits.h"
#include "tools/metapipe/progress.h"

namespace mp::cli {
namespace {

namespace fs = std::filesystem;
using namespace mp::systolic;

std::string pct(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f %%", v);
  return b;
}

int run_systolic(Args& a) {
  auto cfg_path = a.value({"-c", "--config"});
  auto topo_opt = a.value({"-t", "--topology"});
  auto input_type = a.value({"-i", "--input-type"}).value_or("conv");
  auto outdir = a.value({"-p", "--outdir"});
  auto plot = a.value({"--plot"});
  auto mode = a.value({"--mode"}).value_or("analytical");
  auto df_opt = a.value({"--dataflow"});
  const bool quiet = a.flag({"--quiet"});
  const std::int64_t max_work = limit_option(a, "--max-work", kDefaultMaxWork);
  const std::int64_t max_memory = limit_option(a, "--max-memory", kDefaultMaxMemory);
  a.positionals();
  a.finish();

  // Validate everything before anything is written.
  if (!cfg_path) throw usage_error("missing -c CONFIG.cfg (a SCALE-Sim config file)");
  if (input_type != "conv" && input_type != "gemm")
    throw usage_error("-i/--input-type must be conv or gemm, got '" + input_type + "'");
  if (mode != "analytical" && mode != "cycle")
    throw usage_error("--mode must be analytical or cycle, got '" + mode + "'");
  SimConfig cfg = read_config(*cfg_path);
  if (df_opt) {
    auto df = parse_dataflow(*df_opt);
    if (!df) throw usage_error("--dataflow must be ws, os or is, got '" + *df_opt + "'");
    cfg.array.dataflow = *df;
  }
  std::string topo = topo_opt.value_or(cfg.topology_path);
  if (topo.empty())
    throw usage_error("missing -t TOPOLOGY.csv (and " + *cfg_path +
                      " has no [network_presets] TopologyCsvLoc)");
  const auto layers = read_topology(topo, input_type == "gemm" ? TopologyKind::Gemm : TopologyKind::Conv);
  if (plot) {
    const auto ext = fs::path(*plot).extension().string();
    if (ext == ".png") throw not_supported("PNG plots; write an SVG with --plot FILE.svg");
    if (ext != ".svg") throw usage_error("--plot FILE must end in .svg, got '" + *plot + "'");
    const auto parent = fs::path(*plot).parent_path();
    if (!parent.empty() && !fs::is_directory(parent))
      throw user_error(*plot + ": the folder for --plot does not exist");
  }
  // Estimate every layer's cost (under every dataflow the plot needs) and refuse, before anything runs or
  // is written, the input that would take too long or allocate too much.
  std::vector<double> layer_work;  // under the config's dataflow, for the progress line
  double total_work = 0;
  for (Dataflow df : {Dataflow::WS, Dataflow::OS, Dataflow::IS}) {
    if (df != cfg.array.dataflow && !plot) continue;
    SimConfig c = cfg;
    c.array.dataflow = df;
    for (const auto& L : layers) {
      const LayerCost cost = estimate_cost(L, c, mode == "cycle" && df == cfg.array.dataflow);
      total_work += double(cost.work);
      if (df == cfg.array.dataflow) layer_work.push_back(double(cost.work));
      const GemmShape g = L.gemm();
      const std::string what = "layer '" + L.name + "' (M x K x N = " + std::to_string(g.M) + " x " +
                               std::to_string(g.K) + " x " + std::to_string(g.N) + " on a " +
                               std::to_string(cfg.array.rows) + "x" + std::to_string(cfg.array.cols) +
                               " array, " + std::string(dataflow_name(df)) + ")";
      if (cost.work > max_work)
        throw user_error(what + " needs about " + short_count(cost.work) +
                         (mode == "cycle" ? " PE updates and memory-model steps" : " memory-model steps") +
                         ", above the limit " + short_count(max_work) +
                         "; shrink the layer or the array, or raise --max-work");
      if (cost.bytes > max_memory)
        throw user_error(what + " needs about " + format_bytes(cost.bytes) + " of memory, above the limit " +
                         format_bytes(max_memory) + "; shrink the layer, or raise --max-memory");
    }
  }
  fs::path run_dir;
  if (outdir) {
    run_dir = fs::path(*outdir) / cfg.run_name;
    if (fs::exists(*outdir) && !fs::is_directory(*outdir))
      throw user_error(*outdir + ": -p OUTDIR exists and is not a directory");
  }

  // Simulate (in memory; nothing is written if a layer fails).
  const auto t0 = std::chrono::steady_clock::now();
  Progress progress("metapipe systolic", quiet);
  double done = 0;
  std::vector<LayerReport> reports;
  for (size_t i = 0; i < layers.size(); ++i) {
    reports.push_back(simulate_layer(layers[i], cfg));
    progress.update(done += mode == "cycle" ? layer_work[i] / 2 : layer_work[i], total_work);
  }
  std::vector<CycleCheck> checks;
  const uint64_t seed = fresh_seed();
  if (mode == "cycle") {
    for (size_t i = 0; i < layers.size(); ++i) {
      checks.push_back(simulate_layer_cycle_level(layers[i], cfg, seed + 2 * i, [&](double f) {
        progress.update(done + f * layer_work[i] / 2, total_work);
      }));
      progress.update(done += layer_work[i] / 2, total_work);
    }
  }
  std::vector<PlotSeries> series;
  if (plot) {
    for (Dataflow df : {Dataflow::WS, Dataflow::OS, Dataflow::IS}) {
      SimConfig c = cfg;
      c.array.dataflow = df;
      PlotSeries s{df, {}};
      if (df == cfg.array.dataflow) {
        s.layers = reports;
      } else {
        for (const auto& L : layers) {
          s.layers.push_back(simulate_layer(L, c));
          progress.update(done += double(estimate_cost(L, c, false).work), total_work);
        }
      }
      series.push_back(std::move(s));
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  progress.finish();

  std::cout << "metapipe systolic: " << cfg.array.rows << "x" << cfg.array.cols << " array, "
            << dataflow_name(cfg.array.dataflow) << " dataflow, SRAM " << cfg.ifmap_sram_kb << "/"
            << cfg.filter_sram_kb << "/" << cfg.ofmap_sram_kb << " kB (ifmap/filter/ofmap), bandwidth "
            << (cfg.user_bandwidth ? "USER " + std::to_string(cfg.bandwidth[0]) + " words/cycle"
                                   : std::string("CALC"))
            << ", " << layers.size() << " layer(s) from " << topo << "\n\n";
  std::vector<std::string> head = {"layer",  "M x K x N",    "total cycles",
                                   "stalls", "overall util", "mapping eff"};
  if (mode == "cycle") head.push_back("cycle-level check (compute cycles, without stalls)");
  Table t(head);
  bool ok = true;
  for (size_t i = 0; i < reports.size(); ++i) {
    const auto& r = reports[i];
    std::vector<std::string> row = {
        r.name,
        std::to_string(r.gemm.M) + " x " + std::to_string(r.gemm.K) + " x " + std::to_string(r.gemm.N),
        format_count(r.total_cycles),
        format_count(r.stall_cycles),
        pct(r.overall_util),
        pct(r.mapping_eff)};
    if (mode == "cycle") {
      const auto& c = checks[i];
      const auto expect = analyze_gemm(r.gemm, cfg.array).cycles;
      const bool good = c.product_ok && c.cycles == expect;
      ok = ok && good;
      char b[160];
      std::snprintf(b, sizeof b, "%s: %s cycles (analytical %s), product max abs err %.1e",
                    good ? "ok" : "FAIL", format_count(c.cycles).c_str(), format_count(expect).c_str(),
                    c.max_abs_err);
      row.push_back(b);
    }
    t.add(row);
  }
  t.print(std::cout);
  std::cout << "\nsimulated in " << format_ms(secs * 1e3);
  if (mode == "cycle") std::cout << " (cycle-level operands: random, seed " << seed << ")";
  std::cout << "\n";

  if (outdir) {
    fs::create_directories(run_dir);
    write_reports(run_dir, reports);
    std::cout << "reports: " << (run_dir / "COMPUTE_REPORT.csv").string() << ", BANDWIDTH_REPORT.csv, "
              << "DETAILED_ACCESS_REPORT.csv\n";
  }
  if (plot) {
    std::ofstream f(*plot, std::ios::binary);
    if (!f) throw user_error(*plot + ": cannot write the plot");
    f << plot_svg(cfg.run_name + ": " + std::to_string(cfg.array.rows) + "x" +
                      std::to_string(cfg.array.cols) + " array, per-layer utilization and cycles by dataflow",
                  series);
    std::cout << "plot: " << *plot << "\n";
  }
  return ok ? 0 : 1;
}

MP_REGISTER_COMMAND(
    "systolic", "systolic-array model (WS/OS/IS), SCALE-Sim v2 compatible config, topology and reports",
    "usage: metapipe systolic -c CONFIG.cfg [-t TOPOLOGY.csv] [-i conv|gemm] [-p OUTDIR]\n"
    "                         [--mode analytical|cycle] [--dataflow ws|os|is] [--plot FILE.svg]\n"
    "                         [--max-work N] [--max-memory B] [--quiet]\n\n"
    "Runs every layer of a topology on the systolic array a SCALE-Sim v2 config describes and writes\n"
    "SCALE-Sim's reports (COMPUTE_REPORT.csv, BANDWIDTH_REPORT.csv, DETAILED_ACCESS_REPORT.csv) to\n"
    "OUTDIR/RUN_NAME/. With InterfaceBandwidth CALC the numbers equal SCALE-Sim v2's.\n\n"
    "  -c, --config FILE      SCALE-Sim .cfg (ArrayHeight, ArrayWidth, *SramSzkB, Dataflow, ...)\n"
    "  -t, --topology FILE    topology CSV (default: the config's TopologyCsvLoc)\n"
    "  -i, --input-type T     conv (name, IFMAP h, w, filter h, w, channels, filters, stride) or\n"
    "                         gemm (name, M, N, K); default conv\n"
    "  -p, --outdir DIR       write the reports under DIR/RUN_NAME/ (nothing is written on bad input)\n"
    "  --mode M               analytical (default) or cycle: also run every layer's GEMM on the\n"
    "                         cycle-level PE array, check the product and that the cycles agree\n"
    "  --dataflow D           override the config's Dataflow (ws, os, is)\n"
    "  --plot FILE.svg        chart per-layer utilization and cycles under all three dataflows\n"
    "  --max-work N           refuse a layer whose estimated steps (array cycles x (R + C) operand\n"
    "                         words for the memory model, + R x C PE updates per cycle in cycle mode)\n"
    "                         exceed N (default 20G, about a minute; suffixes k, M, G, T)\n"
    "  --max-memory B         refuse a layer that would allocate more than B bytes (default 8GiB;\n"
    "                         suffixes k, M, G, T, Ki, Mi, Gi, Ti, optional B)\n"
    "  --quiet                no progress line (shown on a terminal once a run takes 2 s)\n\n"
    "example: metapipe systolic -c tests/systolic/data/gemm_32x32_ws.cfg -t tests/systolic/data/gemm64.csv "
    "\\\n"
    "           -i gemm -p runs\n",
    run_systolic);

// Demo rows: a cycle-level GEMM checked against a reference product, and the two modes agreeing.
std::vector<DemoRow> systolic_demo(const DemoContext& ctx) {
  if (!ctx.wants("systolic")) return {};
  std::vector<DemoRow> rows;
  const GemmShape g = ctx.quick ? GemmShape{48, 40, 36} : GemmShape{128, 96, 80};
  const uint64_t seed = fresh_seed();
  const auto I = random_floats(static_cast<size_t>(g.M * g.K), seed);
  const auto W = random_floats(static_cast<size_t>(g.K * g.N), seed + 1);
  std::vector<double> ref(static_cast<size_t>(g.M * g.N), 0.0);
  for (std::int64_t m = 0; m < g.M; ++m)
    for (std::int64_t k = 0; k < g.K; ++k)
      for (std::int64_t n = 0; n < g.N; ++n) ref[m * g.N + n] += double(I[m * g.K + k]) * W[k * g.N + n];
  for (Dataflow df : {Dataflow::WS, Dataflow::OS, Dataflow::IS}) {
    const ArrayConfig arr{16, 16, df};
    const std::string name = "gemm " + std::to_string(g.M) + "x" + std::to_string(g.K) + "x" +
                             std::to_string(g.N) + " " + std::string(dataflow_name(df));
    const auto sim = simulate_gemm(g, arr, I, W);
    const auto cmp = compare(sim.output, ref, 1e-5, 1e-5);
    const auto ana = analyze_gemm(g, arr);
    DemoRow r{name, "systolic:16x16 cycle-level", cmp.summary(), format_count(sim.cycles) + " cycles",
              cmp.ok};
    rows.push_back(r);
    const bool agree = ana.cycles == sim.cycles;
    rows.push_back({name, "systolic:16x16 analytical",
                    agree
                        ? "ok (== cycle-level cycles)"
                        : "FAIL: analytical " + format_count(ana.cycles) + " != " + format_count(sim.cycles),
                    format_count(ana.cycles) + " cycles", agree});
  }
  return rows;
}
MP_REGISTER_DEMO("systolic", 40, systolic_demo);

}  // namespace
}  // namespace mp::cli
