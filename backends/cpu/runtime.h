// The CPU backends run on the IR's host evaluation (ir/eval.h: host memory, tiles, environments, one
// node's evaluation); they differ only in how they schedule it. The names are re-exported here so that
// callers of the CPU backends can say cpu::Memory, cpu::make_memory(...).
#pragma once
#include "ir/eval.h"

namespace mp::cpu {

using ir::Env;
using ir::eval_node;
using ir::HostTensor;
using ir::make_memory;
using ir::Memory;
using ir::random_inputs;
using ir::round_to;
using ir::Tile;
using ir::TileRef;

}  // namespace mp::cpu
