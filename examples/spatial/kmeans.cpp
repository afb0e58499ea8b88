// Kmeans (Plasticine / Spatial benchmark): `iters` Lloyd iterations. The centroids are loop-carried across
// iterations and read by every point tile of the inner loop, whose sums and counts are loop-carried too.
// The nearest centroid is found as a one-hot row (score == row minimum), so sums and counts are MatMuls.
#include "examples/registry.h"
#include "front/front.h"

namespace mp::examples {
namespace {

using namespace mp::front;

ir::Program build_kmeans(const Params& p) {
  int64_t iters = p.i("iters"), K = p.i("K"), D = p.i("D"), N = p.i("N"), PT = p.i("PT");
  MP_USER_CHECK(K >= 1 && K <= N && N % PT == 0, "kmeans: need 1 <= K=", K, " <= N=", N, " and PT=", PT,
                " dividing N");
  ProgramBuilder b("kmeans");
  auto P = b.input("points", {N, D});
  auto out = b.output("centroids", {K, D});
  auto init = LOAD_TILE(P, {K, D}, at(0, 0));  // the first K points
  auto cent = METAPIPE_FOLD(iters, {init}, [&](Idx, const std::vector<Value>& c) -> std::vector<Value> {
    auto ones_d = FILL({1, D}, 1.0);
    auto norms =
        MAT_MUL(ones_d, ZIP(c[0], c[0], [](Expr x, Expr y) { return x * y; }), transpose_b);  // [1, K]
    auto sums0 = FILL({K, D}, 0.0);
    auto counts0 = FILL({K, 1}, 0.0);
    auto acc = METAPIPE_FOLD(
        N / PT, {sums0, counts0}, [&](Idx t, const std::vector<Value>& s) -> std::vector<Value> {
          auto pts = LOAD_TILE(P, {PT, D}, at(t * PT, 0));
          auto dots = MAT_MUL(pts, c[0], transpose_b);                                // [PT, K]
          auto score = ZIP(dots, norms, [](Expr d, Expr n) { return n - 2.0 * d; });  // |c|^2 - 2 p.c
          auto best = REDUCE(score, 1, Combiner::Min);                                // [PT, 1]
          auto onehot = ZIP(score, best, [](Expr x, Expr m) { return select(x <= m, 1.0, 0.0); });
          auto ones_p = FILL({PT, 1}, 1.0);
          auto sums = ZIP(s[0], MAT_MUL(onehot, pts, transpose_a), [](Expr x, Expr y) { return x + y; });
          auto counts = ZIP(s[1], MAT_MUL(onehot, ones_p, transpose_a), [](Expr x, Expr y) { return x + y; });
          return {sums, counts};
        });
    return {ZIP({acc[0], acc[1], c[0]},
                [](const std::vector<Expr>& x) { return select(x[1] > 0.5, x[0] / x[1], x[2]); })};
  });
  STORE_TILE(out, cent[0], at(0, 0));
  return b.finish();
}

HostOutputs reference_kmeans(const Params& p, const HostInputs& in) {
  int64_t iters = p.i("iters"), K = p.i("K"), D = p.i("D"), N = p.i("N");
  const auto& x = in.at("points");
  std::vector<double> c(x.begin(), x.begin() + K * D);
  for (int64_t it = 0; it < iters; ++it) {
    std::vector<double> s(size_t(K * D), 0.0), n(size_t(K), 0.0);
    for (int64_t i = 0; i < N; ++i) {
      double best = 1e300;
      int64_t bk = 0;
      for (int64_t k = 0; k < K; ++k) {
        double d = 0;
        for (int64_t j = 0; j < D; ++j)
          d += c[size_t(k * D + j)] * c[size_t(k * D + j)] -
               2 * double(x[size_t(i * D + j)]) * c[size_t(k * D + j)];
        if (d < best) best = d, bk = k;
      }
      for (int64_t j = 0; j < D; ++j) s[size_t(bk * D + j)] += x[size_t(i * D + j)];
      n[size_t(bk)] += 1;
    }
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < D; ++j)
        if (n[size_t(k)] > 0) c[size_t(k * D + j)] = float(s[size_t(k * D + j)] / n[size_t(k)]);
  }
  return {{"centroids", c}};
}

ProgramSpec kmeans_spec() {
  return {
      "kmeans",
      "Kmeans (Plasticine/Spatial benchmark): Lloyd iterations with loop-carried centroids, sums and counts",
      {{"iters", "2", "iterations"},
       {"K", "4", "clusters"},
       {"D", "8", "dimensions"},
       {"N", "512", "points"},
       {"PT", "64", "points per tile"}},
      build_kmeans,
      reference_kmeans,
      nullptr};
}
MP_REGISTER_PROGRAM(kmeans_spec);

}  // namespace
}  // namespace mp::examples
