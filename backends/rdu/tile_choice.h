// Tile sizes chosen for the architecture when the user has not fixed them: a search over a program's
// tile parameters on the cycle model (as Spatial's design-space exploration does with its estimator).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "backends/rdu/arch.h"
#include "backends/rdu/graph.h"
#include "backends/rdu/rdu.h"

namespace mp::rdu {

using TileValues = std::map<std::string, int64_t>;

struct TileSearch {
  // The program's integer parameters the user left at their defaults; those whose change leaves every
  // off-chip tensor as it is are its tiles (a size such as N changes the tensors and is never touched).
  TileValues defaults;
  // The stage graph for a set of values; throws user_error when they do not fit the program (a tile
  // that does not divide its extent, a loop of one iteration).
  std::function<Graph(const TileValues&)> build;
  int64_t max_events = 0;  // candidates whose estimated simulation events exceed this are skipped (0: none)
};

struct TileChoice {
  TileValues values;  // the chosen values of every parameter of `defaults`
  bool changed = false;
  std::string why;   // "tile chosen: TS=16384 (...)", empty when the defaults stay
  RunResult result;  // the simulation of the chosen values
};

// Only bandwidth-bound streaming programs (memory roof at least twice the compute roof, no MatMul, one
// kernel call) are searched: doubling and halving one tile at a time while the simulated cycles fall by at
// least 1 % (looking one step past a step that does not), at most 16 candidates. The defaults stay unless a
// candidate is at least 3 % faster.
TileChoice choose_tiles(const Arch& a, const TileSearch& search, const RunOptions& opt = {});

}  // namespace mp::rdu
