// Running a registered program on the CPU backends and checking it against its reference.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "backends/cpu/executor.h"
#include "core/compare.h"
#include "examples/registry.h"

namespace mp::examples {

enum class CpuMode { Interpreter, Executor };

struct TensorCheck {
  std::string tensor;
  CompareResult cmp;
};
struct CpuRun {
  std::string target;  // "cpu" (interpreter) or "cpu:metapipe" (executor)
  bool ok = false;
  double rtol = 0;
  std::vector<TensorCheck> checks;
  double ms = 0;
  std::optional<cpu::ExecReport> report;  // executor only
  std::string summary() const;            // "ok (max rel 3.1e-07)" or the first failure
};

// Tolerance of a program's check: fp32 1e-5 relative, bf16 / f16 1e-2.
double tolerance(ir::DType dt);
// The tolerance for a program's outputs: that of its 16-bit output type if an output has one, else fp32's.
double output_tolerance(const ir::Program& p);

// Fresh random inputs (seeded), reference outputs, the compiled program run in the given mode.
CpuRun run_on_cpu(const ProgramSpec& spec, const Params& params, CpuMode mode, uint64_t seed);
// The same, reusing an already compiled program and its inputs and reference.
// `magnitudes`: the spec's ProgramSpec::magnitude outputs for these inputs (see check_atol), if any.
CpuRun run_compiled(const ir::Program& compiled, const HostInputs& inputs, const HostOutputs& ref,
                    CpuMode mode, double rtol, const HostOutputs& magnitudes = {});
// The absolute floor of the check of one output: rtol / 10 at the output's scale, so that values near
// zero from cancellation are judged against that scale rather than their own size. The scale is the
// largest |want|, or the largest magnitude of the output's terms where the spec gives them
// (ProgramSpec::magnitude; for fp32 the floor is then 1e-6 of the sum of |terms|, about the rounding
// bound of a pairwise sum of 8192 terms).
double check_atol(const std::string& output, const std::vector<double>& want, const HostOutputs& magnitudes,
                  double rtol);
// spec.magnitude(params, in), or nothing when the spec has none.
HostOutputs magnitudes_of(const ProgramSpec& spec, const Params& params, const HostInputs& in);
HostInputs make_inputs(const ProgramSpec& spec, const Params& params, const ir::Program& p, uint64_t seed);

}  // namespace mp::examples
