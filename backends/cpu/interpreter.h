// The reference interpreter: runs any IR program (before or after passes) statement by statement,
// one loop iteration after another. Plain on purpose: it is what every other backend is checked against.
#pragma once
#include "backends/cpu/runtime.h"

namespace mp::cpu {

void interpret(const ir::Program& p, Memory& mem);
// One METAPIPE loop (nests included) run the same way, in `env`: for engines that run most nodes their
// own way and fall back to the reference evaluation for the rest.
void interpret_metapipe(const ir::MetaPipe& m, Env& env, Memory& mem);

}  // namespace mp::cpu
