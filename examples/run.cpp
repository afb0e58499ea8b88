// Run a registered program on the CPU (interpreter or metapipelined executor) and check it.
#include "examples/run.h"

#include <chrono>
#include <cmath>

#include "backends/cpu/interpreter.h"

namespace mp::examples {

double tolerance(ir::DType dt) { return dt == ir::DType::f32 || dt == ir::DType::i32 ? 1e-5 : 1e-2; }

std::string CpuRun::summary() const {
  for (auto& c : checks)
    if (!c.cmp.ok) return c.tensor + ": " + c.cmp.summary();
  double worst = 0;
  for (auto& c : checks) worst = std::max(worst, c.cmp.max_rel_err);
  char buf[64];
  std::snprintf(buf, sizeof buf, "ok (max rel %.1e, tol %.0e)", worst, rtol);
  return buf;
}

HostInputs make_inputs(const ProgramSpec& spec, const Params& params, const ir::Program& p, uint64_t seed) {
  HostInputs in = cpu::random_inputs(p, seed);
  if (spec.prepare_inputs) spec.prepare_inputs(params, in);
  for (auto& t : p.tensors) {
    auto it = in.find(t->name);
    if (it != in.end())
      for (auto& x : it->second) x = cpu::round_to(t->dtype, x);
  }
  return in;
}

double check_atol(const std::string& output, const std::vector<double>& want, const HostOutputs& magnitudes,
                  double rtol) {
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  if (auto it = magnitudes.find(output); it != magnitudes.end())
    for (double w : it->second) scale = std::max(scale, std::fabs(w));
  return rtol * 0.1 * std::max(scale, 1e-30);
}

HostOutputs magnitudes_of(const ProgramSpec& spec, const Params& params, const HostInputs& in) {
  return spec.magnitude ? spec.magnitude(params, in) : HostOutputs{};
}

CpuRun run_compiled(const ir::Program& compiled, const HostInputs& inputs, const HostOutputs& ref,
                    CpuMode mode, double rtol, const HostOutputs& magnitudes) {
  CpuRun r;
  r.target = mode == CpuMode::Interpreter ? "cpu" : "cpu:metapipe";
  r.rtol = rtol;
  cpu::Memory mem = cpu::make_memory(compiled, inputs);
  auto t0 = std::chrono::steady_clock::now();
  if (mode == CpuMode::Interpreter)
    cpu::interpret(compiled, mem);
  else
    r.report = cpu::execute(compiled, mem);
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  r.ok = true;
  for (auto& [name, want] : ref) {
    auto it = mem.find(name);
    MP_INTERNAL_CHECK(it != mem.end(), "the reference gives tensor '", name, "' that the program lacks");
    auto cmp = compare(it->second.data, want, rtol, check_atol(name, want, magnitudes, rtol));
    r.ok = r.ok && cmp.ok;
    r.checks.push_back({name, cmp});
  }
  return r;
}

CpuRun run_on_cpu(const ProgramSpec& spec, const Params& params, CpuMode mode, uint64_t seed) {
  ir::Program p = build(spec, params);
  ir::Program compiled = passes::compile(p, compile_options(params));
  HostInputs in = make_inputs(spec, params, p, seed);
  HostOutputs ref = spec.reference(params, in);
  return run_compiled(compiled, in, ref, mode, output_tolerance(p), magnitudes_of(spec, params, in));
}

double output_tolerance(const ir::Program& p) {
  ir::DType dt = ir::DType::f32;
  for (auto& t : p.tensors)
    if ((t->role == ir::TensorRole::Output || t->role == ir::TensorRole::InOut) && bytes_of(t->dtype) == 2)
      dt = t->dtype;
  return tolerance(dt);
}

}  // namespace mp::examples
