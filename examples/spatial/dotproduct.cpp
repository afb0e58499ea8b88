// DotProduct (Plasticine ISCA 2017 / Spatial PLDI 2018 benchmark): tiles of two vectors are multiplied and
// reduced, the partial sums accumulated in a loop-carried value.
#include <cmath>

#include "examples/registry.h"
#include "front/front.h"

namespace mp::examples {
namespace {

using namespace mp::front;

ir::Program build_dotproduct(const Params& p) {
  int64_t N = p.i("N"), TS = p.i("TS");
  MP_USER_CHECK(TS >= 1 && TS <= N, "dotproduct: TS=", TS, " must be in [1, N=", N, "]");
  ProgramBuilder b("dotproduct");
  auto A = b.input("A", {N, 1});
  auto B = b.input("B", {N, 1});
  auto out = b.output("out", {1, 1});
  auto zero = FILL({1, 1}, 0.0);
  auto acc = METAPIPE_FOLD(cdiv(N, TS), {zero}, [&](Idx, const std::vector<Value>& s) -> std::vector<Value> {
    auto a = LOAD_TILE(A, {TS, 1});
    auto bt = LOAD_TILE(B, {TS, 1});
    auto prod = ZIP(a, bt, [](Expr x, Expr y) { return x * y; });
    return {ZIP(s[0], SUM(prod, 0), [](Expr x, Expr y) { return x + y; })};
  });
  STORE_TILE(out, acc[0]);
  return b.finish();
}

// sum a_i b_i, or sum |a_i b_i| (`magnitude`: the scale of its rounding error, ProgramSpec::magnitude)
HostOutputs dot(const Params& p, const HostInputs& in, bool magnitude) {
  double s = 0;
  for (int64_t i = 0; i < p.i("N"); ++i) {
    const double t = double(in.at("A")[size_t(i)]) * double(in.at("B")[size_t(i)]);
    s += magnitude ? std::fabs(t) : t;
  }
  return {{"out", {s}}};
}
HostOutputs reference_dotproduct(const Params& p, const HostInputs& in) { return dot(p, in, false); }
HostOutputs magnitude_dotproduct(const Params& p, const HostInputs& in) { return dot(p, in, true); }

ProgramSpec dotproduct_spec() {
  return {"dotproduct",
          "DotProduct (Plasticine/Spatial benchmark): Reduce(+) of Zip(*) over vector tiles",
          {{"N", "8192", "vector length"}, {"TS", "1024", "tile size"}},
          build_dotproduct,
          reference_dotproduct,
          nullptr,
          magnitude_dotproduct};
}
MP_REGISTER_PROGRAM(dotproduct_spec);

}  // namespace
}  // namespace mp::examples
