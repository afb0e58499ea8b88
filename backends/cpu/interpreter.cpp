// The reference interpreter: a recursive walk; METAPIPE loops run their iterations in order and their
// stages in order within an iteration, carried values threaded through.
#include "backends/cpu/interpreter.h"

namespace mp::cpu {
namespace {

void run_list(const std::vector<ir::NodeRef>& nodes, Env& env, Memory& mem);

void run_metapipe(const ir::MetaPipe& m, Env& env, Memory& mem) {
  std::vector<TileRef> state;
  for (auto& c : m.carried) state.push_back(env.get(c.init));
  for (int64_t i = 0; i < m.trip(); ++i) {
    Env body(&env);
    body.set_loop(m.var, i);
    for (size_t k = 0; k < m.carried.size(); ++k) body.set(m.carried[k].arg, state[k]);
    for (auto& s : m.stages) run_list(s.ops, body, mem);
    for (size_t k = 0; k < m.carried.size(); ++k) state[k] = body.get(m.carried[k].next);
  }
  for (size_t k = 0; k < m.carried.size(); ++k) env.set(m.carried[k].result, state[k]);
}

void run_list(const std::vector<ir::NodeRef>& nodes, Env& env, Memory& mem) {
  for (auto& n : nodes) {
    if (auto* m = n->as<ir::MetaPipe>()) {
      run_metapipe(*m, env, mem);
      continue;
    }
    auto t = eval_node(*n, env, mem);
    if (n->out) env.set(n->out, std::move(t));
  }
}

}  // namespace

void interpret_metapipe(const ir::MetaPipe& m, Env& env, Memory& mem) { run_metapipe(m, env, mem); }

void interpret(const ir::Program& p, Memory& mem) {
  Env env;
  run_list(p.body, env, mem);
}

}  // namespace mp::cpu
