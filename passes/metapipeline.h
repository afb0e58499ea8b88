// Metapipelining: split every METAPIPE body into stages (loads, compute, matmul, state update, stores,
// nested loops), insert an N-buffer for each value that crosses stages and a state buffer for each
// loop-carried value, and record the stage graph, buffer sizes and per-stage work.
#pragma once
#include "ir/ir.h"

namespace mp::passes {

struct MetapipelineOptions {
  int depth = 2;  // slots of an inserted buffer (2 = double buffering); BUFFER(v, depth = n) keeps its own
};

ir::Program metapipeline(const ir::Program& p, const MetapipelineOptions& opt);

}  // namespace mp::passes
