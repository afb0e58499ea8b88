// The benchmark programs of Plasticine (ISCA 2017) and Spatial (PLDI 2018) as metapipelined stage graphs.
// Each builder states the metapipeline it builds; tile sizes must divide the problem (a user_error says
// which one does not).
#include "backends/rdu/programs.h"

#include <cmath>
#include <random>

#include "core/error.h"

namespace mp::rdu {
namespace {

int64_t need_div(const std::string& prog, const char* what, int64_t n, const char* tile_name, int64_t t) {
  MP_USER_CHECK(t > 0 && n > 0, prog, ": ", what, " and ", tile_name, " must be positive");
  MP_USER_CHECK(n % t == 0, prog, ": ", tile_name, "=", t, " does not divide ", what, "=", n,
                "; choose a tile that divides it");
  return n / t;
}

std::vector<float> rnd(int64_t n, std::mt19937_64& g, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

// A load or store stage over a tensor, with the kernel that copies the same rows in functional mode.
Stage mem_stage(StageKind kind, std::string name, int tensor, int buffer, int64_t iterations, Access acc) {
  Stage s;
  s.name = std::move(name);
  s.kind = kind;
  s.iterations = iterations;
  s.tensor = tensor;
  s.access = acc;
  if (kind == StageKind::Load)
    s.outputs = {buffer};
  else
    s.inputs = {{buffer, 1}};
  s.kernel = [acc, kind](StageIO& io) {
    int64_t base = acc.offset + (acc.base ? acc.base(io.iter) : (io.iter % acc.wrap) * acc.iter_stride);
    int64_t row = acc.row_bytes / 4;
    for (int64_t r = 0; r < acc.rows; ++r) {
      int64_t at = (base + r * acc.row_stride) / 4;
      MP_INTERNAL_CHECK(at >= 0 && at + row <= io.tensor_elems, "access outside its tensor");
      if (kind == StageKind::Load)
        std::copy_n(io.tensor + at, row, io.out[0] + r * row);
      else
        std::copy_n(io.in[0] + r * row, row, io.tensor + at);
    }
  };
  return s;
}

Access contiguous(int64_t bytes) {
  Access a;
  a.row_bytes = bytes;
  a.iter_stride = bytes;
  return a;
}

Stage compute(std::string name, int64_t iterations, std::vector<Input> in, std::vector<int> out,
              int64_t elements, int ops, Kernel k) {
  Stage s;
  s.name = std::move(name);
  s.iterations = iterations;
  s.inputs = std::move(in);
  s.outputs = std::move(out);
  s.elements = elements;
  s.ops = ops;
  s.kernel = std::move(k);
  return s;
}

// ---------------------------------------------------------------------------------------------- DotProduct
// METAPIPE(N / ts) { a = LOAD_TILE(A); b = LOAD_TILE(B); acc += Reduce(+, Zip(*, a, b)) }; STORE(out, acc)
Graph dotproduct(const Params& p, bool data, uint64_t seed) {
  int64_t N = p.at("N"), ts = p.at("ts");
  int64_t T = need_div("dotproduct", "N", N, "ts", ts);
  Graph g;
  g.name = "dotproduct";
  int A = g.add_tensor("A", N * 4), B = g.add_tensor("B", N * 4), O = g.add_tensor("out", 4);
  if (data) {
    std::mt19937_64 r(seed);
    g.tensors[A].host = rnd(N, r, -1, 1);
    g.tensors[B].host = rnd(N, r, -1, 1);
  }
  int a = g.add_buffer("a_tile", ts * 4), b = g.add_buffer("b_tile", ts * 4), acc = g.add_buffer("acc", 4);
  g.add_stage(mem_stage(StageKind::Load, "load A", A, a, T, contiguous(ts * 4)));
  g.add_stage(mem_stage(StageKind::Load, "load B", B, b, T, contiguous(ts * 4)));
  Stage m = compute("mul+reduce", T, {{a, 1}, {b, 1}}, {acc}, ts, 2, [ts, T](StageIO& io) {
    if (io.iter % T == 0) io.out[0][0] = 0;
    float s = 0;
    for (int64_t i = 0; i < ts; ++i) s += io.in[0][i] * io.in[1][i];
    io.out[0][0] += s;
  });
  m.accumulate = T;
  m.par = int(p.at("par"));
  g.add_stage(std::move(m));
  g.add_stage(mem_stage(StageKind::Store, "store out", O, acc, 1, contiguous(4)));
  return g;
}

// -------------------------------------------------------------------------------------------- OuterProduct
// METAPIPE(M / tm) { a = LOAD_TILE(A); METAPIPE(N / tn) { b = LOAD_TILE(B); c = Map(a x b); STORE_TILE(C, c)
// } }
Graph outerproduct(const Params& p, bool data, uint64_t seed) {
  int64_t M = p.at("M"), N = p.at("N"), tm = p.at("tm"), tn = p.at("tn");
  int64_t I = need_div("outerproduct", "M", M, "tm", tm), J = need_div("outerproduct", "N", N, "tn", tn);
  Graph g;
  g.name = "outerproduct";
  int A = g.add_tensor("A", M * 4), B = g.add_tensor("B", N * 4), C = g.add_tensor("C", M * N * 4);
  if (data) {
    std::mt19937_64 r(seed);
    g.tensors[A].host = rnd(M, r, -1, 1);
    g.tensors[B].host = rnd(N, r, -1, 1);
  }
  int a = g.add_buffer("a_tile", tm * 4), b = g.add_buffer("b_tile", tn * 4),
      c = g.add_buffer("c_tile", tm * tn * 4);
  g.add_stage(mem_stage(StageKind::Load, "load A", A, a, I, contiguous(tm * 4)));
  Access ab = contiguous(tn * 4);
  ab.base = [J, tn](int64_t it) { return (it % J) * tn * 4; };
  g.add_stage(mem_stage(StageKind::Load, "load B", B, b, I * J, ab));
  Stage o = compute("outer", I * J, {{a, J}, {b, 1}}, {c}, tm * tn, 1, [tm, tn](StageIO& io) {
    for (int64_t i = 0; i < tm; ++i)
      for (int64_t j = 0; j < tn; ++j) io.out[0][i * tn + j] = io.in[0][i] * io.in[1][j];
  });
  o.par = int(p.at("par"));
  g.add_stage(std::move(o));
  Access ac;
  ac.rows = tm;
  ac.row_bytes = tn * 4;
  ac.row_stride = N * 4;
  ac.base = [J, tm, tn, N](int64_t it) { return ((it / J) * tm * N + (it % J) * tn) * 4; };
  g.add_stage(mem_stage(StageKind::Store, "store C", C, c, I * J, ac));
  return g;
}

// ------------------------------------------------------------------------------------------------ TPC-H Q6
// METAPIPE(N / ts) { 4 x LOAD_TILE; rev += Reduce(+, Map(filter(date, discount, quantity) ? price * discount
// : 0)) }
constexpr float kQ6DateLo = 731, kQ6DateHi = 731 + 365;  // 1994-01-01 .. 1995-01-01 in days since 1992-01-01
Graph tpchq6(const Params& p, bool data, uint64_t seed) {
  int64_t N = p.at("N"), ts = p.at("ts");
  int64_t T = need_div("tpchq6", "N", N, "ts", ts);
  Graph g;
  g.name = "tpchq6";
  const char* cols[4] = {"quantity", "discount", "shipdate", "price"};
  int t[4], b[4];
  for (int k = 0; k < 4; ++k) t[k] = g.add_tensor(cols[k], N * 4);
  int O = g.add_tensor("revenue", 4);
  if (data) {
    std::mt19937_64 r(seed);
    std::uniform_int_distribution<int> q(1, 50), d(0, 10), day(0, 2555);
    std::uniform_real_distribution<float> pr(900.f, 105000.f);
    for (int k = 0; k < 4; ++k) g.tensors[t[k]].host.resize(size_t(N));
    for (int64_t i = 0; i < N; ++i) {
      g.tensors[t[0]].host[i] = float(q(r));
      g.tensors[t[1]].host[i] = float(d(r)) / 100.f;
      g.tensors[t[2]].host[i] = float(day(r));
      g.tensors[t[3]].host[i] = std::round(pr(r));
    }
  }
  for (int k = 0; k < 4; ++k) b[k] = g.add_buffer(std::string(cols[k]) + "_tile", ts * 4);
  int acc = g.add_buffer("revenue_acc", 4);
  for (int k = 0; k < 4; ++k)
    g.add_stage(
        mem_stage(StageKind::Load, std::string("load ") + cols[k], t[k], b[k], T, contiguous(ts * 4)));
  Stage f = compute(
      "filter+reduce", T, {{b[0], 1}, {b[1], 1}, {b[2], 1}, {b[3], 1}}, {acc}, ts, 9, [ts, T](StageIO& io) {
        if (io.iter % T == 0) io.out[0][0] = 0;
        float s = 0;
        for (int64_t i = 0; i < ts; ++i) {
          float qn = io.in[0][i], dc = io.in[1][i], dt = io.in[2][i], pr = io.in[3][i];
          if (dt >= kQ6DateLo && dt < kQ6DateHi && dc >= 0.05f - 1e-6f && dc <= 0.07f + 1e-6f && qn < 24)
            s += pr * dc;
        }
        io.out[0][0] += s;
      });
  f.accumulate = T;
  f.par = int(p.at("par"));
  g.add_stage(std::move(f));
  g.add_stage(mem_stage(StageKind::Store, "store revenue", O, acc, 1, contiguous(4)));
  return g;
}

// -----------------------------------------------------------------------------------------------
// BlackScholes METAPIPE(N / ts) { 6 x LOAD_TILE; price = Map(black_scholes, ...); STORE_TILE(price) }
// (PARSEC's formula)
template <class F>
F cndf(F x) {
  bool neg = x < 0;
  x = std::abs(x);
  F k = F(1) / (F(1) + F(0.2316419) * x);
  F poly = k * (F(0.319381530) +
                k * (F(-0.356563782) + k * (F(1.781477937) + k * (F(-1.821255978) + k * F(1.330274429)))));
  F n = F(1) - std::exp(F(-0.5) * x * x) * F(0.39894228040143270286) * poly;
  return neg ? F(1) - n : n;
}
template <class F>
F black_scholes(F type, F s, F k, F r, F v, F t) {
  F sq = std::sqrt(t);
  F d1 = ((r + F(0.5) * v * v) * t + std::log(s / k)) / (v * sq);
  F d2 = d1 - v * sq;
  F fv = k * std::exp(-r * t);
  F n1 = cndf(d1), n2 = cndf(d2);
  return type < F(0.5) ? s * n1 - fv * n2 : fv * (F(1) - n2) - s * (F(1) - n1);
}
// FP operations of one option: log, sqrt, exp (x3, each counted as ~8 ops on the PCU's FUs), two CNDF
// polynomials and the combination: about 72 ops, a chain of 12 Plasticine PCUs (6 stages each).
constexpr int kBlackScholesOps = 72;
const char* kBsCols[6] = {"otype", "sptprice", "strike", "rate", "volatility", "otime"};

Graph blackscholes(const Params& p, bool data, uint64_t seed) {
  int64_t N = p.at("N"), ts = p.at("ts");
  int64_t T = need_div("blackscholes", "N", N, "ts", ts);
  Graph g;
  g.name = "blackscholes";
  int t[6], b[6];
  for (int k = 0; k < 6; ++k) t[k] = g.add_tensor(kBsCols[k], N * 4);
  int O = g.add_tensor("price", N * 4);
  if (data) {
    std::mt19937_64 r(seed);
    const float lo[6] = {0, 10, 10, 0.01f, 0.05f, 0.1f}, hi[6] = {2, 100, 100, 0.1f, 0.65f, 2.0f};
    for (int k = 0; k < 6; ++k) g.tensors[t[k]].host = rnd(N, r, lo[k], hi[k]);
    for (auto& x : g.tensors[t[0]].host) x = std::floor(x);  // 0 = call, 1 = put
  }
  for (int k = 0; k < 6; ++k) b[k] = g.add_buffer(std::string(kBsCols[k]) + "_tile", ts * 4);
  int out = g.add_buffer("price_tile", ts * 4);
  for (int k = 0; k < 6; ++k)
    g.add_stage(
        mem_stage(StageKind::Load, std::string("load ") + kBsCols[k], t[k], b[k], T, contiguous(ts * 4)));
  std::vector<Input> in;
  for (int k = 0; k < 6; ++k) in.push_back({b[k], 1});
  Stage c = compute("black-scholes", T, in, {out}, ts, kBlackScholesOps, [ts](StageIO& io) {
    for (int64_t i = 0; i < ts; ++i)
      io.out[0][i] =
          black_scholes<float>(io.in[0][i], io.in[1][i], io.in[2][i], io.in[3][i], io.in[4][i], io.in[5][i]);
  });
  c.par = int(p.at("par"));
  g.add_stage(std::move(c));
  g.add_stage(mem_stage(StageKind::Store, "store price", O, out, T, contiguous(ts * 4)));
  return g;
}

// The functional kernel of a tile MatMul stage: out (m x n) += in[0] (m x k) * in[1] (k x n), the output
// cleared first on every `clear_every`-th iteration (1: every iteration, no accumulation across them).
Kernel tile_matmul_kernel(int64_t m, int64_t n, int64_t k, int64_t clear_every) {
  return [m, n, k, clear_every](StageIO& io) {
    float* o = io.out[0];
    if (io.iter % clear_every == 0) std::fill_n(o, m * n, 0.f);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t kk = 0; kk < k; ++kk) {
        const float av = io.in[0][i * k + kk];
        for (int64_t j = 0; j < n; ++j) o[i * n + j] += av * io.in[1][kk * n + j];
      }
  };
}

// Where iteration `it` of a store of m x n tiles of an (. x N) row-major matrix goes, J tiles per tile row.
Access tile_store_access(int64_t m, int64_t n, int64_t N, int64_t J) {
  Access ac;
  ac.rows = m, ac.row_bytes = n * 4, ac.row_stride = N * 4;
  ac.base = [J, m, n, N](int64_t it) { return ((it / J) * m * N + (it % J) * n) * 4; };
  return ac;
}

// ------------------------------------------------------------------------------------------------------ GEMM
// Blocked (Spatial's GEMM): METAPIPE(M/mm, N/nn) { METAPIPE(K/kk) { a, b = LOAD_TILE; c += MatMul(a, b) };
// STORE_TILE(C, c) }
Graph gemm(const Params& p, bool data, uint64_t seed) {
  int64_t M = p.at("M"), N = p.at("N"), K = p.at("K"), mm = p.at("mm"), nn = p.at("nn"), kk = p.at("kk");
  int64_t I = need_div("gemm", "M", M, "mm", mm), J = need_div("gemm", "N", N, "nn", nn),
          KT = need_div("gemm", "K", K, "kk", kk);
  Graph g;
  g.name = "gemm";
  int A = g.add_tensor("A", M * K * 4), B = g.add_tensor("B", K * N * 4), C = g.add_tensor("C", M * N * 4);
  if (data) {
    std::mt19937_64 r(seed);
    g.tensors[A].host = rnd(M * K, r, -1, 1);
    g.tensors[B].host = rnd(K * N, r, -1, 1);
  }
  int a = g.add_buffer("a_tile", mm * kk * 4), b = g.add_buffer("b_tile", kk * nn * 4),
      c = g.add_buffer("c_tile", mm * nn * 4);
  Access aa;
  aa.rows = mm, aa.row_bytes = kk * 4, aa.row_stride = K * 4;
  aa.base = [J, KT, mm, kk, K](int64_t it) { return ((it / (J * KT)) * mm * K + (it % KT) * kk) * 4; };
  g.add_stage(mem_stage(StageKind::Load, "load A", A, a, I * J * KT, aa));
  Access ab;
  ab.rows = kk, ab.row_bytes = nn * 4, ab.row_stride = N * 4;
  ab.base = [J, KT, kk, nn, N](int64_t it) { return ((it % KT) * kk * N + ((it / KT) % J) * nn) * 4; };
  g.add_stage(mem_stage(StageKind::Load, "load B", B, b, I * J * KT, ab));
  Stage m;
  m.name = "matmul";
  m.iterations = I * J * KT;
  m.inputs = {{a, 1}, {b, 1}};
  m.outputs = {c};
  m.m = mm, m.k = kk, m.n = nn;
  m.accumulate = KT;
  m.par = int(p.at("par"));
  m.kernel = tile_matmul_kernel(mm, nn, kk, KT);
  g.add_stage(std::move(m));
  g.add_stage(mem_stage(StageKind::Store, "store C", C, c, I * J, tile_store_access(mm, nn, N, J)));
  return g;
}

// ------------------------------------------------------------------------------------------- slide-51 matmul
// METAPIPE(M/MM) { a = LOAD_TILE(A, MM x K); METAPIPE(N/NN) { b = LOAD_TILE(B, K x NN, row_par);
//   c = MAT_MUL(a, b); c_tile = BUFFER(c); STORE_TILE(C, c_tile) } }
Graph matmul51(const Params& p, bool data, uint64_t seed) {
  int64_t M = p.at("M"), N = p.at("N"), K = p.at("K"), MM = p.at("MM"), NN = p.at("NN");
  int64_t I = need_div("matmul", "M", M, "MM", MM), J = need_div("matmul", "N", N, "NN", NN);
  Graph g;
  g.name = "matmul";
  int A = g.add_tensor("A", M * K * 4), B = g.add_tensor("B", K * N * 4), C = g.add_tensor("C", M * N * 4);
  if (data) {
    std::mt19937_64 r(seed);
    g.tensors[A].host = rnd(M * K, r, -1, 1);
    g.tensors[B].host = rnd(K * N, r, -1, 1);
  }
  const int depth = int(p.at("depth"));
  int a = g.add_buffer("a_tile", MM * K * 4, depth), b = g.add_buffer("b_tile", K * NN * 4, depth),
      c = g.add_buffer("c_tile", MM * NN * 4, depth);
  g.add_stage(mem_stage(StageKind::Load, "load A", A, a, I, contiguous(MM * K * 4)));
  Access ab;
  ab.rows = K, ab.row_bytes = NN * 4, ab.row_stride = N * 4;
  ab.base = [J, NN](int64_t it) { return (it % J) * NN * 4; };
  g.add_stage(mem_stage(StageKind::Load, "load B", B, b, I * J, ab));
  Stage m;
  m.name = "matmul";
  m.iterations = I * J;
  m.inputs = {{a, J}, {b, 1}};
  m.outputs = {c};
  m.m = MM, m.k = K, m.n = NN;
  m.par = int(p.at("row_par"));
  m.kernel = tile_matmul_kernel(MM, NN, K, 1);
  g.add_stage(std::move(m));
  g.add_stage(mem_stage(StageKind::Store, "store C", C, c, I * J, tile_store_access(MM, NN, N, J)));
  return g;
}

// ------------------------------------------------------------------------------------------------------- GDA
// METAPIPE(R / rt) { x = LOAD_TILE(X); y = LOAD_TILE(Y); d = Zip(-, x, y ? mu1 : mu0); sigma += MatMul(d^T,
// d) }; STORE(sigma)   (slide 50: slice a row, subtract the class mean, outer product, accumulate)
Graph gda(const Params& p, bool data, uint64_t seed) {
  int64_t R = p.at("R"), C = p.at("C"), rt = p.at("rt");
  int64_t T = need_div("gda", "R", R, "rt", rt);
  Graph g;
  g.name = "gda";
  int X = g.add_tensor("X", R * C * 4), Y = g.add_tensor("Y", R * 4), MU = g.add_tensor("mu", 2 * C * 4),
      S = g.add_tensor("sigma", C * C * 4);
  if (data) {
    std::mt19937_64 r(seed);
    g.tensors[X].host = rnd(R * C, r, -1, 1);
    g.tensors[Y].host = rnd(R, r, 0, 2);
    for (auto& y : g.tensors[Y].host) y = std::floor(y);
    g.tensors[MU].host = rnd(2 * C, r, -0.5f, 0.5f);
  }
  int x = g.add_buffer("x_tile", rt * C * 4), y = g.add_buffer("y_tile", rt * 4),
      mu = g.add_buffer("mu", 2 * C * 4), d = g.add_buffer("diff", rt * C * 4),
      s = g.add_buffer("sigma_acc", C * C * 4);
  g.add_stage(mem_stage(StageKind::Load, "load X", X, x, T, contiguous(rt * C * 4)));
  g.add_stage(mem_stage(StageKind::Load, "load Y", Y, y, T, contiguous(rt * 4)));
  g.add_stage(mem_stage(StageKind::Load, "load mu", MU, mu, 1, contiguous(2 * C * 4)));
  g.add_stage(compute("subtract mean", T, {{x, 1}, {y, 1}, {mu, T}}, {d}, rt * C, 2, [rt, C](StageIO& io) {
    for (int64_t i = 0; i < rt; ++i) {
      const float* m = io.in[2] + (io.in[1][i] > 0.5f ? C : 0);
      for (int64_t j = 0; j < C; ++j) io.out[0][i * C + j] = io.in[0][i * C + j] - m[j];
    }
  }));
  Stage o;
  o.name = "outer+accumulate";
  o.iterations = T;
  o.inputs = {{d, 1}};
  o.outputs = {s};
  o.m = C, o.k = rt, o.n = C;
  o.accumulate = T;
  o.par = int(p.at("par"));
  o.kernel = [rt, C, T](StageIO& io) {
    float* out = io.out[0];
    if (io.iter % T == 0) std::fill_n(out, C * C, 0.f);
    for (int64_t r = 0; r < rt; ++r)
      for (int64_t i = 0; i < C; ++i) {
        float di = io.in[0][r * C + i];
        for (int64_t j = 0; j < C; ++j) out[i * C + j] += di * io.in[0][r * C + j];
      }
  };
  g.add_stage(std::move(o));
  g.add_stage(mem_stage(StageKind::Store, "store sigma", S, s, 1, contiguous(C * C * 4)));
  return g;
}

// ---------------------------------------------------------------------------------------------------- Kmeans
// METAPIPE(iters) { METAPIPE(N / pt) { pts = LOAD_TILE(P); a = argmin_k |pts - cent_k|^2; sums += Scatter(a,
// pts) };
//   cent = sums / counts }   The centroids are a loop-carried buffer (one initial token: the first K points).
Graph kmeans(const Params& p, bool data, uint64_t seed) {
  int64_t iters = p.at("iters"), K = p.at("K"), D = p.at("D"), N = p.at("N"), pt = p.at("pt");
  int64_t T = need_div("kmeans", "N", N, "pt", pt);
  MP_USER_CHECK(K <= N, "kmeans: K=", K, " must not exceed N=", N);
  Graph g;
  g.name = "kmeans";
  int P = g.add_tensor("points", N * D * 4), O = g.add_tensor("centroids", K * D * 4);
  if (data) {
    std::mt19937_64 r(seed);
    g.tensors[P].host = rnd(N * D, r, -1, 1);
  }
  int pts = g.add_buffer("pts_tile", pt * D * 4), cent = g.add_buffer("centroids", K * D * 4),
      asg = g.add_buffer("assign", pt * 4), sums = g.add_buffer("sums", K * (D + 1) * 4),
      out = g.add_buffer("out", K * D * 4);
  g.buffers[cent].initial_tokens = 1;
  g.initial_data.resize(g.buffers.size());
  if (data)
    g.initial_data[cent].assign(g.tensors[P].host.begin(), g.tensors[P].host.begin() + K * D);
  else
    g.initial_data[cent].assign(size_t(K * D), 0.f);
  Access ap = contiguous(pt * D * 4);
  ap.wrap = T;
  g.add_stage(mem_stage(StageKind::Load, "load points", P, pts, iters * T, ap));
  Stage d;
  d.name = "distances+argmin";
  d.iterations = iters * T;
  d.inputs = {{pts, 1}, {cent, T}};
  d.outputs = {asg};
  d.m = pt, d.k = D, d.n = K;
  d.par = int(p.at("par"));
  d.kernel = [pt, K, D](StageIO& io) {
    for (int64_t i = 0; i < pt; ++i) {
      double best = 1e300;
      int64_t bk = 0;
      for (int64_t k = 0; k < K; ++k) {
        double s = 0;
        for (int64_t j = 0; j < D; ++j) {
          double t = double(io.in[0][i * D + j]) - io.in[1][k * D + j];
          s += t * t;
        }
        if (s < best) best = s, bk = k;
      }
      io.out[0][i] = float(bk);
    }
  };
  g.add_stage(std::move(d));
  Stage acc =
      compute("accumulate", iters * T, {{pts, 1}, {asg, 1}}, {sums}, pt * D, 2, [pt, K, D, T](StageIO& io) {
        float* s = io.out[0];
        if (io.iter % T == 0) std::fill_n(s, K * (D + 1), 0.f);
        for (int64_t i = 0; i < pt; ++i) {
          int64_t k = int64_t(io.in[1][i]);
          for (int64_t j = 0; j < D; ++j) s[k * (D + 1) + j] += io.in[0][i * D + j];
          s[k * (D + 1) + D] += 1;
        }
      });
  acc.accumulate = T;
  g.add_stage(std::move(acc));
  g.add_stage(compute("update", iters, {{sums, 1}, {cent, 1}}, {cent, out}, K * D, 2, [K, D](StageIO& io) {
    for (int64_t k = 0; k < K; ++k) {
      float n = io.in[0][k * (D + 1) + D];
      for (int64_t j = 0; j < D; ++j) {
        float v = n > 0 ? io.in[0][k * (D + 1) + j] / n : io.in[1][k * D + j];
        io.out[0][k * D + j] = v;
        io.out[1][k * D + j] = v;
      }
    }
  }));
  Access ao = contiguous(K * D * 4);
  ao.wrap = 1;
  g.add_stage(mem_stage(StageKind::Store, "store centroids", O, out, iters, ao));
  return g;
}

// ------------------------------------------------------------------------------------------------ references
using Ref = std::map<std::string, std::vector<double>>;
const std::vector<float>& host(const Graph& g, const std::string& n) {
  for (auto& t : g.tensors)
    if (t.name == n) return t.host;
  fail_internal("no tensor ", n);
}

Ref ref_dot(const Graph& g, const Params&) {
  auto &a = host(g, "A"), &b = host(g, "B");
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return {{"out", {s}}};
}
Ref ref_outer(const Graph& g, const Params&) {
  auto &a = host(g, "A"), &b = host(g, "B");
  std::vector<double> c(a.size() * b.size());
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < b.size(); ++j) c[i * b.size() + j] = double(a[i]) * b[j];
  return {{"C", c}};
}
Ref ref_q6(const Graph& g, const Params&) {
  auto &q = host(g, "quantity"), &d = host(g, "discount"), &t = host(g, "shipdate"), &p = host(g, "price");
  double s = 0;
  for (size_t i = 0; i < q.size(); ++i)
    if (t[i] >= kQ6DateLo && t[i] < kQ6DateHi && d[i] >= 0.05f - 1e-6f && d[i] <= 0.07f + 1e-6f && q[i] < 24)
      s += double(p[i]) * d[i];
  return {{"revenue", {s}}};
}
Ref ref_bs(const Graph& g, const Params&) {
  const std::vector<float>* c[6];
  for (int k = 0; k < 6; ++k) c[k] = &host(g, kBsCols[k]);
  std::vector<double> out(c[0]->size());
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = black_scholes<double>((*c[0])[i], (*c[1])[i], (*c[2])[i], (*c[3])[i], (*c[4])[i], (*c[5])[i]);
  return {{"price", out}};
}
std::vector<double> naive_mm(const std::vector<float>& A, const std::vector<float>& B, int64_t M, int64_t N,
                             int64_t K) {
  std::vector<double> C(size_t(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(A[i * K + k]) * B[k * N + j];
      C[i * N + j] = s;
    }
  return C;
}
Ref ref_gemm(const Graph& g, const Params& p) {
  return {{"C", naive_mm(host(g, "A"), host(g, "B"), p.at("M"), p.at("N"), p.at("K"))}};
}
Ref ref_gda(const Graph& g, const Params& p) {
  int64_t R = p.at("R"), C = p.at("C");
  auto &x = host(g, "X"), &y = host(g, "Y"), &mu = host(g, "mu");
  std::vector<double> s(size_t(C * C), 0.0);
  for (int64_t r = 0; r < R; ++r) {
    const float* m = mu.data() + (y[r] > 0.5f ? C : 0);
    for (int64_t i = 0; i < C; ++i)
      for (int64_t j = 0; j < C; ++j)
        s[i * C + j] += (double(x[r * C + i]) - m[i]) * (double(x[r * C + j]) - m[j]);
  }
  return {{"sigma", s}};
}
Ref ref_kmeans(const Graph& g, const Params& p) {
  int64_t iters = p.at("iters"), K = p.at("K"), D = p.at("D"), N = p.at("N");
  auto& x = host(g, "points");
  std::vector<double> c(x.begin(), x.begin() + K * D);
  for (int64_t it = 0; it < iters; ++it) {
    std::vector<double> s(size_t(K * D), 0.0), n(size_t(K), 0.0);
    for (int64_t i = 0; i < N; ++i) {
      double best = 1e300;
      int64_t bk = 0;
      for (int64_t k = 0; k < K; ++k) {
        double d = 0;
        for (int64_t j = 0; j < D; ++j) {
          double t = double(x[i * D + j]) - float(c[k * D + j]);
          d += t * t;
        }
        if (d < best) best = d, bk = k;
      }
      for (int64_t j = 0; j < D; ++j) s[bk * D + j] += x[i * D + j];
      n[bk] += 1;
    }
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < D; ++j)
        if (n[k] > 0) c[k * D + j] = s[k * D + j] / n[k];
  }
  return {{"centroids", c}};
}

}  // namespace

const std::vector<GraphProgram>& graph_programs() {
  static const std::vector<GraphProgram> p = {
      {"dotproduct",
       "DotProduct (Plasticine/Spatial): Reduce(+, Zip(*)) over tiles of two vectors",
       {{"N", 1 << 24}, {"ts", 16384}, {"par", 4}},
       {{"N", 8192}, {"ts", 1024}, {"par", 2}},
       dotproduct,
       ref_dot},
      {"outerproduct",
       "OuterProduct: C = a b^T, tiles of a reused across the inner loop",
       {{"M", 2048}, {"N", 2048}, {"tm", 64}, {"tn", 256}, {"par", 4}},
       {{"M", 64}, {"N", 96}, {"tm", 16}, {"tn", 32}, {"par", 2}},
       outerproduct,
       ref_outer},
      {"tpchq6",
       "TPC-H Query 6: filter on date, discount and quantity, reduce price x discount",
       {{"N", 1 << 24}, {"ts", 16384}, {"par", 4}},
       {{"N", 8192}, {"ts", 1024}, {"par", 2}},
       tpchq6,
       ref_q6},
      {"blackscholes",
       "BlackScholes option pricing (PARSEC's formula), streaming 6 inputs and 1 output",
       {{"N", 960000}, {"ts", 6400}, {"par", 1}},
       {{"N", 4096}, {"ts", 512}, {"par", 1}},
       blackscholes,
       ref_bs},
      {"gemm",
       "GEMM blocked over M, N and K (Spatial's GEMM), C tile accumulated on chip",
       {{"M", 1024}, {"N", 1024}, {"K", 1024}, {"mm", 128}, {"nn", 128}, {"kk", 128}, {"par", 4}},
       {{"M", 64}, {"N", 64}, {"K", 96}, {"mm", 32}, {"nn", 32}, {"kk", 32}, {"par", 2}},
       gemm,
       ref_gemm},
      {"gda",
       "Gaussian Discriminant Analysis (slide 50): subtract class mean, outer product, accumulate",
       {{"R", 65536}, {"C", 64}, {"rt", 256}, {"par", 4}},
       {{"R", 256}, {"C", 16}, {"rt", 32}, {"par", 2}},
       gda,
       ref_gda},
      {"kmeans",
       "Kmeans: distances and argmin per point tile, centroid sums, update (loop-carried centroids)",
       {{"iters", 4}, {"K", 16}, {"D", 32}, {"N", 65536}, {"pt", 1024}, {"par", 4}},
       {{"iters", 2}, {"K", 4}, {"D", 8}, {"N", 512}, {"pt", 64}, {"par", 2}},
       kmeans,
       ref_kmeans},
      {"matmul",
       "the slide-51 matmul: outer loop over MM x K strips of A, inner over K x NN strips of B",
       {{"M", 1024}, {"N", 1024}, {"K", 1024}, {"MM", 256}, {"NN", 64}, {"row_par", 4}, {"depth", 2}},
       {{"M", 64}, {"N", 64}, {"K", 32}, {"MM", 32}, {"NN", 16}, {"row_par", 4}, {"depth", 2}},
       matmul51,
       ref_gemm},
  };
  return p;
}

const GraphProgram* find_graph_program(const std::string& name) {
  for (auto& p : graph_programs())
    if (p.name == name) return &p;
  return nullptr;
}

Params resolve_params(const GraphProgram& p, const std::vector<std::string>& sets, bool small) {
  Params out = p.defaults;
  if (small)
    for (auto& [k, v] : p.small) out[k] = v;
  for (auto& s : sets) {
    auto eq = s.find('=');
    MP_USER_CHECK(eq != std::string::npos, "--set expects NAME=VALUE, got '", s, "'");
    std::string k = s.substr(0, eq), v = s.substr(eq + 1);
    auto it = out.find(k);
    if (it == out.end()) {
      std::string names;
      for (auto& [n, d] : p.defaults) names += (names.empty() ? "" : ", ") + n;
      fail_user("unknown parameter '", k, "' for program ", p.name, " (parameters: ", names, ")");
    }
    char* end = nullptr;
    long long x = std::strtoll(v.c_str(), &end, 10);
    MP_USER_CHECK(!v.empty() && *end == 0 && x > 0, "--set ", k, " expects a positive integer, got '", v,
                  "'");
    it->second = x;
  }
  return out;
}

}  // namespace mp::rdu
