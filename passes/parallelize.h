// Parallelization: choose par (parallel units, e.g. PCUs) and lanes (SIMD width per unit) for every
// node from its shape and the user's hints (LOAD_TILE row_par).
#pragma once
#include "ir/ir.h"

namespace mp::passes {

struct ParallelizeOptions {
  int lanes = 16;   // SIMD lanes of one compute unit
  int max_par = 4;  // most units one node is spread over
};

ir::Program parallelize(const ir::Program& p, const ParallelizeOptions& opt);

}  // namespace mp::passes
