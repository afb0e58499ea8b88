// The tile search: which parameters are tiles (probed), then a greedy walk over powers of two of each.
#include "backends/rdu/tile_choice.h"

#include <algorithm>
#include <set>

#include "core/error.h"

namespace mp::rdu {
namespace {

std::string show(const TileValues& v, const std::vector<std::string>& names) {
  std::string s;
  for (auto& n : names) s += (s.empty() ? "" : " ") + n + "=" + std::to_string(v.at(n));
  return s;
}

std::vector<int64_t> tensor_bytes(const Graph& g) {
  std::vector<int64_t> b;
  for (auto& t : g.tensors) b.push_back(t.bytes);
  return b;
}

}  // namespace

TileChoice choose_tiles(const Arch& a, const TileSearch& search, const RunOptions& opt) {
  TileChoice out;
  out.values = search.defaults;
  Graph g0 = search.build(search.defaults);
  out.result = run(a, g0, opt);
  const double default_cycles = out.result.cycles;
  const int default_calls = out.result.kernel_calls;
  // A MatMul's tiles trade on-chip reuse and compute (the parallelize pass's choice), not only the
  // granularity of memory streams: programs with one are left as written.
  const bool streaming =
      std::none_of(g0.stages.begin(), g0.stages.end(), [](const Stage& s) { return s.is_matmul(); });
  if (!streaming || default_calls > 1 || out.result.memory_roof_cycles < 2 * out.result.compute_roof_cycles ||
      search.defaults.empty())
    return out;
  // Tiles: doubling (or halving) them still builds and leaves the off-chip tensors unchanged.
  const std::vector<int64_t> tensors = tensor_bytes(g0);
  auto try_build = [&](const TileValues& v, Graph& g) {
    try {
      g = search.build(v);
    } catch (const user_error&) {
      return false;
    }
    if (tensor_bytes(g) != tensors) return false;
    return search.max_events <= 0 || estimate_events(a, g) <= search.max_events;
  };
  std::vector<std::string> tiles;
  for (auto& [name, value] : search.defaults) {
    Graph g;
    TileValues up = search.defaults, down = search.defaults;
    up[name] = value * 2;
    down[name] = value / 2;
    if ((value <= int64_t(1) << 29 && try_build(up, g)) || (value >= 2 && try_build(down, g)))
      tiles.push_back(name);
  }
  if (tiles.empty()) return out;
  TileValues best = search.defaults;
  double best_cycles = default_cycles;
  RunResult best_run;
  std::set<TileValues> tried = {best};
  int candidates = 0;
  const int max_candidates = 16;
  bool moved = true;
  while (moved && candidates < max_candidates) {
    moved = false;
    for (const std::string& name : tiles)
      for (int dir : {+1, -1}) {
        // Walk one tile in one direction while it pays, looking one step past a step that does not
        // (DRAM rows and channel interleaving make the cycles bumpy in the tile size).
        TileValues at = best;
        for (int misses = 0; misses < 2;) {
          TileValues v = at;
          if (dir > 0 ? v[name] > int64_t(1) << 29 : v[name] < 2) break;
          v[name] = dir > 0 ? v[name] * 2 : v[name] / 2;
          at = v;
          if (!tried.insert(v).second) {
            ++misses;
            continue;
          }
          Graph g;
          if (candidates >= max_candidates || !try_build(v, g)) break;
          ++candidates;
          RunResult r;
          try {  // a tile the fabric cannot hold (a buffer over the PMUs) is no candidate
            r = run(a, g, opt);
          } catch (const user_error&) {
            break;
          }
          if (r.kernel_calls > default_calls || r.cycles > 0.99 * best_cycles) {
            ++misses;
            continue;
          }
          best = v, best_cycles = r.cycles, best_run = std::move(r), moved = true, misses = 0;
        }
      }
  }
  if (best_cycles > 0.97 * default_cycles) return out;
  out.values = best;
  out.changed = true;
  out.result = std::move(best_run);
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.2fx", default_cycles / best_cycles);
  out.why = "tile chosen: " + show(best, tiles) + " (the fastest of " + std::to_string(candidates + 1) +
            " simulated on " + a.name + ", " + ratio + " faster than the program's default " +
            show(search.defaults, tiles) + "; --set fixes a tile)";
  return out;
}

}  // namespace mp::rdu
