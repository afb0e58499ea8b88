// The program registry and parameter handling shared by every example program.
#include "examples/registry.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

namespace mp::examples {

static std::vector<ProgramSpec>& registry() {
  static std::vector<ProgramSpec> r;
  return r;
}

void register_program(ProgramSpec spec) {
  for (auto& s : registry())
    if (s.name == spec.name) fail_internal("example program '", spec.name, "' registered twice");
  registry().push_back(std::move(spec));
}

std::vector<const ProgramSpec*> programs() {
  std::vector<const ProgramSpec*> v;
  for (auto& s : registry()) v.push_back(&s);
  std::sort(v.begin(), v.end(), [](auto* a, auto* b) { return a->name < b->name; });
  return v;
}

const ProgramSpec& find_program(const std::string& name) {
  std::string names;
  for (auto* s : programs()) {
    if (s->name == name) return *s;
    names += (names.empty() ? "" : ", ") + s->name;
  }
  fail_user("unknown program '", name, "' (programs: ", names, "; see metapipe list)");
}

const std::vector<Param>& compile_params() {
  static const std::vector<Param> p = {
      {"mask", "0", "1: allow tiles that do not divide their dimension (the last tile is masked)", 0, 1},
      {"depth", "2", "slots of each inserted buffer (2 = double buffering)", 1, 64},
      {"budget_kib", "8192", "on-chip memory budget in KiB", 1, double(1 << 30)},
      {"row_tile", "0", "rows per tile for whole-tensor programs (0: chosen by the tile pass)"},
      {"fuse", "1", "1: run the fusion pass", 0, 1},
      {"lanes", "16", "SIMD lanes per compute unit (parallelize pass)", 1, 4096},
  };
  return p;
}

int64_t Params::i(const std::string& name) const {
  const std::string& v = s(name);
  int64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  MP_USER_CHECK(ec == std::errc() && p == v.data() + v.size(), "parameter ", name, "=", v,
                " must be an integer");
  return x;
}
double Params::f(const std::string& name) const {
  const std::string& v = s(name);
  try {
    size_t used = 0;
    double x = std::stod(v, &used);
    if (used == v.size()) return x;
  } catch (...) {
  }
  fail_user("parameter ", name, "=", v, " must be a number");
}
const std::string& Params::s(const std::string& name) const {
  auto it = values.find(name);
  MP_INTERNAL_CHECK(it != values.end(), "parameter '", name, "' is not declared by the program");
  return it->second;
}
ir::DType Params::dtype(const std::string& name) const { return ir::parse_dtype(s(name)); }

Params resolve(const ProgramSpec& spec, const std::vector<std::string>& sets) {
  Params p;
  for (auto& q : spec.params) p.values[q.name] = q.def;
  for (auto& q : compile_params()) p.values[q.name] = q.def;
  for (auto& s : sets) {
    auto eq = s.find('=');
    MP_USER_CHECK(eq != std::string::npos && eq > 0, "--set expects NAME=VALUE, got '", s, "'");
    std::string name = s.substr(0, eq), value = s.substr(eq + 1);
    if (!p.values.count(name)) {
      std::string names;
      for (auto& q : spec.params) names += (names.empty() ? "" : ", ") + q.name;
      std::string common;
      for (auto& q : compile_params()) common += (common.empty() ? "" : ", ") + q.name;
      fail_user("unknown parameter '", name, "' for program '", spec.name, "' (its parameters: ", names,
                "; compile parameters: ", common, "; see metapipe list)");
    }
    p.values[name] = value;
  }
  // Validate types and ranges early so a typo or an extreme value is reported by name, before a size
  // product can overflow (M = INT64_MAX once became a negative trip count).
  auto range = [](double lo, double hi, bool integer) {
    std::ostringstream os;
    if (integer)
      os << "[" << int64_t(lo) << ", " << int64_t(hi) << "]";
    else
      os << "[" << lo << ", " << hi << "]";
    return os.str();
  };
  auto check_int = [&](const Param& q) {
    const int64_t x = p.i(q.name);
    const double lo = std::max(q.min, 0.0), hi = std::min(q.max, double(kMaxIntParam));
    MP_USER_CHECK(double(x) >= lo && double(x) <= hi, "parameter ", q.name, "=", p.s(q.name),
                  " is out of range: it must be an integer in ", range(lo, hi, true));
  };
  for (auto& q : spec.params) {
    const std::string& d = q.def;
    bool is_int = !d.empty() && d.find_first_not_of("-0123456789") == std::string::npos;
    bool is_num = !d.empty() && d.find_first_not_of("-0123456789.e") == std::string::npos;
    if (is_int) {
      check_int(q);
    } else if (is_num) {
      const double x = p.f(q.name);
      MP_USER_CHECK(std::isfinite(x), "parameter ", q.name, "=", p.s(q.name), " must be a finite number");
      MP_USER_CHECK(x >= q.min && x <= q.max, "parameter ", q.name, "=", p.s(q.name),
                    " is out of range: it must be in ", range(q.min, q.max, false));
    }
  }
  for (auto& q : compile_params()) check_int(q);
  return p;
}

passes::CompileOptions compile_options(const Params& p) {
  passes::CompileOptions o;
  o.tile.masking = p.i("mask") != 0;
  o.tile.row_tile = p.i("row_tile");
  o.tile.depth = int(p.i("depth"));
  MP_USER_CHECK(p.i("budget_kib") > 0, "budget_kib must be > 0");
  o.tile.onchip_budget = p.i("budget_kib") * 1024;
  o.fuse.enabled = p.i("fuse") != 0;
  o.parallelize.lanes = int(p.i("lanes"));
  o.metapipeline.depth = int(p.i("depth"));
  return o;
}

ir::Program build(const ProgramSpec& spec, const Params& p) {
  ir::Program prog = spec.build(p);
  for (auto& q : spec.params) prog.params[q.name] = p.s(q.name);
  prog.onchip_budget = p.i("budget_kib") * 1024;
  prog.masking = p.i("mask") != 0;
  return prog;
}

}  // namespace mp::examples
