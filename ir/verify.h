// The IR verifier: structural invariants always, plus the invariants that the passes run so far promise
// (Program::tiled, ::metapipelined, ...). Throws user_error for a program the user can fix (naming the
// node and the fix) and internal_error for IR that a pass got wrong.
#pragma once
#include "ir/ir.h"

namespace mp::ir {

void verify(const Program& p);

}  // namespace mp::ir
