// The simulated dataflow accelerator end to end: map a stage graph onto an architecture, place and route
// every configuration, simulate the configurations one after another (kernel calls), and gather the report.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backends/rdu/arch.h"
#include "backends/rdu/graph.h"
#include "backends/rdu/mapping.h"
#include "backends/rdu/place_route.h"
#include "backends/rdu/sim.h"

namespace mp::rdu {

struct RunOptions {
  bool functional = false;  // units compute real values (tensors' host data in, results out)
  bool place = true;        // place & route (off: zero hop latency, no congestion; for unit tests)
  uint64_t seed = 1;        // placer
  std::function<void(double)> progress;  // now and then: the fraction of the run done (all kernel calls)
  MapOptions map;           // kernel-call boundaries imposed by the caller (fusion levels)
};

struct RunResult {
  std::string program, arch;
  double cycles = 0;  // all kernel calls, reconfiguration between calls included
  double seconds = 0;
  int kernel_calls = 1;
  std::vector<std::string> split_reasons;
  double pcu_util = 0, pmu_util = 0, agcu_util = 0;  // fractions of the whole chip over the run
  int pcus_used = 0, pmus_used = 0, agcus_used = 0;  // largest configuration
  int64_t bytes_read = 0, bytes_written = 0;
  double load_bw_pct = 0, store_bw_pct = 0;  // achieved / peak of the program memory
  double flops = 0;
  double compute_roof_cycles = 0, memory_roof_cycles = 0;
  int64_t bursts = 0, row_misses = 0, refreshes = 0, turnarounds = 0, events = 0;
  int total_hops = 0, max_hops = 0;
  double worst_link_load = 0;
  std::string worst_link;
  std::vector<StageStats> stages;
  std::vector<std::string> notes;
  Mapping mapping;
  std::vector<Placement> placements;  // per configuration
  std::vector<ConfigResult> configs;
};

RunResult run(const Arch& a, Graph& g, const RunOptions& opt = {});

}  // namespace mp::rdu
