// The readable text form of the IR (what `metapipe compile --dump-ir` prints and pass tests compare).
#pragma once
#include <ostream>
#include <string>

#include "ir/ir.h"

namespace mp::ir {

std::string print(const Program& p);
std::string print(const Node& n);        // one node (a MetaPipe with its body)
std::string value_name(const Value& v);  // "%7" or "%7:a_tile"

}  // namespace mp::ir
