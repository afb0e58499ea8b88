// The one path every program takes onto the simulated accelerator in these tests, as in `metapipe sim`:
// a registry program (front end) with parameters, compiled by the passes, lowered to a stage graph, then
// mapped, placed and routed and simulated by rdu::run.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "backends/rdu/lower.h"
#include "backends/rdu/rdu.h"
#include "core/compare.h"
#include "examples/registry.h"
#include "examples/run.h"
#include "ir/eval.h"

namespace mp::test {

using CompileTweak = std::function<void(passes::CompileOptions&)>;

inline ir::Program compiled_program(const std::string& name, const std::vector<std::string>& sets = {},
                                    const CompileTweak& tweak = {}) {
  const auto& spec = examples::find_program(name);
  examples::Params params = examples::resolve(spec, sets);
  passes::CompileOptions opt = examples::compile_options(params);
  if (tweak) tweak(opt);
  return passes::compile(examples::build(spec, params), opt);
}

// The stage graph of a compiled program (timing only: no values are computed).
inline rdu::Graph compiled(const std::string& name, const std::vector<std::string>& sets = {},
                           const CompileTweak& tweak = {}) {
  return rdu::lower(compiled_program(name, sets, tweak));
}

// Simulates the compiled program functionally (outputs poisoned with NaN first) and checks every output
// against the program's naive reference at its precision; returns the run.
inline rdu::RunResult run_functional(const rdu::Arch& arch, const std::string& name,
                                     const std::vector<std::string>& sets, uint64_t seed,
                                     const CompileTweak& tweak = {}, bool place = true) {
  const auto& spec = examples::find_program(name);
  examples::Params params = examples::resolve(spec, sets);
  ir::Program p = examples::build(spec, params);
  passes::CompileOptions opt = examples::compile_options(params);
  if (tweak) tweak(opt);
  ir::Program c = passes::compile(p, opt);
  examples::HostInputs in = examples::make_inputs(spec, params, p, seed);
  examples::HostOutputs ref = spec.reference(params, in);
  ir::Memory mem = ir::make_memory(c, in);
  rdu::Graph g = rdu::lower(c, &mem);
  rdu::RunOptions o;
  o.functional = true;
  o.place = place;
  rdu::RunResult r = rdu::run(arch, g, o);
  const double rtol = examples::output_tolerance(c);
  const examples::HostOutputs mags = examples::magnitudes_of(spec, params, in);
  for (auto& [out, want] : ref) {
    auto cmp = compare(mem.at(out).data, want, rtol, examples::check_atol(out, want, mags, rtol));
    EXPECT_TRUE(cmp.ok) << name << " on " << arch.name << " (seed " << seed << "): " << out << ": "
                        << cmp.summary();
  }
  return r;
}

}  // namespace mp::test
