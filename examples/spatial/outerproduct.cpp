// OuterProduct (Plasticine / Spatial benchmark): C = a b^T, a tile of a reused by the inner loop over b.
#include "examples/registry.h"
#include "front/front.h"

namespace mp::examples {
namespace {

using namespace mp::front;

ir::Program build_outerproduct(const Params& p) {
  int64_t M = p.i("M"), N = p.i("N"), TM = p.i("TM"), TN = p.i("TN");
  MP_USER_CHECK(TM >= 1 && TM <= M && TN >= 1 && TN <= N, "outerproduct: tiles TM=", TM, ", TN=", TN,
                " must be in [1, M=", M, "] and [1, N=", N, "]");
  ProgramBuilder b("outerproduct");
  auto A = b.input("A", {M, 1});
  auto B = b.input("B", {1, N});
  auto C = b.output("C", {M, N});
  METAPIPE(cdiv(M, TM), [&]() {
    auto a = LOAD_TILE(A, {TM, 1});
    METAPIPE(cdiv(N, TN), [&]() {
      auto bt = LOAD_TILE(B, {1, TN});
      STORE_TILE(C, ZIP(a, bt, [](Expr x, Expr y) { return x * y; }));
    });
  });
  return b.finish();
}

HostOutputs reference_outerproduct(const Params& p, const HostInputs& in) {
  int64_t M = p.i("M"), N = p.i("N");
  std::vector<double> c(size_t(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      c[size_t(i * N + j)] = double(in.at("A")[size_t(i)]) * double(in.at("B")[size_t(j)]);
  return {{"C", c}};
}

ProgramSpec outerproduct_spec() {
  return {"outerproduct",
          "OuterProduct (Plasticine/Spatial benchmark): C = a b^T over tiles, a's tile reused across the "
          "inner loop",
          {{"M", "256", "length of a"},
           {"N", "256", "length of b"},
           {"TM", "32", "tile of a"},
           {"TN", "64", "tile of b"}},
          build_outerproduct,
          reference_outerproduct,
          nullptr};
}
MP_REGISTER_PROGRAM(outerproduct_spec);

}  // namespace
}  // namespace mp::examples
