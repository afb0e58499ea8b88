// FlashAttention forward as a metapipeline (slide 54): for each tile of queries, stream key/value tiles
// through QK^T, the causal mask, softmax with online rescaling (running max and sum carried across key
// tiles), dropout from a seeded counter-based RNG, and x V. The key loop becomes three stages: load K/V,
// scores (QK^T, mask, row max), and the recurrence (rescale, exp, sums, dropout, PV, accumulate).
#include <cmath>
#include <limits>

#include "examples/registry.h"
#include "front/front.h"

namespace mp::examples {
namespace {

using namespace mp::front;

ir::Program build_flash(const Params& p) {
  int64_t S = p.i("S"), D = p.i("D"), BR = p.i("BR"), BC = p.i("BC");
  double p_drop = p.f("p_drop");
  uint64_t seed = uint64_t(p.i("seed"));
  bool causal = p.i("causal") != 0;
  DType dt = p.dtype();
  MP_USER_CHECK(dt != DType::i32, "flash_attention: dtype must be f32, bf16 or f16, got i32");
  MP_USER_CHECK(p_drop >= 0 && p_drop < 1, "flash_attention: p_drop=", p_drop, " must be in [0, 1)");
  MP_USER_CHECK(BR >= 1 && BR <= S && BC >= 1 && BC <= S, "flash_attention: tiles BR=", BR, ", BC=", BC,
                " must be in [1, S=", S, "]");
  const double scale = 1.0 / std::sqrt(double(D)), inf = std::numeric_limits<double>::infinity();
  ProgramBuilder b("flash_attention");
  auto Q = b.input("Q", {S, D}, dt), K = b.input("K", {S, D}, dt), V = b.input("V", {S, D}, dt);
  auto O = b.output("O", {S, D}, dt);
  METAPIPE(cdiv(S, BR), [&]() {
    auto q = LOAD_TILE(Q, {BR, D});
    auto m0 = FILL({BR, 1}, -inf), l0 = FILL({BR, 1}, 0.0), o0 = FILL({BR, D}, 0.0);
    auto st =
        METAPIPE_FOLD(cdiv(S, BC), {m0, l0, o0}, [&](Idx, const std::vector<Value>& s) -> std::vector<Value> {
          auto k = LOAD_TILE(K, {BC, D});
          auto v = LOAD_TILE(V, {BC, D});
          auto qk = MAT_MUL(q, k, transpose_b);  // [BR, BC]; index(0) = query row, index(1) = key row
          auto sc = MAP(
              qk, [&](Expr x) { return causal ? select(index(1) <= index(0), x * scale, -inf) : x * scale; });
          auto mx = MAX(sc, 1);
          auto m_new = ZIP(s[0], mx, [](Expr a, Expr c) { return max(a, c); });
          auto alpha = ZIP(s[0], m_new, [](Expr a, Expr c) { return exp(a - c); });
          auto pr = ZIP(sc, m_new, [](Expr x, Expr m) { return exp(x - m); });
          auto l_new = ZIP(s[1], alpha, SUM(pr, 1), [](Expr l, Expr a, Expr r) { return l * a + r; });
          auto kept = MAP(pr, [&](Expr x) {
            return p_drop > 0 ? select(uniform(seed) >= p_drop, x / (1 - p_drop), 0.0) : x;
          });
          auto pv = MAT_MUL(kept, v);
          auto o_new = ZIP(s[2], alpha, pv, [](Expr o, Expr a, Expr x) { return o * a + x; });
          return {m_new, l_new, o_new};
        });
    auto o = ZIP(st[2], st[1], [](Expr x, Expr l) { return x / l; });
    STORE_TILE(O, o);
  });
  return b.finish();
}

// O, or with abs_v each element's magnitude sum_c p_c |V[c, d]| (the sum of the absolute values of its
// terms).
std::vector<double> run_flash(const Params& p, const HostInputs& in, bool abs_v) {
  int64_t S = p.i("S"), D = p.i("D");
  double p_drop = p.f("p_drop");
  uint64_t seed = uint64_t(p.i("seed"));
  bool causal = p.i("causal") != 0;
  const auto &Q = in.at("Q"), &K = in.at("K"), &V = in.at("V");
  std::vector<double> O(size_t(S * D), 0.0), sc(static_cast<size_t>(S));
  double scale = 1.0 / std::sqrt(double(D));
  for (int64_t r = 0; r < S; ++r) {
    int64_t n = causal ? r + 1 : S;
    double mx = -INFINITY, sum = 0;
    for (int64_t c = 0; c < n; ++c) {
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += double(Q[r * D + d]) * double(K[c * D + d]);
      sc[c] = dot * scale;
      mx = std::max(mx, sc[c]);
    }
    for (int64_t c = 0; c < n; ++c) sum += std::exp(sc[c] - mx);
    for (int64_t c = 0; c < n; ++c) {
      double pr = std::exp(sc[c] - mx) / sum;
      int64_t idx[2] = {r, c};
      if (p_drop > 0) pr = ir::random_uniform(seed, idx) >= p_drop ? pr / (1 - p_drop) : 0.0;
      for (int64_t d = 0; d < D; ++d) {
        const double v = double(V[c * D + d]);
        O[r * D + d] += pr * (abs_v ? std::fabs(v) : v);
      }
    }
  }
  return O;
}

HostOutputs reference_flash(const Params& p, const HostInputs& in) { return {{"O", run_flash(p, in, false)}}; }

// The scale of the check's absolute tolerance (examples::check_atol: 1e-3 of the largest magnitude):
// twice the largest sum_c p_c |V[c, d]|. A target that rounds P to bf16 before P V (the GPU's attention
// pipeline, docs/cuda-lowering.md) errs by up to 2^-9 of that sum on an element, however small the
// element itself is after its terms cancel; 1e-3 of twice the sum covers it, where a wrong mask, tile or
// row shows as errors of the size of the sum.
HostOutputs magnitude_flash(const Params& p, const HostInputs& in) {
  auto m = run_flash(p, in, true);
  for (double& x : m) x *= 2;
  return {{"O", m}};
}

ProgramSpec flash_spec() {
  return {"flash_attention",
          "FlashAttention forward (slide 54): QK^T, causal mask, online softmax, seeded dropout, x V",
          {{"S", "256", "sequence length"},
           {"D", "64", "head dimension"},
           {"BR", "64", "query rows per tile"},
           {"BC", "64", "keys per tile"},
           {"p_drop", "0.1", "dropout probability"},
           {"seed", "1234", "dropout RNG seed"},
           {"causal", "1", "1: causal mask"},
           {"dtype", "f32", "f32 or bf16"}},
          build_flash,
          reference_flash,
          nullptr,
          magnitude_flash};
}
MP_REGISTER_PROGRAM(flash_spec);

}  // namespace
}  // namespace mp::examples
