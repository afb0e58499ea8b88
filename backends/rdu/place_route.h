// Place & route of one configuration on the mesh: a simulated-annealing placer (wire length weighted by
// bandwidth, plus congestion of the XY routes it implies) and a negotiated shortest-path router honouring
// link widths. Results feed the simulator (hop latency, slowdown of over-subscribed links) and the SVG.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backends/rdu/arch.h"
#include "backends/rdu/mapping.h"

namespace mp::rdu {

enum class UnitKind { PCU, PMU, AGCU };

struct PlacedUnit {
  UnitKind kind;
  int owner = -1;  // stage (PCU, AGCU) or buffer (PMU) index in the config graph
  std::string label;
  int x = 0, y = 0;  // column, row; AGCUs sit at x = -1 (left edge) or x = cols (right edge)
};

struct Net {
  int from = 0, to = 0;                   // units
  double demand = 0;                      // bytes per cycle while the stage runs
  int stage = -1;                         // the stage whose throughput the net carries
  std::vector<std::pair<int, int>> path;  // switch coordinates (x, y), from -> to
};

struct Placement {
  int rows = 0, cols = 0;
  std::vector<PlacedUnit> units;
  std::vector<Net> nets;
  int total_hops = 0, max_hops = 0;
  double worst_link_load = 0;  // demand / link width on the most congested link
  std::string worst_link;      // "(x,y)-(x,y)"
  double wire_cost_initial = 0, wire_cost_final = 0;
  std::vector<int64_t> stage_extra_latency;  // per stage: hops x hop cycles on its longest net
  std::vector<double> stage_slowdown;        // per stage: >= 1 when a link it uses is over-subscribed
  std::vector<double> link_load;             // per link (2 per switch: right, down), demand / width
};

Placement place_and_route(const Arch& a, const Config& cfg, uint64_t seed = 1);

}  // namespace mp::rdu
