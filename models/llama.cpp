// The Llama generator: one IR program per (configuration, tokens per call, context). Top-level
// statements, per layer: RMSNorm, Q/K/V projections, RoPE, K/V scattered into the layer's cache at the
// tokens' positions, a METAPIPE nest (kv head, query head of the group) folding online softmax over
// cache tiles, O projection, residual, RMSNorm, SwiGLU MLP, residual; then the final norm and the LM head
// on the last token. Attention masks by position (key position <= the query's), so one program serves
// any position: the cache holds `context` positions and entries past a query's position never count.
#include "models/llama.h"

#include <cmath>
#include <limits>
#include <map>
#include <numbers>
#include <sstream>

#include "front/front.h"

namespace mp::models {

using namespace mp::front;

std::string layer_tensor(int64_t layer, const std::string& what) {
  return "blk." + std::to_string(layer) + "." + what;
}

std::vector<std::string> weight_names(const LlamaConfig& c) {
  std::vector<std::string> w = {"token_embd.weight", "output_norm.weight"};
  if (!c.tied_embeddings) w.push_back("output.weight");
  for (int64_t l = 0; l < c.layers; ++l)
    for (const char* t : {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
                          "ffn_up", "ffn_down"})
      w.push_back(layer_tensor(l, std::string(t) + ".weight"));
  return w;
}

void LlamaConfig::check() const {
  auto pos = [&](int64_t v, const char* what) {
    MP_USER_CHECK(v >= 1, "llama config '", name, "': ", what, " = ", v, " must be >= 1");
  };
  pos(layers, "layers (block_count)");
  pos(d_model, "d_model (embedding_length)");
  pos(heads, "heads (attention.head_count)");
  pos(kv_heads, "kv_heads (attention.head_count_kv)");
  pos(head_dim, "head_dim");
  pos(ffn, "ffn (feed_forward_length)");
  pos(vocab, "vocab");
  pos(context, "context (context_length)");
  MP_USER_CHECK(heads % kv_heads == 0, "llama config '", name, "': ", heads,
                " query heads are not a multiple of ", kv_heads, " kv heads (grouped-query attention)");
  MP_USER_CHECK(head_dim % 2 == 0, "llama config '", name, "': head_dim ", head_dim,
                " must be even (RoPE rotates pairs)");
  MP_USER_CHECK(rope_theta > 1 && std::isfinite(rope_theta), "llama config '", name, "': rope theta ",
                rope_theta, " must be > 1");
  MP_USER_CHECK(rms_eps > 0 && rms_eps < 1, "llama config '", name, "': RMSNorm epsilon ", rms_eps,
                " must be in (0, 1)");
  // Keep every tensor's element count and the attention loop nest within what the IR indexes.
  MP_USER_CHECK(d_model <= (1 << 20) && ffn <= (1 << 22) && vocab <= (1 << 24) && context <= (1 << 24) &&
                    layers <= 4096 && heads * head_dim <= (1 << 20),
                "llama config '", name, "': sizes beyond what metapipe supports (", summary(), ")");
}

std::string LlamaConfig::summary() const {
  std::ostringstream s;
  s << layers << " layers, d " << d_model << ", " << heads << "/" << kv_heads << " heads of " << head_dim
    << ", FFN " << ffn << ", vocab " << vocab << ", ctx " << context << ", RoPE theta " << rope_theta;
  if (rope_scaling) s << " (llama3 scaling x" << rope_scaling->factor << ")";
  return s.str();
}

std::vector<std::string> LlamaConfig::preset_names() { return {"smollm2-135m", "llama3.1-8b", "toy"}; }

LlamaConfig LlamaConfig::preset(const std::string& n) {
  LlamaConfig c;
  c.name = n;
  if (n == "smollm2-135m") {
    c.layers = 30, c.d_model = 576, c.heads = 9, c.kv_heads = 3, c.head_dim = 64, c.ffn = 1536;
    c.vocab = 49152, c.context = 8192, c.rope_theta = 100000, c.rms_eps = 1e-5;
  } else if (n == "llama3.1-8b") {
    c.layers = 32, c.d_model = 4096, c.heads = 32, c.kv_heads = 8, c.head_dim = 128, c.ffn = 14336;
    c.vocab = 128256, c.context = 131072, c.rope_theta = 500000, c.rms_eps = 1e-5;
    c.rope_scaling = RopeScaling{};
    c.tied_embeddings = false;
  } else if (n == "toy") {
    c.layers = 2, c.d_model = 64, c.heads = 4, c.kv_heads = 2, c.head_dim = 16, c.ffn = 128;
    c.vocab = 96, c.context = 64, c.rope_theta = 10000, c.rms_eps = 1e-5;
  } else {
    std::string all;
    for (auto& p : preset_names()) all += (all.empty() ? "" : ", ") + p;
    fail_user("unknown model shapes '", n, "'; presets: ", all);
  }
  c.check();
  return c;
}

double rope_frequency(const LlamaConfig& c, int64_t pair) {
  double freq = std::pow(c.rope_theta, -double(2 * pair) / double(c.head_dim));
  if (!c.rope_scaling) return freq;
  const RopeScaling& s = *c.rope_scaling;
  double wavelen = 2 * std::numbers::pi / freq;
  double low_wl = double(s.original_context) / s.low_freq_factor;
  double high_wl = double(s.original_context) / s.high_freq_factor;
  if (wavelen < high_wl) return freq;
  if (wavelen > low_wl) return freq / s.factor;
  double smooth =
      (double(s.original_context) / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1 - smooth) * freq / s.factor + smooth * freq;
}

namespace {

// The same frequency as an element function of the column (index(1)) of a [T, heads*head_dim] value.
Expr rope_frequency_expr(const LlamaConfig& c) {
  double Dh = double(c.head_dim);
  Expr i2 = floor((index(1) % Dh) / 2.0) * 2.0;
  Expr freq = pow(c.rope_theta, -i2 / Dh);
  if (!c.rope_scaling) return freq;
  const RopeScaling& s = *c.rope_scaling;
  Expr wavelen = (2 * std::numbers::pi) / freq;
  double low_wl = double(s.original_context) / s.low_freq_factor;
  double high_wl = double(s.original_context) / s.high_freq_factor;
  Expr smooth =
      (double(s.original_context) / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  Expr blended = (1.0 - smooth) * freq / s.factor + smooth * freq;
  return select(wavelen < high_wl, freq, select(wavelen > low_wl, freq / s.factor, blended));
}

// x R for adjacent pairs: (a, b) -> (-b, a). Column c of R picks row c+1 with -1 (even c) or row c-1
// with +1 (odd c).
Expr pair_rotation() {
  Expr r = index(0), c = index(1);
  return select(eq(c % 2.0, 0.0), select(eq(r, c + 1.0), -1.0, 0.0), select(eq(r, c - 1.0), 1.0, 0.0));
}

Value rms_norm(const Value& x, const Value& w, int64_t d, double eps) {
  auto ss = SUM(MAP(x, [](Expr v) { return v * v; }), 1);
  return ZIP(x, ss, w, [&](Expr v, Expr s, Expr g) { return v * rsqrt(s / double(d) + eps) * g; });
}

Value project(const Value& x, const Tensor& w) { return MAT_MUL(x, LOAD(w), transpose_b); }

}  // namespace

ir::Program build_llama_program(const LlamaConfig& c, const LlamaProgramOptions& o) {
  c.check();
  const int64_t T = o.tokens, C = o.context ? o.context : c.context;
  MP_USER_CHECK(T >= 1, "llama program: tokens per call must be >= 1 (got ", T, ")");
  MP_USER_CHECK(C >= 1 && C <= c.context, "llama program: context ", C, " must be in [1, ", c.context,
                "] (the model's context length)");
  MP_USER_CHECK(T <= C, "llama program: ", T, " tokens do not fit a context of ", C, " positions");
  int64_t TK = o.attn_tile;
  if (TK == 0)
    for (TK = std::min<int64_t>(C, 256); C % TK != 0;) --TK;
  MP_USER_CHECK(TK >= 1 && TK <= C && C % TK == 0, "llama program: attention tile ", TK,
                " must divide the context ", C);
  const int64_t d = c.d_model, Dh = c.head_dim, H = c.heads, HKV = c.kv_heads, G = H / HKV;
  const int64_t qw = H * Dh, kvw = HKV * Dh;
  const double inf = std::numeric_limits<double>::infinity(), scale = 1.0 / std::sqrt(double(Dh));

  ProgramBuilder b("llama");
  b.param("model", c.name);
  b.param("layers", std::to_string(c.layers));
  b.param("tokens", std::to_string(T));
  b.param("context", std::to_string(C));
  const bool whole = o.part == LlamaProgramOptions::Part::Whole;
  Tensor Tok, Emb, Xin;
  if (whole) Tok = b.input("tokens", {T, 1}, DType::i32);
  auto Pos = b.input("pos", {T, 1}, DType::i32);
  const DType wdt = o.weight_dtype;
  if (whole)
    Emb = b.input("token_embd.weight", {c.vocab, d}, wdt);
  else
    Xin = b.input("x", {T, d});
  std::vector<Tensor> layer_w;  // 9 per layer, in weight_names order
  for (int64_t l = 0; l < c.layers; ++l) {
    auto w = [&](const char* n, ir::Shape s) { layer_w.push_back(b.input(layer_tensor(l, n), s, wdt)); };
    w("attn_norm.weight", {1, d});
    w("attn_q.weight", {qw, d});
    w("attn_k.weight", {kvw, d});
    w("attn_v.weight", {kvw, d});
    w("attn_output.weight", {d, qw});
    w("ffn_norm.weight", {1, d});
    w("ffn_gate.weight", {c.ffn, d});
    w("ffn_up.weight", {c.ffn, d});
    w("ffn_down.weight", {d, c.ffn});
  }
  Tensor OutNorm, Out, Hf, Logits, Xout;
  if (whole) {
    OutNorm = b.input("output_norm.weight", {1, d});
    Out = c.tied_embeddings ? Emb : b.input("output.weight", {c.vocab, d}, wdt);
  }
  auto Qr = b.temp("q_rope", {T, qw}), Attn = b.temp("attn", {T, qw});
  if (whole)
    Hf = b.temp("h_final", {T, d}), Logits = b.output("logits", {1, c.vocab});
  else
    Xout = b.output("x_out", {T, d});

  auto pos = LOAD(Pos);
  auto x = whole ? GATHER(Emb, LOAD(Tok)) : LOAD(Xin);
  Value rq, rk;  // whole-width rotations; the streamed form builds one per tile width instead
  if (o.weight_tile == 0) rq = FILL({qw, qw}, pair_rotation()), rk = FILL({kvw, kvw}, pair_rotation());
  Expr freq = rope_frequency_expr(c);
  auto rope = [&](Expr v, Expr vr, Expr p) { return v * cos(p * freq) + vr * sin(p * freq); };

  // Streamed weights (o.weight_tile > 0): a projection is a METAPIPE over row tiles of its weight, each
  // tile's slice of the output stored into a temp at its columns. With `rotate`, the tile's RoPE runs in
  // the same iteration (the rotation is block diagonal in pairs and the frequency reads the output's
  // global column, so a tile of whole heads rotates on its own).
  const int64_t want_tile = o.weight_tile;
  MP_USER_CHECK(want_tile >= 0, "llama program: weight tile ", want_tile, " must be >= 0");
  auto tile_rows = [&](int64_t rows, int64_t multiple) {
    int64_t best = rows;
    for (int64_t t = multiple; t <= std::min(rows, std::max(want_tile, multiple)); t += multiple)
      if (rows % t == 0) best = t;
    return best;
  };
  std::map<int64_t, Value> rotations;  // FILL of the pair rotation per tile width
  auto streamed = [&](const Value& in, const Tensor& W, const Tensor& out, bool rotate) {
    const int64_t rows = W->shape[0], cols = W->shape[1], nt = tile_rows(rows, rotate ? Dh : 1);
    Value rt;
    if (rotate) {
      if (!rotations.count(nt)) rotations[nt] = FILL({nt, nt}, pair_rotation());
      rt = rotations[nt];
    }
    METAPIPE(rows / nt, [&](Idx i) {
      auto y = MAT_MUL(in, LOAD_TILE(W, {nt, cols}, at(i * nt, 0)), transpose_b);
      STORE_TILE(out, rotate ? ZIP(y, MAT_MUL(y, rt), pos, rope) : y, at(0, i * nt));
    });
  };

  for (int64_t l = 0; l < c.layers; ++l) {
    const Tensor* w = &layer_w[size_t(l * 9)];
    auto Kc = b.inout(layer_tensor(l, "cache_k"), {C, kvw}, o.cache_dtype),
         Vc = b.inout(layer_tensor(l, "cache_v"), {C, kvw}, o.cache_dtype);
    auto h = rms_norm(x, LOAD(w[0]), d, c.rms_eps);
    if (want_tile > 0) {
      auto Kr = b.temp(layer_tensor(l, "k_rope"), {T, kvw}), Vt = b.temp(layer_tensor(l, "v"), {T, kvw});
      streamed(h, w[1], Qr, true);
      streamed(h, w[2], Kr, true);
      streamed(h, w[3], Vt, false);
      SCATTER(Kc, pos, LOAD(Kr));
      SCATTER(Vc, pos, LOAD(Vt));
    } else {
      auto q = project(h, w[1]), k = project(h, w[2]), v = project(h, w[3]);
      STORE(Qr, ZIP(q, MAT_MUL(q, rq), pos, rope));
      SCATTER(Kc, pos, ZIP(k, MAT_MUL(k, rk), pos, rope));
      SCATTER(Vc, pos, v);
    }

    // Query head g*G + r reads kv head g; the fold runs online softmax over the cache's tiles.
    METAPIPE(HKV, [&](Idx g) {
      METAPIPE(G, [&](Idx r) {
        ir::Affine qcol = g * (G * Dh) + r * Dh;
        auto qh = LOAD_TILE(Qr, {T, Dh}, at(0, qcol));
        auto m0 = FILL({T, 1}, -inf), l0 = FILL({T, 1}, 0.0), o0 = FILL({T, Dh}, 0.0);
        auto st = METAPIPE_FOLD(C / TK, {m0, l0, o0}, [&](Idx j, const std::vector<Value>& s) {
          auto kt = LOAD_TILE(Kc, {TK, Dh}, at(j * TK, g * Dh));
          auto vt = LOAD_TILE(Vc, {TK, Dh}, at(j * TK, g * Dh));
          // index(1) is the key's cache position; a query sees positions up to its own.
          auto sc = ZIP(MAT_MUL(qh, kt, transpose_b), pos,
                        [&](Expr e, Expr p) { return select(index(1) <= p, e * scale, -inf); });
          auto m_new = ZIP(s[0], MAX(sc, 1), [](Expr a, Expr m) { return max(a, m); });
          auto alpha = ZIP(s[0], m_new, [](Expr a, Expr m) { return exp(a - m); });
          auto pr = ZIP(sc, m_new, [](Expr e, Expr m) { return exp(e - m); });
          auto l_new = ZIP(s[1], alpha, SUM(pr, 1), [](Expr a, Expr al, Expr rs) { return a * al + rs; });
          auto o_new =
              ZIP(s[2], alpha, MAT_MUL(pr, vt), [](Expr a, Expr al, Expr pv) { return a * al + pv; });
          return std::vector<Value>{m_new, l_new, o_new};
        });
        STORE_TILE(Attn, ZIP(st[2], st[1], [](Expr a, Expr s) { return a / s; }), at(0, qcol));
      });
    });

    if (want_tile > 0) {
      auto Ot = b.temp(layer_tensor(l, "attn_out"), {T, d}), Act = b.temp(layer_tensor(l, "ffn_act"), {T, c.ffn});
      auto Dn = b.temp(layer_tensor(l, "ffn_out"), {T, d});
      streamed(LOAD(Attn), w[4], Ot, false);
      x = ZIP(x, LOAD(Ot), [](Expr a, Expr e) { return a + e; });
      auto h2 = rms_norm(x, LOAD(w[5]), d, c.rms_eps);
      // gate and up share their tiles' loop: one pass over both weights, the SwiGLU product stored
      const int64_t nt = tile_rows(c.ffn, 1);
      METAPIPE(c.ffn / nt, [&](Idx i) {
        auto gt = MAT_MUL(h2, LOAD_TILE(w[6], {nt, d}, at(i * nt, 0)), transpose_b);
        auto up = MAT_MUL(h2, LOAD_TILE(w[7], {nt, d}, at(i * nt, 0)), transpose_b);
        STORE_TILE(Act, ZIP(gt, up, [](Expr g, Expr u) { return silu(g) * u; }), at(0, i * nt));
      });
      streamed(LOAD(Act), w[8], Dn, false);
      x = ZIP(x, LOAD(Dn), [](Expr a, Expr e) { return a + e; });
      continue;
    }
    x = ZIP(x, project(LOAD(Attn), w[4]), [](Expr a, Expr e) { return a + e; });
    auto h2 = rms_norm(x, LOAD(w[5]), d, c.rms_eps);
    auto act = ZIP(project(h2, w[6]), project(h2, w[7]), [](Expr gt, Expr up) { return silu(gt) * up; });
    x = ZIP(x, project(act, w[8]), [](Expr a, Expr e) { return a + e; });
  }
  if (!whole) {
    STORE(Xout, x);
    return b.finish();
  }
  STORE(Hf, rms_norm(x, LOAD(OutNorm), d, c.rms_eps));
  if (want_tile > 0)
    streamed(LOAD_TILE(Hf, {1, d}, at(T - 1, 0)), Out, Logits, false);
  else
    STORE(Logits, project(LOAD_TILE(Hf, {1, d}, at(T - 1, 0)), Out));
  return b.finish();
}

}  // namespace mp::models
