// One Llama decoder layer on T new tokens at positions P0.. with a KV cache of P0 earlier positions:
// RMSNorm, Q/K/V MatMuls, RoPE, K/V appended to the cache (SCATTER at the tokens' positions), causal
// grouped-query attention over the cache (online softmax, as flash_attention), O projection, residual,
// RMSNorm, gate/up MatMuls, SiLU, down MatMul, residual. Three top-level metapipelines ("kernel calls"):
// token tiles through the QKV block, (kv head, query head in group, query tile) through attention, and
// token tiles through the O projection and the MLP; off-chip temps Qr and Attn connect them.
#include <cmath>
#include <limits>

#include "examples/registry.h"
#include "front/front.h"

namespace mp::examples {
namespace {

using namespace mp::front;

struct Dims {
  int64_t T, P0, S, d, H, HKV, G, Dh, F, TT, TQ, TK;
  double eps, theta;
  explicit Dims(const Params& p)
      : T(p.i("T")),
        P0(p.i("P0")),
        S(0),
        d(0),
        H(p.i("H")),
        HKV(p.i("HKV")),
        G(0),
        Dh(p.i("Dh")),
        F(p.i("F")),
        TT(p.i("TT")),
        TQ(p.i("TQ")),
        TK(p.i("TK")),
        eps(p.f("eps")),
        theta(p.f("theta")) {
    MP_USER_CHECK(T >= 1 && P0 >= 0 && H >= 1 && HKV >= 1 && Dh >= 2 && F >= 1,
                  "llama_decoder: sizes must be positive");
    MP_USER_CHECK(H % HKV == 0, "llama_decoder: H=", H, " query heads must be a multiple of HKV=", HKV,
                  " kv heads");
    MP_USER_CHECK(Dh % 2 == 0, "llama_decoder: Dh=", Dh, " must be even (RoPE rotates pairs)");
    S = P0 + T;
    d = H * Dh;
    G = H / HKV;
    MP_USER_CHECK(TT >= 1 && TT <= T && TQ >= 1 && TQ <= T && TK >= 1 && TK <= S,
                  "llama_decoder: tiles TT=", TT, ", TQ=", TQ, " must be in [1, T=", T, "] and TK=", TK,
                  " in [1, S=", S, "]");
  }
};

// RoPE on interleaved pairs (2i, 2i+1) of each head: x*cos + (x R)*sin, where R maps the pair (a, b)
// to (-b, a); the angle is pos * theta^(-2i/Dh).
Expr rope(Expr x, Expr xr, Expr pos, int64_t Dh, double theta) {
  Expr i2 = floor((index(1) % double(Dh)) / 2.0) * 2.0;
  Expr ang = pos * pow(theta, -i2 / double(Dh));
  return x * cos(ang) + xr * sin(ang);
}
Expr rotation(void) {
  Expr a = index(0), c = index(1);
  return select(eq(c % 2.0, 0.0), select(eq(a, c + 1.0), -1.0, 0.0), select(eq(a, c - 1.0), 1.0, 0.0));
}
Value rms_norm(const Value& x, const Value& w, int64_t d, double eps) {
  auto ss = SUM(MAP(x, [](Expr v) { return v * v; }), 1);
  return ZIP(x, ss, w, [&](Expr v, Expr s, Expr g) { return v * rsqrt(s / double(d) + eps) * g; });
}

ir::Program build_llama(const Params& p) {
  Dims z(p);
  const double inf = std::numeric_limits<double>::infinity(), scale = 1.0 / std::sqrt(double(z.Dh));
  ProgramBuilder b("llama_decoder");
  auto X = b.input("x", {z.T, z.d});
  auto Pos = b.input("pos", {z.T, 1}, DType::i32);
  auto Wn1 = b.input("w_attn_norm", {1, z.d}), Wn2 = b.input("w_ffn_norm", {1, z.d});
  auto Wq = b.input("Wq", {z.d, z.H * z.Dh}), Wk = b.input("Wk", {z.d, z.HKV * z.Dh});
  auto Wv = b.input("Wv", {z.d, z.HKV * z.Dh}), Wo = b.input("Wo", {z.H * z.Dh, z.d});
  auto Wg = b.input("Wg", {z.d, z.F}), Wu = b.input("Wu", {z.d, z.F}), Wd = b.input("Wd", {z.F, z.d});
  auto Kc = b.inout("k_cache", {z.S, z.HKV * z.Dh}), Vc = b.inout("v_cache", {z.S, z.HKV * z.Dh});
  auto Qr = b.temp("q_rope", {z.T, z.H * z.Dh}), Attn = b.temp("attn", {z.T, z.H * z.Dh});
  auto Y = b.output("y", {z.T, z.d});

  // 1. RMSNorm, Q/K/V, RoPE; K and V appended to the cache at the tokens' positions.
  auto wn1 = LOAD(Wn1), wq = LOAD(Wq), wk = LOAD(Wk), wv = LOAD(Wv);
  auto rq = FILL({z.H * z.Dh, z.H * z.Dh}, rotation()), rk = FILL({z.HKV * z.Dh, z.HKV * z.Dh}, rotation());
  METAPIPE(cdiv(z.T, z.TT), [&]() {
    auto x = LOAD_TILE(X, {z.TT, z.d});
    auto pos = LOAD_TILE(Pos, {z.TT, 1});
    auto h = rms_norm(x, wn1, z.d, z.eps);
    auto q = MAT_MUL(h, wq), k = MAT_MUL(h, wk), v = MAT_MUL(h, wv);
    auto qr =
        ZIP(q, MAT_MUL(q, rq), pos, [&](Expr a, Expr r, Expr ps) { return rope(a, r, ps, z.Dh, z.theta); });
    auto kr =
        ZIP(k, MAT_MUL(k, rk), pos, [&](Expr a, Expr r, Expr ps) { return rope(a, r, ps, z.Dh, z.theta); });
    STORE_TILE(Qr, qr);
    SCATTER(Kc, pos, kr);
    SCATTER(Vc, pos, v);
  });

  // 2. Causal grouped-query attention: query head g*G + r reads kv head g.
  METAPIPE(z.HKV, [&](Idx g) {
    METAPIPE(z.G, [&](Idx r) {
      METAPIPE(cdiv(z.T, z.TQ), [&](Idx i) {
        ir::Affine qcol = g * (z.G * z.Dh) + r * z.Dh;
        auto q = LOAD_TILE(Qr, {z.TQ, z.Dh}, at(i * z.TQ, qcol));
        auto m0 = FILL({z.TQ, 1}, -inf), l0 = FILL({z.TQ, 1}, 0.0), o0 = FILL({z.TQ, z.Dh}, 0.0);
        auto st = METAPIPE_FOLD(
            cdiv(z.S, z.TK), {m0, l0, o0}, [&](Idx j, const std::vector<Value>& s) -> std::vector<Value> {
              auto k = LOAD_TILE(Kc, {z.TK, z.Dh}, at(j * z.TK, g * z.Dh));
              auto v = LOAD_TILE(Vc, {z.TK, z.Dh}, at(j * z.TK, g * z.Dh));
              // index(0): token t (position P0 + t); index(1): key position
              auto sc = MAP(MAT_MUL(q, k, transpose_b), [&](Expr x) {
                return select(index(1) <= index(0) + double(z.P0), x * scale, -inf);
              });
              auto m_new = ZIP(s[0], MAX(sc, 1), [](Expr a, Expr c) { return max(a, c); });
              auto alpha = ZIP(s[0], m_new, [](Expr a, Expr c) { return exp(a - c); });
              auto pr = ZIP(sc, m_new, [](Expr x, Expr m) { return exp(x - m); });
              auto l_new = ZIP(s[1], alpha, SUM(pr, 1), [](Expr l, Expr a, Expr rs) { return l * a + rs; });
              auto o_new = ZIP(s[2], alpha, MAT_MUL(pr, v), [](Expr o, Expr a, Expr x) { return o * a + x; });
              return {m_new, l_new, o_new};
            });
        STORE_TILE(Attn, ZIP(st[2], st[1], [](Expr o, Expr l) { return o / l; }), at(i * z.TQ, qcol));
      });
    });
  });

  // 3. O projection, residual, RMSNorm, SwiGLU MLP, residual.
  auto wo = LOAD(Wo), wn2 = LOAD(Wn2), wg = LOAD(Wg), wu = LOAD(Wu), wd = LOAD(Wd);
  METAPIPE(cdiv(z.T, z.TT), [&]() {
    auto a = LOAD_TILE(Attn, {z.TT, z.H * z.Dh});
    auto x = LOAD_TILE(X, {z.TT, z.d});
    auto x1 = ZIP(x, MAT_MUL(a, wo), [](Expr u, Expr o) { return u + o; });
    auto h = rms_norm(x1, wn2, z.d, z.eps);
    auto act = ZIP(MAT_MUL(h, wg), MAT_MUL(h, wu), [](Expr gt, Expr up) { return silu(gt) * up; });
    auto y = ZIP(x1, MAT_MUL(act, wd), [](Expr u, Expr dn) { return u + dn; });
    STORE_TILE(Y, y);
  });
  return b.finish();
}

void prepare_llama(const Params& p, HostInputs& in) {
  Dims z(p);
  for (int64_t t = 0; t < z.T; ++t) in.at("pos")[t] = float(z.P0 + t);
  auto scale = [&](const char* name, double fan_in) {
    for (auto& v : in.at(name)) v = float(v / std::sqrt(fan_in / 3.0));  // unit-variance outputs
  };
  for (auto* w : {"Wq", "Wk", "Wv", "Wg", "Wu"}) scale(w, double(z.d));
  scale("Wo", double(z.H * z.Dh));
  scale("Wd", double(z.F));
  for (auto* w : {"w_attn_norm", "w_ffn_norm"})
    for (auto& v : in.at(w)) v = 1.f + 0.25f * v;
}

using Mat = std::vector<double>;

Mat matmul(const Mat& a, const std::vector<float>& w, int64_t n, int64_t k, int64_t m) {
  Mat c(size_t(n * m), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t kk = 0; kk < k; ++kk)
      for (int64_t j = 0; j < m; ++j) c[i * m + j] += a[i * k + kk] * double(w[kk * m + j]);
  return c;
}
Mat rmsnorm(const Mat& x, const std::vector<float>& w, int64_t n, int64_t d, double eps) {
  Mat h(x.size());
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t c = 0; c < d; ++c) ss += x[i * d + c] * x[i * d + c];
    double r = 1.0 / std::sqrt(ss / double(d) + eps);
    for (int64_t c = 0; c < d; ++c) h[i * d + c] = x[i * d + c] * r * double(w[c]);
  }
  return h;
}
void rope_ref(Mat& x, int64_t n, int64_t width, int64_t Dh, int64_t P0, double theta) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < width; c += 2) {
      int64_t i2 = c % Dh;
      double ang = double(P0 + t) * std::pow(theta, -double(i2) / double(Dh));
      double a = x[t * width + c], b = x[t * width + c + 1];
      x[t * width + c] = a * std::cos(ang) - b * std::sin(ang);
      x[t * width + c + 1] = b * std::cos(ang) + a * std::sin(ang);
    }
}

HostOutputs reference_llama(const Params& p, const HostInputs& in) {
  Dims z(p);
  int64_t kvw = z.HKV * z.Dh, qw = z.H * z.Dh;
  Mat x(in.at("x").begin(), in.at("x").end());
  Mat h = rmsnorm(x, in.at("w_attn_norm"), z.T, z.d, z.eps);
  Mat q = matmul(h, in.at("Wq"), z.T, z.d, qw), k = matmul(h, in.at("Wk"), z.T, z.d, kvw);
  Mat v = matmul(h, in.at("Wv"), z.T, z.d, kvw);
  rope_ref(q, z.T, qw, z.Dh, z.P0, z.theta);
  rope_ref(k, z.T, kvw, z.Dh, z.P0, z.theta);
  Mat kc(in.at("k_cache").begin(), in.at("k_cache").end()),
      vc(in.at("v_cache").begin(), in.at("v_cache").end());
  for (int64_t t = 0; t < z.T; ++t)
    for (int64_t c = 0; c < kvw; ++c)
      kc[(z.P0 + t) * kvw + c] = k[t * kvw + c], vc[(z.P0 + t) * kvw + c] = v[t * kvw + c];
  Mat attn(size_t(z.T * qw), 0.0), sc(static_cast<size_t>(z.S));
  for (int64_t hd = 0; hd < z.H; ++hd) {
    int64_t g = hd / z.G;
    for (int64_t t = 0; t < z.T; ++t) {
      int64_t n = z.P0 + t + 1;
      double mx = -INFINITY, sum = 0;
      for (int64_t s = 0; s < n; ++s) {
        double dot = 0;
        for (int64_t e = 0; e < z.Dh; ++e) dot += q[t * qw + hd * z.Dh + e] * kc[s * kvw + g * z.Dh + e];
        sc[s] = dot / std::sqrt(double(z.Dh));
        mx = std::max(mx, sc[s]);
      }
      for (int64_t s = 0; s < n; ++s) sum += std::exp(sc[s] - mx);
      for (int64_t s = 0; s < n; ++s)
        for (int64_t e = 0; e < z.Dh; ++e)
          attn[t * qw + hd * z.Dh + e] += std::exp(sc[s] - mx) / sum * vc[s * kvw + g * z.Dh + e];
    }
  }
  Mat o = matmul(attn, in.at("Wo"), z.T, qw, z.d);
  for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
  Mat h2 = rmsnorm(x, in.at("w_ffn_norm"), z.T, z.d, z.eps);
  Mat gt = matmul(h2, in.at("Wg"), z.T, z.d, z.F), up = matmul(h2, in.at("Wu"), z.T, z.d, z.F);
  for (size_t i = 0; i < gt.size(); ++i) gt[i] = gt[i] / (1.0 + std::exp(-gt[i])) * up[i];
  Mat dn = matmul(gt, in.at("Wd"), z.T, z.F, z.d);
  for (size_t i = 0; i < x.size(); ++i) x[i] += dn[i];
  return {{"y", x}, {"k_cache", kc}, {"v_cache", vc}};
}

ProgramSpec llama_spec() {
  return {"llama_decoder",
          "one Llama decoder layer: RMSNorm, QKV, RoPE, causal GQA over a KV cache, O proj, SwiGLU MLP, "
          "residuals",
          {{"T", "16", "new tokens"},
           {"P0", "48", "positions already in the KV cache"},
           {"H", "4", "query heads"},
           {"HKV", "2", "key/value heads (grouped-query attention)"},
           {"Dh", "32", "head dimension (model dimension d = H * Dh)"},
           {"F", "256", "MLP hidden dimension"},
           {"TT", "8", "tokens per tile (QKV and MLP blocks)"},
           {"TQ", "8", "query tokens per attention tile"},
           {"TK", "16", "cache positions per attention tile"},
           {"eps", "1e-5", "RMSNorm epsilon", 1e-30, 1},
           {"theta", "10000", "RoPE base", 2, 1e9}},
          build_llama,
          reference_llama,
          prepare_llama};
}
MP_REGISTER_PROGRAM(llama_spec);

}  // namespace
}  // namespace mp::examples
