// Simulated-annealing placement and congestion-aware routing on the switch mesh.
#include "backends/rdu/place_route.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <queue>
#include <random>

#include "core/error.h"

namespace mp::rdu {
namespace {

struct Grid {
  int rows, cols;
  int links() const { return rows * cols * 2; }
  // link between switch (x,y) and its right (dir 0) or lower (dir 1) neighbour
  int link(int x, int y, int dir) const { return (y * cols + x) * 2 + dir; }
};

int clampx(int x, int cols) { return std::clamp(x, 0, cols - 1); }

// XY path between two switches (x first), as link ids.
void xy_links(const Grid& g, int x0, int y0, int x1, int y1, std::vector<int>& out) {
  out.clear();
  x0 = clampx(x0, g.cols);
  x1 = clampx(x1, g.cols);
  for (int x = std::min(x0, x1); x < std::max(x0, x1); ++x) out.push_back(g.link(x, y0, 0));
  for (int y = std::min(y0, y1); y < std::max(y0, y1); ++y) out.push_back(g.link(x1, y, 1));
}

}  // namespace

Placement place_and_route(const Arch& a, const Config& cfg, uint64_t seed) {
  const Graph& g = cfg.graph;
  Placement P;
  P.rows = a.rows;
  P.cols = a.cols;
  Grid grid{a.rows, a.cols};
  // Units.
  std::vector<std::vector<int>> stage_heads(g.stages.size()), stage_tails(g.stages.size());
  std::vector<std::vector<int>> buf_units(g.buffers.size());
  for (size_t s = 0; s < g.stages.size(); ++s) {
    const StageMap& m = cfg.stages[s];
    if (g.stages[s].kind != StageKind::Compute) {
      for (int k = 0; k < std::max(1, m.agcus); ++k) {
        P.units.push_back({UnitKind::AGCU, int(s), g.stages[s].name});
        stage_heads[s].push_back(int(P.units.size()) - 1);
        stage_tails[s].push_back(int(P.units.size()) - 1);
      }
      continue;
    }
    for (int c = 0; c < m.par; ++c) {
      int prev = -1;
      for (int k = 0; k < m.chain; ++k) {
        P.units.push_back({UnitKind::PCU, int(s), g.stages[s].name});
        int u = int(P.units.size()) - 1;
        if (k == 0) stage_heads[s].push_back(u);
        if (prev >= 0) P.nets.push_back({prev, u, double(a.pcu_lanes * 4), int(s), {}});
        prev = u;
      }
      stage_tails[s].push_back(prev);
    }
  }
  for (size_t b = 0; b < g.buffers.size(); ++b)
    for (int k = 0; k < cfg.buffers[b].pmus; ++k) {
      P.units.push_back({UnitKind::PMU, int(b), g.buffers[b].name});
      buf_units[b].push_back(int(P.units.size()) - 1);
    }
  // Nets with bandwidth demand (bytes per cycle while the stage runs).
  // A load or store streams at most what its memory can deliver.
  const double mem_bpc = a.memory().peak_gbs() / a.clock_ghz;
  for (size_t s = 0; s < g.stages.size(); ++s) {
    const Stage& S = g.stages[s];
    double ii = double(std::max<int64_t>(1, cfg.stages[s].ii));
    const bool agcu = S.kind != StageKind::Compute;
    int copies = int(stage_heads[s].size());
    for (auto& in : S.inputs) {
      double d = double(g.buffers[in.buffer].bytes) / ii / copies;
      // a store stream: at most what the memory takes and the buffer's PMUs deliver, shared by its AGCUs
      if (agcu)
        d = std::min({d * copies, mem_bpc, double(a.link_bytes) * cfg.buffers[in.buffer].pmus}) / copies;
      auto& bu = buf_units[in.buffer];
      if (bu.empty()) continue;  // control tokens
      for (int c = 0; c < copies; ++c)
        P.nets.push_back({bu[c % bu.size()], stage_heads[s][c], d, int(s), {}});
    }
    for (int b : S.outputs) {
      double d = double(g.buffers[b].bytes) / double(S.accumulate) / ii / copies;
      if (agcu) d = std::min({d * copies, mem_bpc, double(a.link_bytes) * cfg.buffers[b].pmus}) / copies;
      auto& bu = buf_units[b];
      if (bu.empty()) continue;
      for (int c = 0; c < copies; ++c)
        P.nets.push_back({stage_tails[s][c], bu[c % bu.size()], d, int(s), {}});
    }
  }
  // Sites.
  std::vector<std::pair<int, int>> pcu_sites, pmu_sites, ag_sites;
  for (int y = 0; y < a.rows; ++y)
    for (int x = 0; x < a.cols; ++x) (a.is_pcu(y, x) ? pcu_sites : pmu_sites).push_back({x, y});
  for (int k = 0; k < a.agcus; ++k) {
    int side = k % 2, idx = k / 2, per_side = (a.agcus + 1) / 2;
    int y = int((idx + 0.5) * a.rows / per_side);
    ag_sites.push_back({side ? a.cols : -1, std::min(y, a.rows - 1)});
  }
  auto sites_of = [&](UnitKind k) -> std::vector<std::pair<int, int>>& {
    return k == UnitKind::PCU ? pcu_sites : k == UnitKind::PMU ? pmu_sites : ag_sites;
  };
  // Initial placement: shuffle each kind's sites (deterministic seed), then anneal. When a configuration has
  // more memory streams than AGCUs, streams share AGCUs round-robin and those stay where they are.
  std::mt19937_64 rng(seed);
  std::map<std::pair<int, int>, int> occ;  // site -> unit (annealed kinds only)
  std::vector<bool> fixed(P.units.size(), false);
  for (int k = 0; k < 3; ++k) {
    std::vector<int> us;
    for (size_t i = 0; i < P.units.size(); ++i)
      if (int(P.units[i].kind) == k) us.push_back(int(i));
    auto sites = sites_of(UnitKind(k));
    MP_INTERNAL_CHECK(k == int(UnitKind::AGCU) || us.size() <= sites.size(), "more units than sites of kind ",
                      k, " in configuration '", g.name, "'");
    std::shuffle(sites.begin(), sites.end(), rng);
    const bool shared = us.size() > sites.size();
    for (size_t i = 0; i < us.size(); ++i) {
      auto& u = P.units[size_t(us[i])];
      u.x = sites[i % sites.size()].first, u.y = sites[i % sites.size()].second;
      if (shared)
        fixed[size_t(us[i])] = true;
      else
        occ[{u.x, u.y}] = us[i];
    }
  }

  std::vector<std::vector<int>> nets_of(P.units.size());
  for (size_t n = 0; n < P.nets.size(); ++n) {
    nets_of[P.nets[n].from].push_back(int(n));
    if (P.nets[n].to != P.nets[n].from) nets_of[P.nets[n].to].push_back(int(n));
  }
  // Cost: demand-weighted Manhattan length + congestion (overflow of the XY route's links, squared).
  std::vector<double> usage(grid.links(), 0.0);
  std::vector<int> tmp;
  const double cap = a.link_bytes;
  auto net_len = [&](const Net& n) {
    auto& u = P.units[n.from];
    auto& v = P.units[n.to];
    return std::abs(clampx(u.x, a.cols) - clampx(v.x, a.cols)) + std::abs(u.y - v.y);
  };
  auto link_pen = [&](double use) { return use > cap ? (use - cap) * (use - cap) / cap : 0.0; };
  auto apply = [&](int n, double sign) {
    auto& N = P.nets[n];
    auto& u = P.units[N.from];
    auto& v = P.units[N.to];
    xy_links(grid, u.x, u.y, v.x, v.y, tmp);
    double pen = 0;
    for (int l : tmp) {
      pen -= link_pen(usage[l]);
      usage[l] += sign * N.demand;
      pen += link_pen(usage[l]);
    }
    return pen;
  };
  auto wire = [&](int n) { return (1.0 + P.nets[n].demand / cap) * net_len(P.nets[n]); };
  double cost = 0;
  for (size_t n = 0; n < P.nets.size(); ++n) cost += wire(int(n)) + apply(int(n), +1);
  P.wire_cost_initial = cost;

  const int nunits = int(P.units.size());
  const int64_t moves = std::min<int64_t>(1600000, int64_t(1200) * std::max(1, nunits));
  double temp = 2.0 + double(a.rows + a.cols) / 4;
  const double temp0 = temp;
  const double cool = std::pow(0.01 / temp, 1.0 / double(std::max<int64_t>(1, moves / 100)));
  std::uniform_real_distribution<double> U(0, 1);
  std::vector<int> touched;
  for (int64_t it = 0; it < moves && nunits > 1; ++it) {
    int ui = int(rng() % nunits);
    if (fixed[size_t(ui)]) continue;
    auto& sites = sites_of(P.units[ui].kind);
    auto site = sites[rng() % sites.size()];
    // Moves stay within a window around the unit that shrinks with the temperature: once the placement
    // has settled, a jump across the chip is almost always rejected, while a step to a neighbouring site
    // (a MatMul copy next to the PMU it reads) is what still pays.
    if (P.units[ui].kind != UnitKind::AGCU) {
      const int radius = std::max(2, int(std::ceil(double(std::max(a.rows, a.cols)) * temp / temp0)));
      for (int tries = 0; tries < 8; ++tries) {
        const int x = P.units[ui].x + int(rng() % uint64_t(2 * radius + 1)) - radius;
        const int y = P.units[ui].y + int(rng() % uint64_t(2 * radius + 1)) - radius;
        if (x < 0 || y < 0 || x >= a.cols || y >= a.rows) continue;
        if (a.is_pcu(y, x) != (P.units[ui].kind == UnitKind::PCU)) continue;
        site = {x, y};
        break;
      }
    }
    auto it_occ = occ.find(site);
    int uj = it_occ == occ.end() ? -1 : it_occ->second;
    if (uj == ui || (uj >= 0 && fixed[size_t(uj)])) continue;
    touched.clear();
    for (int n : nets_of[ui]) touched.push_back(n);
    if (uj >= 0)
      for (int n : nets_of[uj]) touched.push_back(n);
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    double before = 0, after = 0;
    for (int n : touched) before += wire(n) - 0, after += 0;
    double d_rm = 0;
    for (int n : touched) d_rm += apply(n, -1);
    auto old = std::make_pair(P.units[ui].x, P.units[ui].y);
    P.units[ui].x = site.first, P.units[ui].y = site.second;
    if (uj >= 0) P.units[uj].x = old.first, P.units[uj].y = old.second;
    double d_add = 0;
    for (int n : touched) after += wire(n), d_add += apply(n, +1);
    double delta = after - before + d_rm + d_add;
    if (delta <= 0 || U(rng) < std::exp(-delta / temp)) {
      cost += delta;
      occ.erase(old);
      occ[site] = ui;
      if (uj >= 0) occ[old] = uj;
    } else {  // undo
      for (int n : touched) apply(n, -1);
      P.units[ui].x = old.first, P.units[ui].y = old.second;
      if (uj >= 0) P.units[uj].x = site.first, P.units[uj].y = site.second;
      for (int n : touched) apply(n, +1);
    }
    if (it % 100 == 99) temp *= cool;
  }
  P.wire_cost_final = cost;

  // Routing: nets in order of decreasing demand, Dijkstra over switches; a link's cost grows with its load
  // relative to its width, so later nets detour around full links when a detour is short.
  std::fill(usage.begin(), usage.end(), 0.0);
  std::vector<int> order(P.nets.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int x, int y) { return P.nets[x].demand > P.nets[y].demand; });
  const int S = a.rows * a.cols;
  std::vector<double> dist(size_t(S), 1e300);
  std::vector<int> prev(size_t(S), -1);
  std::vector<int> touched_nodes;
  for (int n : order) {
    Net& N = P.nets[n];
    auto& u = P.units[N.from];
    auto& v = P.units[N.to];
    int s0 = u.y * a.cols + clampx(u.x, a.cols), s1 = v.y * a.cols + clampx(v.x, a.cols);
    // A* (every link costs at least 1, so the Manhattan distance never overestimates)
    const int tx = s1 % a.cols, ty = s1 / a.cols;
    auto h = [&](int s) { return double(std::abs(s % a.cols - tx) + std::abs(s / a.cols - ty)); };
    for (int s : touched_nodes) dist[size_t(s)] = 1e300, prev[size_t(s)] = -1;
    touched_nodes.clear();
    using QE = std::pair<double, int>;
    std::priority_queue<QE, std::vector<QE>, std::greater<QE>> pq;
    dist[size_t(s0)] = 0;
    touched_nodes.push_back(s0);
    pq.push({h(s0), s0});
    while (!pq.empty()) {
      auto [f, s] = pq.top();
      pq.pop();
      const double d = dist[size_t(s)];
      if (f > d + h(s) + 1e-9) continue;
      if (s == s1) break;
      int x = s % a.cols, y = s / a.cols;
      const int dx[4] = {1, -1, 0, 0}, dy[4] = {0, 0, 1, -1};
      for (int k = 0; k < 4; ++k) {
        int nx = x + dx[k], ny = y + dy[k];
        if (nx < 0 || ny < 0 || nx >= a.cols || ny >= a.rows) continue;
        int l = k < 2 ? grid.link(std::min(x, nx), y, 0) : grid.link(x, std::min(y, ny), 1);
        double load = (usage[l] + N.demand) / cap;
        double c = 1.0 + (load > 1 ? 8.0 * (load - 1) : 0.1 * load);
        int ns = ny * a.cols + nx;
        if (d + c < dist[size_t(ns)]) {
          if (dist[size_t(ns)] >= 1e300) touched_nodes.push_back(ns);
          dist[size_t(ns)] = d + c, prev[size_t(ns)] = s, pq.push({d + c + h(ns), ns});
        }
      }
    }
    std::vector<int> path;
    for (int s = s1; s != -1; s = prev[s]) path.push_back(s);
    std::reverse(path.begin(), path.end());
    N.path.clear();
    if (u.x < 0 || u.x >= a.cols) N.path.push_back({u.x, u.y});
    for (int s : path) N.path.push_back({s % a.cols, s / a.cols});
    if (v.x < 0 || v.x >= a.cols) N.path.push_back({v.x, v.y});
    for (size_t k = 1; k < path.size(); ++k) {
      int p0 = path[k - 1], p1 = path[k];
      int x0 = p0 % a.cols, y0 = p0 / a.cols, x1 = p1 % a.cols, y1 = p1 / a.cols;
      int l = y0 == y1 ? grid.link(std::min(x0, x1), y0, 0) : grid.link(x0, std::min(y0, y1), 1);
      usage[l] += N.demand;
    }
  }
  P.link_load.assign(grid.links(), 0.0);
  for (int l = 0; l < grid.links(); ++l) {
    P.link_load[l] = usage[l] / cap;
    if (P.link_load[l] > P.worst_link_load) {
      P.worst_link_load = P.link_load[l];
      int s = l / 2, x = s % a.cols, y = s / a.cols;
      char buf[64];
      std::snprintf(buf, sizeof buf, "(%d,%d)-(%d,%d)", x, y, l % 2 ? x : x + 1, l % 2 ? y + 1 : y);
      P.worst_link = buf;
    }
  }
  P.stage_extra_latency.assign(g.stages.size(), 0);
  P.stage_slowdown.assign(g.stages.size(), 1.0);
  for (auto& N : P.nets) {
    int hops = std::max(0, int(N.path.size()) - 1);
    P.total_hops += hops;
    P.max_hops = std::max(P.max_hops, hops);
    auto& lat = P.stage_extra_latency[N.stage];
    lat = std::max<int64_t>(lat, int64_t(hops) * a.hop_cycles);
    double worst = 0;
    for (size_t k = 1; k < N.path.size(); ++k) {
      auto [x0, y0] = N.path[k - 1];
      auto [x1, y1] = N.path[k];
      if (x0 < 0 || x1 < 0 || x0 >= a.cols || x1 >= a.cols) continue;
      int l = y0 == y1 ? grid.link(std::min(x0, x1), y0, 0) : grid.link(x0, std::min(y0, y1), 1);
      worst = std::max(worst, P.link_load[l]);
    }
    // Loads and stores are paced by memory, not by their (nominal) initiation interval.
    if (worst > 1 && g.stages[N.stage].kind == StageKind::Compute)
      P.stage_slowdown[N.stage] = std::max(P.stage_slowdown[N.stage], worst);
  }
  return P;
}

}  // namespace mp::rdu
