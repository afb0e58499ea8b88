// TPC-H Query 6 (Plasticine / Spatial benchmark): revenue = sum(price * discount) over the line items
// shipped in 1994 with a discount of 0.05 to 0.07 and a quantity below 24.
#include <cmath>

#include "examples/registry.h"
#include "front/front.h"

namespace mp::examples {
namespace {

using namespace mp::front;

// Dates are days since 1992-01-01; 1994-01-01 is day 731.
constexpr double kDateLo = 731, kDateHi = 731 + 365;

ir::Program build_tpchq6(const Params& p) {
  int64_t N = p.i("N"), TS = p.i("TS");
  MP_USER_CHECK(TS >= 1 && TS <= N, "tpchq6: TS=", TS, " must be in [1, N=", N, "]");
  ProgramBuilder b("tpchq6");
  auto Q = b.input("quantity", {N, 1});
  auto D = b.input("discount", {N, 1});
  auto S = b.input("shipdate", {N, 1});
  auto P = b.input("price", {N, 1});
  auto out = b.output("revenue", {1, 1});
  auto zero = FILL({1, 1}, 0.0);
  auto acc = METAPIPE_FOLD(cdiv(N, TS), {zero}, [&](Idx, const std::vector<Value>& s) -> std::vector<Value> {
    auto q = LOAD_TILE(Q, {TS, 1});
    auto d = LOAD_TILE(D, {TS, 1});
    auto t = LOAD_TILE(S, {TS, 1});
    auto pr = LOAD_TILE(P, {TS, 1});
    auto rev = ZIP({q, d, t, pr}, [](const std::vector<Expr>& x) {
      Expr keep = (x[2] >= kDateLo) && (x[2] < kDateHi) && (x[1] >= 0.05 - 1e-6) && (x[1] <= 0.07 + 1e-6) &&
                  (x[0] < 24.0);
      return select(keep, x[3] * x[1], 0.0);
    });
    return {ZIP(s[0], SUM(rev, 0), [](Expr a, Expr c) { return a + c; })};
  });
  STORE_TILE(out, acc[0]);
  return b.finish();
}

void prepare_tpchq6(const Params&, HostInputs& in) {
  // uniform [-1, 1) inputs become a plausible table: quantity 1..50, discount 0.00..0.10, ship date
  // 1992..1998, price 900..105,000
  auto to = [](float u, double lo, double hi) { return lo + (double(u) + 1) / 2 * (hi - lo); };
  for (auto& x : in.at("quantity")) x = float(std::floor(to(x, 1, 51)));
  for (auto& x : in.at("discount")) x = float(std::floor(to(x, 0, 11))) / 100.f;
  for (auto& x : in.at("shipdate")) x = float(std::floor(to(x, 0, 2556)));
  for (auto& x : in.at("price")) x = float(std::floor(to(x, 900, 105000)));
}

HostOutputs reference_tpchq6(const Params& p, const HostInputs& in) {
  double s = 0;
  const auto &q = in.at("quantity"), &d = in.at("discount"), &t = in.at("shipdate"), &pr = in.at("price");
  for (int64_t i = 0; i < p.i("N"); ++i)
    if (t[size_t(i)] >= kDateLo && t[size_t(i)] < kDateHi && d[size_t(i)] >= 0.05 - 1e-6 &&
        d[size_t(i)] <= 0.07 + 1e-6 && q[size_t(i)] < 24)
      s += double(pr[size_t(i)]) * double(d[size_t(i)]);
  return {{"revenue", {s}}};
}

ProgramSpec tpchq6_spec() {
  return {"tpchq6",
          "TPC-H Query 6 (Plasticine/Spatial benchmark): filter on date, discount and quantity, reduce price "
          "x discount",
          {{"N", "8192", "line items"}, {"TS", "1024", "items per tile"}},
          build_tpchq6,
          reference_tpchq6,
          prepare_tpchq6};
}
MP_REGISTER_PROGRAM(tpchq6_spec);

}  // namespace
}  // namespace mp::examples
