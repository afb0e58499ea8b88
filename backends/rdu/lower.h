// Lowering a metapipelined IR program (after tile -> fuse -> parallelize -> metapipeline) to the stage
// graph the simulator runs. Every IR stage becomes one graph stage per off-chip access (LoadTile, Gather,
// StoreTile, Scatter) plus one for its compute nodes; nested METAPIPEs are flattened (their stages run
// trip x outer iterations, values from outer stages are reused across the inner iterations); loop-carried
// results leave through a control stage that forwards the last iteration's value. Top-level statements
// that read a tensor an earlier statement wrote wait for it through a control token.
#pragma once
#include <memory>

#include "backends/rdu/graph.h"
#include "ir/eval.h"
#include "ir/ir.h"

namespace mp::rdu {

// With `mem`, the graph's kernels evaluate the IR nodes (ir/eval.h, the evaluation the CPU backends use
// too) on tiles held in the simulated N-buffer slots, reading and writing `mem`, in the order the
// simulator fires them.
// Throws user_error when the program is not metapipelined, not_supported for what the lowering lacks.
Graph lower(const ir::Program& p, ir::Memory* mem = nullptr);

}  // namespace mp::rdu
