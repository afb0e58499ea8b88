// BlackScholes (Plasticine / Spatial benchmark; PARSEC's formula): six input streams, one output stream,
// a long elementwise function in between. Spatial (PLDI 2018) reports 960,000 options on a 16 x 8
// Plasticine with one DDR3-1600 channel at 2.33 ms (see docs/rdu.md).
#include <cmath>

#include "examples/registry.h"
#include "front/front.h"

namespace mp::examples {
namespace {

using namespace mp::front;

const char* kCols[6] = {"otype", "sptprice", "strike", "rate", "volatility", "otime"};

Expr cndf(const Expr& x) {
  Expr ax = abs(x);
  Expr k = recip(1.0 + 0.2316419 * ax);
  Expr poly =
      k * (0.319381530 + k * (-0.356563782 + k * (1.781477937 + k * (-1.821255978 + k * 1.330274429))));
  Expr n = 1.0 - exp(-0.5 * ax * ax) * 0.39894228040143270286 * poly;
  return select(x < 0.0, 1.0 - n, n);
}

ir::Program build_blackscholes(const Params& p) {
  int64_t N = p.i("N"), TS = p.i("TS");
  MP_USER_CHECK(TS >= 1 && TS <= N, "blackscholes: TS=", TS, " must be in [1, N=", N, "]");
  ProgramBuilder b("blackscholes");
  std::vector<Tensor> in;
  for (const char* c : kCols) in.push_back(b.input(c, {N, 1}));
  auto price = b.output("price", {N, 1});
  METAPIPE(cdiv(N, TS), [&]() {
    std::vector<Value> t;
    for (auto& x : in) t.push_back(LOAD_TILE(x, {TS, 1}));
    STORE_TILE(price, ZIP(t, [](const std::vector<Expr>& x) {
                 const Expr &type = x[0], &s = x[1], &k = x[2], &r = x[3], &v = x[4], &tt = x[5];
                 Expr sq = sqrt(tt);
                 Expr d1 = ((r + 0.5 * v * v) * tt + log(s / k)) / (v * sq);
                 Expr d2 = d1 - v * sq;
                 Expr fv = k * exp(-r * tt);
                 Expr n1 = cndf(d1), n2 = cndf(d2);
                 return select(type < 0.5, s * n1 - fv * n2, fv * (1.0 - n2) - s * (1.0 - n1));
               }));
  });
  return b.finish();
}

void prepare_blackscholes(const Params&, HostInputs& in) {
  const double lo[6] = {0, 10, 10, 0.01, 0.05, 0.1}, hi[6] = {2, 100, 100, 0.1, 0.65, 2.0};
  for (int c = 0; c < 6; ++c)
    for (auto& x : in.at(kCols[c])) {
      x = float(lo[c] + (double(x) + 1) / 2 * (hi[c] - lo[c]));
      if (c == 0) x = std::floor(x);  // 0 = call, 1 = put
    }
}

double cndf_ref(double x) {
  double ax = std::fabs(x), k = 1 / (1 + 0.2316419 * ax);
  double poly =
      k * (0.319381530 + k * (-0.356563782 + k * (1.781477937 + k * (-1.821255978 + k * 1.330274429))));
  double n = 1 - std::exp(-0.5 * ax * ax) * 0.39894228040143270286 * poly;
  return x < 0 ? 1 - n : n;
}

HostOutputs reference_blackscholes(const Params& p, const HostInputs& in) {
  int64_t N = p.i("N");
  std::vector<double> out(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    double type = in.at("otype")[size_t(i)], s = in.at("sptprice")[size_t(i)], k = in.at("strike")[size_t(i)];
    double r = in.at("rate")[size_t(i)], v = in.at("volatility")[size_t(i)], t = in.at("otime")[size_t(i)];
    double d1 = ((r + 0.5 * v * v) * t + std::log(s / k)) / (v * std::sqrt(t)), d2 = d1 - v * std::sqrt(t);
    double fv = k * std::exp(-r * t), n1 = cndf_ref(d1), n2 = cndf_ref(d2);
    out[size_t(i)] = type < 0.5 ? s * n1 - fv * n2 : fv * (1 - n2) - s * (1 - n1);
  }
  return {{"price", out}};
}

ProgramSpec blackscholes_spec() {
  return {"blackscholes",
          "BlackScholes option pricing (Plasticine/Spatial benchmark, PARSEC's formula): 6 input streams, 1 "
          "output",
          {{"N", "4096", "options"}, {"TS", "512", "options per tile"}},
          build_blackscholes,
          reference_blackscholes,
          prepare_blackscholes};
}
MP_REGISTER_PROGRAM(blackscholes_spec);

}  // namespace
}  // namespace mp::examples
