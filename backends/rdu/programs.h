// The Plasticine / Spatial benchmark programs as stage graphs built directly (the metapipelines that the
// compiler would produce for them), each with a naive C++ reference. They run without the IR, so the
// simulator, its tests and `metapipe sim` work on them; programs written in the front end reach the
// simulator through the lowering instead.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "backends/rdu/graph.h"

namespace mp::rdu {

using Params = std::map<std::string, int64_t>;

struct GraphProgram {
  std::string name;
  std::string description;
  Params defaults;
  Params small;  // sizes for --functional and tests
  // Builds the graph; with `data`, fills the input tensors with random values from `seed`.
  std::function<Graph(const Params&, bool data, uint64_t seed)> build;
  // Expected contents of each output tensor (by name) from the graph's input tensors.
  std::function<std::map<std::string, std::vector<double>>(const Graph&, const Params&)> reference;
};

const std::vector<GraphProgram>& graph_programs();
const GraphProgram* find_graph_program(const std::string& name);
// defaults overridden by NAME=VALUE strings; unknown names are a user_error listing the parameters
Params resolve_params(const GraphProgram& p, const std::vector<std::string>& sets, bool small);

}  // namespace mp::rdu
