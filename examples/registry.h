// The program registry: every example program with its parameters (and defaults), a builder of its IR
// and a naive C++ reference. The CLI (list / compile / run / sim) and every backend's tests use it.
//
//   MP_REGISTER_PROGRAM(my_program_spec);   // in any .cpp under examples/ (the library is OBJECT, so
//                                           // static registration survives linking)
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ir/ir.h"
#include "passes/pipeline.h"

namespace mp::examples {

// A parameter's value is checked when --set gives it (resolve): an integer parameter (integer default)
// must lie in [0, 2^31 - 1] and in [min, max]; a numeric one must be finite and in [min, max].
struct Param {
  std::string name;
  std::string def;  // default value, as text ("256", "0.1", "f32")
  std::string help;
  double min = -1e308, max = 1e308;
};
inline constexpr int64_t kMaxIntParam = 2147483647;

// Resolved parameter values (program parameters and the compile parameters shared by all programs).
class Params {
 public:
  std::map<std::string, std::string> values;
  int64_t i(const std::string& name) const;  // user_error when malformed
  double f(const std::string& name) const;
  const std::string& s(const std::string& name) const;
  ir::DType dtype(const std::string& name = "dtype") const;
};

using HostInputs = std::map<std::string, std::vector<float>>;    // by tensor name
using HostOutputs = std::map<std::string, std::vector<double>>;  // expected output / inout contents

struct ProgramSpec {
  std::string name;
  std::string summary;  // one line for `metapipe list`
  std::vector<Param> params;
  std::function<ir::Program(const Params&)> build;
  // Naive reference: expected contents of every Output / InOut tensor, computed in double.
  std::function<HostOutputs(const Params&, const HostInputs&)> reference;
  // Optional: adjust the uniform [-1, 1) random inputs (indices, positions, weight scales).
  std::function<void(const Params&, HostInputs&)> prepare_inputs;
  // Optional: for outputs whose reference can cancel to near zero (sums of signed terms), the same sums
  // over the terms' absolute values (sum |a_i b_i| for a dot product). A check judges the rounding error
  // against that scale (check_atol, run.h): fp32 sums in another order differ by a few ulps of it however
  // small the result (a dot product of 8192 random terms that came to 0.02 failed 1e-5 relative).
  std::function<HostOutputs(const Params&, const HostInputs&)> magnitude = nullptr;
};

void register_program(ProgramSpec spec);
std::vector<const ProgramSpec*> programs();                // sorted by name
const ProgramSpec& find_program(const std::string& name);  // user_error listing the programs

// Compile parameters every program accepts through --set: mask, depth, budget_kib, row_tile, fuse, lanes.
const std::vector<Param>& compile_params();
// Defaults overridden by "NAME=VALUE" strings; an unknown NAME is a user_error listing the valid ones.
Params resolve(const ProgramSpec& spec, const std::vector<std::string>& sets);
passes::CompileOptions compile_options(const Params& p);
// build(p) with the program's parameters recorded and the budget / masking set from the compile params.
ir::Program build(const ProgramSpec& spec, const Params& p);

struct Registrar {
  explicit Registrar(ProgramSpec (*make)()) { register_program(make()); }
};

}  // namespace mp::examples

#define MP_EXAMPLES_CAT2(a, b) a##b
#define MP_EXAMPLES_CAT(a, b) MP_EXAMPLES_CAT2(a, b)
#define MP_REGISTER_PROGRAM(make_fn) \
  static const ::mp::examples::Registrar MP_EXAMPLES_CAT(mp_program_registrar_, __LINE__)(make_fn)
