// Tiling: split whole-tensor pattern programs into a METAPIPE over row tiles, and validate the tiles of
// explicitly tiled programs against tensor shapes and the on-chip budget (masking non-dividing tiles
// when asked to).
#pragma once
#include "ir/ir.h"

namespace mp::passes {

struct TileOptions {
  int64_t row_tile = 0;       // rows per tile for whole-tensor programs; 0: choose from shape and budget
  bool masking = false;       // allow tiles that do not divide their dimension (the last tile is cut)
  int64_t onchip_budget = 0;  // bytes; 0 keeps the program's
  int depth = 2;              // buffer depth assumed when choosing a row tile (double buffering)
};

ir::Program tile(const ir::Program& p, const TileOptions& opt);

}  // namespace mp::passes
