// The reference interpreter: runs any IR program (before or after passes) statement by statement,
// one loop iteration after another. Plain on purpose: it is what every other backend is checked against.
#pragma once
#include "backends/cpu/runtime.h"

namespace mp::cpu {

void interpret(const ir::Program& p, Memory& mem);

}  // namespace mp::cpu
