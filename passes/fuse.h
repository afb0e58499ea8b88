// Producer-consumer fusion of element functions: a Map or Zip whose only use is another Map / Zip (or a
// Reduce, as its pre-function) is folded into it, so the intermediate never exists. Fusion stops at a
// value with several uses or at a Reduce's output (softmax's exp feeds both the sum and the divide):
// that is where metapipelining, not fusion, overlaps the work.
#pragma once
#include "ir/ir.h"

namespace mp::passes {

struct FuseOptions {
  bool enabled = true;
};

ir::Program fuse(const ir::Program& p, const FuseOptions& opt);

}  // namespace mp::passes
