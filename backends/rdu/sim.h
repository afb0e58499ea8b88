// The event-driven, token-based cycle simulation of one configuration (kernel call) of the fabric.
// Stages fire when their input tokens are complete and their output slot is free; loads and stores become
// bursts that AGCUs issue (bounded outstanding requests) to DRAM channels, which serve them FR-FCFS with
// bank row buffers, refresh and read/write turnaround. Overlap, or its absence, comes out of this.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backends/rdu/arch.h"
#include "backends/rdu/mapping.h"

namespace mp::rdu {

struct StageStats {
  std::string name;
  std::string kind;  // load, store, compute
  std::string mode;  // simd, systolic, agcu
  int config = 0;    // kernel call index
  int pcus = 0;
  int64_t iterations = 0;
  int64_t ii = 0;
  double busy = 0;          // cycles with an iteration executing (or a memory request in flight)
  double stall_input = 0;   // cycles idle waiting for an input token
  double stall_output = 0;  // cycles idle waiting for a free output slot
  double first_start = 0, last_end = 0;
};

struct ConfigResult {
  double cycles = 0;
  int64_t bytes_read = 0, bytes_written = 0;  // useful bytes (what the program asked for)
  int64_t bursts = 0, row_misses = 0, refreshes = 0, turnarounds = 0;
  double pcu_busy = 0;   // sum over stages of busy x pcus
  double agcu_busy = 0;  // sum over AGCUs of busy cycles
  std::vector<StageStats> stages;
  int64_t events = 0;
};

struct SimOptions {
  bool functional = false;
  std::vector<int64_t> stage_extra_latency;  // per stage: route hops x hop cycles (from place & route)
  // Called every 4Ki events with the stage iterations finished and in all (the CLI's progress line).
  std::function<void(int64_t finished, int64_t total)> progress;
};

// An upper estimate of the events simulating `g` takes (saturating at INT64_MAX): the work measure that
// `metapipe sim --max-work` limits, and the bound of the simulator's event loop.
int64_t estimate_events(const Arch& a, const Graph& g);
inline constexpr int64_t kDefaultMaxEvents = int64_t{500} * 1000 * 1000;

// Simulates one configuration; in functional mode the graph's tensors' host data are read and written.
ConfigResult simulate_config(const Arch& a, Config& cfg, const SimOptions& opt);

}  // namespace mp::rdu
