// The compiler pipeline: verify, then tile -> fuse -> parallelize -> metapipeline, each followed by the
// verifier and, on request, an IR dump.
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include "passes/fuse.h"
#include "passes/metapipeline.h"
#include "passes/parallelize.h"
#include "passes/tile.h"

namespace mp::passes {

struct CompileOptions {
  TileOptions tile;
  FuseOptions fuse;
  ParallelizeOptions parallelize;
  MetapipelineOptions metapipeline;
  // "none", "after-all", or "after-<pass>" (after-tile, after-fuse, after-parallelize, after-metapipeline)
  std::string dump = "none";
  std::ostream* dump_to = nullptr;  // where dumps go (nothing is printed when null)
};

struct PassRecord {
  std::string name;
  double ms = 0;
};

// The program compiled for the metapipelined backends; `log` receives each pass and its time.
ir::Program compile(const ir::Program& p, const CompileOptions& opt, std::vector<PassRecord>* log = nullptr);

// The names accepted by CompileOptions::dump.
std::vector<std::string> pass_names();

}  // namespace mp::passes
