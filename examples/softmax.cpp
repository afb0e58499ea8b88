// softmax (slide 48) as a whole-tensor pattern chain Map(exp) -> Reduce(+) -> Zip(/); the tile pass
// splits it into row tiles and the metapipeline pass overlaps load, compute and store.
#include <cmath>

#include "examples/registry.h"
#include "front/front.h"

namespace mp::examples {
namespace {

using namespace mp::front;

ir::Program build_softmax(const Params& p) {
  int64_t R = p.i("R"), C = p.i("C");
  DType dt = p.dtype();
  MP_USER_CHECK(dt != DType::i32, "softmax: dtype must be f32, bf16 or f16, got i32");
  ProgramBuilder b("softmax");
  auto X = b.input("X", {R, C}, dt);
  auto Y = b.output("Y", {R, C}, dt);
  auto x = LOAD(X);
  auto e = MAP(x, [](Expr v) { return exp(v); });
  auto s = REDUCE(e, 1, Combiner::Add);
  auto y = ZIP(e, s, [](Expr a, Expr b) { return a / b; });
  STORE(Y, y);
  return b.finish();
}

HostOutputs reference_softmax(const Params& p, const HostInputs& in) {
  int64_t R = p.i("R"), C = p.i("C");
  const auto& X = in.at("X");
  std::vector<double> Y(size_t(R * C));
  for (int64_t r = 0; r < R; ++r) {
    double sum = 0;
    for (int64_t c = 0; c < C; ++c) sum += std::exp(double(X[r * C + c]));
    for (int64_t c = 0; c < C; ++c) Y[r * C + c] = std::exp(double(X[r * C + c])) / sum;
  }
  return {{"Y", Y}};
}

ProgramSpec softmax_spec() {
  return {
      "softmax",
      "row softmax as Map(exp) -> Reduce(+) -> Zip(/) (slide 48), tiled and metapipelined by the compiler",
      {{"R", "256", "rows"}, {"C", "128", "columns (softmax axis)"}, {"dtype", "f32", "f32 or bf16"}},
      build_softmax,
      reference_softmax,
      nullptr};
}
MP_REGISTER_PROGRAM(softmax_spec);

}  // namespace
}  // namespace mp::examples
