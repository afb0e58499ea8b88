// The metapipelined executor: every stage of a METAPIPE runs on its own thread, iterations flowing
// through bounded N-buffers (a producer blocks when all `depth` slots are full, a consumer holds its
// slot until it finishes the iteration), so stage k of iteration i overlaps stage k-1 of iteration i+1.
// Nested METAPIPEs run their own pipeline inside the enclosing stage. Results equal the interpreter's.
#pragma once
#include <string>
#include <vector>

#include "backends/cpu/runtime.h"

namespace mp::cpu {

struct StageStats {
  std::string name;  // "L3.s1", nested "L3.s2/L9.s0"
  std::string ops;   // short description of the stage's nodes ("load_tile, matmul")
  int64_t iterations = 0;
  double busy_ms = 0;      // running its nodes
  double wait_in_ms = 0;   // stalled: input buffers empty
  double wait_out_ms = 0;  // stalled: output buffers full
};
struct LoopStats {
  std::string name;  // "L3"
  int stages = 0;
  int64_t invocations = 0;
  double wall_ms = 0;      // summed over invocations
  double busy_sum_ms = 0;  // sum of its stages' busy time
  double overlap_ms = 0;   // time during which >= 2 of its stages were busy at once
  // The first run's busy intervals per stage, in ms from the loop's start (for the timeline).
  std::vector<std::vector<std::pair<double, double>>> first_run;
  double first_run_ms = 0;
};
struct ExecReport {
  double wall_ms = 0;
  std::vector<StageStats> stages;
  std::vector<LoopStats> loops;
  std::string format() const;  // the per-stage table, the per-loop table and a timeline per loop
};

// Runs a metapipelined program (after the metapipeline pass; user_error otherwise).
ExecReport execute(const ir::Program& p, Memory& mem);

}  // namespace mp::cpu
