// `metapipe sim llama`: the Llama generator on the simulated dataflow accelerator, one decode token timed
// at a fusion level. Dispatched from `metapipe sim` when its program is `llama`.
#pragma once
#include "tools/metapipe/cli.h"

namespace mp::cli {

bool is_sim_llama(Args a);  // the first positional is "llama" (a copy: nothing of `a` is consumed)
int run_sim_llama(Args& a);

}  // namespace mp::cli
