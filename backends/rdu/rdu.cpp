// The driver: mapping -> place & route -> simulation per kernel call -> one report.
#include "backends/rdu/rdu.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mp::rdu {

RunResult run(const Arch& a, Graph& g, const RunOptions& opt) {
  if (g.tensors.size() && g.tensors.front().base < 0) g.layout();
  RunResult R;
  R.program = g.name;
  R.arch = a.name;
  R.mapping = map_graph(a, g, opt.map);
  if (opt.place) {
    for (const Config& cf : R.mapping.configs) R.placements.push_back(place_and_route(a, cf, opt.seed));
    // A stage that the mesh slows (its input nets sharing links) may no longer keep up with the memory
    // streams at the parallelism chosen for it unslowed: map again knowing the slowdown, and keep the new
    // mapping when it changes some stage's parallelism and, placed again, its slowest compute stage is
    // faster.
    MapOptions again = opt.map;
    again.stage_slowdown.assign(g.stages.size(), 1.0);
    bool slowed = false;
    for (size_t c = 0; c < R.mapping.configs.size(); ++c) {
      const Config& cf = R.mapping.configs[c];
      for (size_t s = 0; s < cf.stages.size(); ++s) {
        const int o = cf.original_stage[s];
        if (o < 0 || R.placements[c].stage_slowdown[s] <= 1) continue;
        again.stage_slowdown[size_t(o)] =
            std::max(again.stage_slowdown[size_t(o)], R.placements[c].stage_slowdown[s]);
        slowed = true;
      }
    }
    if (slowed) {
      Mapping m = map_graph(a, g, again);
      auto pars = [](const Mapping& x) {
        std::vector<int> p;
        for (const Config& cf : x.configs)
          for (const StageMap& sm : cf.stages) p.push_back(sm.par);
        return p;
      };
      if (pars(m) != pars(R.mapping)) {
        std::vector<Placement> placed;
        for (const Config& cf : m.configs) placed.push_back(place_and_route(a, cf, opt.seed));
        // The new copies bring nets of their own; they are kept only if the slowest compute stage, as
        // placed, is faster than before.
        auto slowest = [](const Mapping& x, const std::vector<Placement>& pl) {
          double worst = 0;
          for (size_t c = 0; c < x.configs.size(); ++c)
            for (size_t s = 0; s < x.configs[c].stages.size(); ++s)
              if (x.configs[c].graph.stages[s].kind == StageKind::Compute)
                worst = std::max(worst, double(x.configs[c].stages[s].ii) * pl[c].stage_slowdown[s] *
                                            double(x.configs[c].graph.stages[s].iterations));
          return worst;
        };
        if (slowest(m, placed) < slowest(R.mapping, R.placements)) {
          R.mapping = std::move(m);
          R.placements = std::move(placed);
        }
      }
    }
  }
  R.notes = R.mapping.notes;
  R.kernel_calls = R.mapping.kernel_calls();
  double pmu_time = 0;
  // Progress counts stage iterations over all kernel calls.
  double iterations_all = 0, iterations_before = 0;
  for (const Config& cf : R.mapping.configs)
    for (const Stage& s : cf.graph.stages) iterations_all += double(s.iterations);
  for (size_t c = 0; c < R.mapping.configs.size(); ++c) {
    Config& cf = R.mapping.configs[c];
    if (!cf.why.empty())
      R.split_reasons.push_back("kernel call " + std::to_string(c + 1) + " ends: " + cf.why);
    // Functional data flows between calls through the off-chip tensors (by name).
    if (opt.functional && c > 0)
      for (auto& t : cf.graph.tensors)
        for (auto& pt : R.mapping.configs[c - 1].graph.tensors)
          if (pt.name == t.name && (!pt.host.empty() || !pt.objs.empty())) t.host = pt.host, t.objs = pt.objs;
    SimOptions so;
    so.functional = opt.functional;
    if (opt.place) {
      const Placement& P = R.placements[c];
      so.stage_extra_latency = P.stage_extra_latency;
      for (size_t s = 0; s < cf.stages.size(); ++s)
        if (P.stage_slowdown[s] > 1) {
          cf.stages[s].ii = int64_t(std::ceil(double(cf.stages[s].ii) * P.stage_slowdown[s]));
          R.notes.push_back("stage '" + cf.graph.stages[s].name + "' slowed " +
                            std::to_string(P.stage_slowdown[s]).substr(0, 4) +
                            "x by an over-subscribed mesh link");
        }
      R.total_hops += P.total_hops;
      R.max_hops = std::max(R.max_hops, P.max_hops);
      if (P.worst_link_load >= R.worst_link_load) {
        R.worst_link_load = P.worst_link_load;
        R.worst_link = P.worst_link + (R.kernel_calls > 1 ? " in call " + std::to_string(c + 1) : "");
      }
    }
    if (opt.progress && iterations_all > 0)
      so.progress = [&](int64_t finished, int64_t) {
        opt.progress((iterations_before + double(finished)) / iterations_all);
      };
    ConfigResult cr = simulate_config(a, cf, so);
    for (const Stage& s : cf.graph.stages) iterations_before += double(s.iterations);
    for (auto& s : cr.stages) s.config = int(c);
    // Reconfiguration between kernel calls; the first configuration is loaded before the run starts.
    R.cycles += cr.cycles + (c > 0 ? double(a.config_cycles) : 0);
    R.bytes_read += cr.bytes_read;
    R.bytes_written += cr.bytes_written;
    R.bursts += cr.bursts;
    R.row_misses += cr.row_misses;
    R.refreshes += cr.refreshes;
    R.turnarounds += cr.turnarounds;
    R.events += cr.events;
    R.pcu_util += cr.pcu_busy;
    R.agcu_util += cr.agcu_busy;
    pmu_time += double(cf.pmus) * cr.cycles;
    R.pcus_used = std::max(R.pcus_used, cf.pcus);
    R.pmus_used = std::max(R.pmus_used, cf.pmus);
    R.agcus_used = std::max(R.agcus_used, cf.agcus);
    R.stages.insert(R.stages.end(), cr.stages.begin(), cr.stages.end());
    R.configs.push_back(std::move(cr));
  }
  if (opt.functional)
    for (auto& t : g.tensors)
      for (auto& cf : R.mapping.configs)
        for (auto& ct : cf.graph.tensors)
          if (ct.name == t.name && (!ct.host.empty() || !ct.objs.empty()))
            t.host = ct.host, t.objs = ct.objs;  // last call wins
  const double T = std::max(1.0, R.cycles);
  R.seconds = R.cycles / (a.clock_ghz * 1e9);
  R.pcu_util /= T * a.pcus();
  R.pmu_util = pmu_time / (T * a.pmus());
  R.agcu_util /= T * a.agcus;
  const double peak_bps = a.memory().peak_gbs() * 1e9;
  R.load_bw_pct = R.seconds > 0 ? 100.0 * double(R.bytes_read) / R.seconds / peak_bps : 0;
  R.store_bw_pct = R.seconds > 0 ? 100.0 * double(R.bytes_written) / R.seconds / peak_bps : 0;
  R.flops = g.total_flops();
  R.compute_roof_cycles = R.flops / a.peak_flops_per_cycle();
  R.memory_roof_cycles =
      double(g.offchip_bytes(false) + g.offchip_bytes(true)) / (peak_bps / (a.clock_ghz * 1e9));
  return R;
}

}  // namespace mp::rdu
