// Gaussian Discriminant Analysis covariance (slide 50): for each row, slice it, subtract its class mean,
// take the outer product, accumulate. Row tiles flow through a 4-stage metapipeline: load (rows, labels
// and the gathered class means), subtract, outer product (a MatMul of the tile with itself), accumulate.
#include "examples/registry.h"
#include "front/front.h"

namespace mp::examples {
namespace {

using namespace mp::front;

ir::Program build_gda(const Params& p) {
  int64_t R = p.i("R"), C = p.i("C"), TR = p.i("TR");
  MP_USER_CHECK(TR >= 1 && TR <= R, "gda: TR=", TR, " must be in [1, R=", R, "]");
  ProgramBuilder b("gda");
  auto X = b.input("X", {R, C});
  auto Y = b.input("y", {R, 1}, DType::i32);  // class labels 0 / 1
  auto Mu = b.input("mu", {2, C});            // class means
  auto Sigma = b.output("Sigma", {C, C});
  auto zero = FILL({C, C}, 0.0);
  auto sigma =
      METAPIPE_FOLD(cdiv(R, TR), {zero}, [&](Idx, const std::vector<Value>& acc) -> std::vector<Value> {
        auto x = LOAD_TILE(X, {TR, C});
        auto y = LOAD_TILE(Y, {TR, 1});
        auto mu = GATHER(Mu, y);                                            // the class mean of each row
        auto d = ZIP(x, mu, [](Expr a, Expr m) { return a - m; });          // subtract
        auto outer = MAT_MUL(d, d, transpose_a);                            // sum of the rows' outer products
        return {ZIP(acc[0], outer, [](Expr s, Expr o) { return s + o; })};  // accumulate
      });
  STORE_TILE(Sigma, sigma[0]);
  return b.finish();
}

void prepare_gda(const Params&, HostInputs& in) {
  for (auto& v : in.at("y")) v = v >= 0 ? 1.f : 0.f;
}

HostOutputs reference_gda(const Params& p, const HostInputs& in) {
  int64_t R = p.i("R"), C = p.i("C");
  const auto &X = in.at("X"), &y = in.at("y"), &mu = in.at("mu");
  std::vector<double> S(size_t(C * C), 0.0), d(static_cast<size_t>(C));
  for (int64_t r = 0; r < R; ++r) {
    int64_t k = int64_t(y[r]);
    for (int64_t c = 0; c < C; ++c) d[c] = double(X[r * C + c]) - double(mu[k * C + c]);
    for (int64_t i = 0; i < C; ++i)
      for (int64_t j = 0; j < C; ++j) S[i * C + j] += d[i] * d[j];
  }
  return {{"Sigma", S}};
}

ProgramSpec gda_spec() {
  return {
      "gda",
      "Gaussian discriminant analysis covariance (slide 50): slice, subtract mean, outer product, accumulate",
      {{"R", "1024", "rows (samples)"}, {"C", "32", "columns (features)"}, {"TR", "128", "rows per tile"}},
      build_gda,
      reference_gda,
      prepare_gda};
}
MP_REGISTER_PROGRAM(gda_spec);

}  // namespace
}  // namespace mp::examples
