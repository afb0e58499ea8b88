// Mapping a stage graph onto the fabric: stages to PCUs (SIMD chains or systolic arrays), buffers to PMUs
// (capacity, banking, N-buffering), loads and stores to AGCUs; a program that does not fit is split into
// several configurations ("kernel calls"), with the buffers that cross a split spilled off chip.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "backends/rdu/arch.h"
#include "backends/rdu/graph.h"

namespace mp::rdu {

struct StageMap {
  std::string mode;     // "simd", "systolic", "agcu"
  int chain = 1;        // PCUs in series (ops / pcu.stages)
  int pcus = 0;         // chain x par
  int par = 1;          // copies actually used (may be lowered to fit the chip)
  int64_t ii = 1;       // cycles between iterations (initiation interval) on the fabric
  int64_t latency = 0;  // pipeline fill: cycles from the end of ii to the output token
  int agcus = 0;        // loads and stores: AGCUs sharing the stream (each issues one burst per cycle)
};

struct BufferMap {
  int pmus = 0;  // PMUs holding depth x bytes (at least one)
  int nbuf = 2;
};

// One configuration of the fabric (one kernel call): a graph whose spills are loads and stores.
struct Config {
  Graph graph;
  std::vector<StageMap> stages;     // per stage of `graph`
  std::vector<BufferMap> buffers;   // per buffer of `graph`
  std::vector<int> original_stage;  // index in the input graph, -1 for spill loads and stores
  int pcus = 0, pmus = 0, agcus = 0;
  std::string why;  // why this configuration ends where it does (empty for the last)
};

struct Mapping {
  std::vector<Config> configs;
  std::vector<std::string> notes;  // par lowered to fit, buffers split over several PMUs, ...
  int kernel_calls() const { return int(configs.size()); }
};

// Where kernel calls must end besides where the fabric runs out: called with the latest top-level
// statement (Stage::statement) already in the current call and the next one; a non-empty result ends the
// call there and is the reason the report gives. This is how a fusion level (one call per operation, per
// decoder layer, ...) is imposed on a program that would fit in fewer calls.
struct MapOptions {
  std::function<std::string(int last_statement, int next_statement)> split_between;
  // Per stage of the input graph (empty: none): how much an earlier place & route of the same graph
  // slowed the stage by over-subscribed mesh links. The parallelism that keeps element-wise stages up
  // with the memory streams is chosen for the slowed stage.
  std::vector<double> stage_slowdown;
};

// Cycles one iteration of a compute stage takes on the arch with `par` copies (used by mapping and tests).
StageMap map_stage(const Arch& a, const Graph& g, const Stage& s, int par);
Mapping map_graph(const Arch& a, const Graph& g, const MapOptions& opt = {});

}  // namespace mp::rdu
