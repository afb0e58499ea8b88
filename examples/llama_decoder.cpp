// The Llama generator of models/llama.h registered as the example program `llama_decoder`: the whole
// model (embedding, `layers` decoder layers over a KV cache, final norm, LM head) on `tokens` new tokens
// at positions past.. of a cache of `context` positions, at toy shapes set by --set. The same definition
// runs on the CPU engine with a model file's weights (metapipe generate), on the reference interpreter and
// on the simulated dataflow accelerator (metapipe sim). The reference below is a separate naive
// implementation in double.
#include <algorithm>
#include <cmath>
#include <limits>

#include "examples/registry.h"
#include "models/llama.h"

namespace mp::examples {
namespace {

models::LlamaConfig config_of(const Params& p) {
  models::LlamaConfig c;
  c.name = "llama_decoder";
  c.layers = p.i("layers"), c.d_model = p.i("d_model"), c.heads = p.i("heads"), c.kv_heads = p.i("kv_heads");
  c.head_dim = p.i("head_dim"), c.ffn = p.i("ffn"), c.vocab = p.i("vocab"), c.context = p.i("context");
  c.rope_theta = p.f("theta"), c.rms_eps = p.f("eps");
  c.tied_embeddings = true;
  c.check();
  return c;
}

models::LlamaProgramOptions options_of(const Params& p, const models::LlamaConfig& c) {
  models::LlamaProgramOptions o;
  o.tokens = p.i("tokens");
  o.context = c.context;
  o.attn_tile = p.i("attn_tile");
  o.weight_tile = p.i("weight_tile");
  const int64_t past = p.i("past");
  MP_USER_CHECK(o.tokens >= 1, "llama_decoder: tokens=", o.tokens, " must be >= 1");
  MP_USER_CHECK(past + o.tokens <= c.context, "llama_decoder: past=", past, " cached positions + tokens=",
                o.tokens, " new ones do not fit context=", c.context, "; raise context or lower past");
  return o;
}

ir::Program build_llama(const Params& p) {
  models::LlamaConfig c = config_of(p);
  ir::Program prog = models::build_llama_program(c, options_of(p, c));
  prog.name = "llama_decoder";
  return prog;
}

void prepare_llama(const Params& p, HostInputs& in) {
  models::LlamaConfig c = config_of(p);
  const int64_t T = p.i("tokens"), past = p.i("past");
  // token ids from the uniform [-1, 1) draws, spread over the vocabulary
  for (auto& v : in.at("tokens"))
    v = float(std::clamp<int64_t>(int64_t((double(v) + 1) / 2 * double(c.vocab)), 0, c.vocab - 1));
  for (int64_t t = 0; t < T; ++t) in.at("pos")[size_t(t)] = float(past + t);
  auto scale = [&](const std::string& name, double fan_in) {
    for (auto& v : in.at(name)) v = float(v / std::sqrt(fan_in / 3.0));  // unit-variance outputs
  };
  for (int64_t l = 0; l < c.layers; ++l) {
    for (auto* w : {"attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"})
      scale(models::layer_tensor(l, std::string(w) + ".weight"), double(c.d_model));
    scale(models::layer_tensor(l, "attn_output.weight"), double(c.heads * c.head_dim));
    scale(models::layer_tensor(l, "ffn_down.weight"), double(c.ffn));
    for (auto* w : {"attn_norm", "ffn_norm"})
      for (auto& v : in.at(models::layer_tensor(l, std::string(w) + ".weight"))) v = 1.f + 0.25f * v;
  }
  for (auto& v : in.at("output_norm.weight")) v = 1.f + 0.25f * v;
}

using Mat = std::vector<double>;

// x [n, k] times W^T for W [m, k] (a row of W is one output feature, as GGUF stores projections).
Mat project(const Mat& x, const std::vector<float>& w, int64_t n, int64_t k, int64_t m) {
  Mat y(size_t(n * m), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double s = 0;
      for (int64_t e = 0; e < k; ++e) s += x[size_t(i * k + e)] * double(w[size_t(j * k + e)]);
      y[size_t(i * m + j)] = s;
    }
  return y;
}
Mat rmsnorm(const Mat& x, const std::vector<float>& w, int64_t n, int64_t d, double eps) {
  Mat h(x.size());
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t c = 0; c < d; ++c) ss += x[size_t(i * d + c)] * x[size_t(i * d + c)];
    double r = 1.0 / std::sqrt(ss / double(d) + eps);
    for (int64_t c = 0; c < d; ++c) h[size_t(i * d + c)] = x[size_t(i * d + c)] * r * double(w[size_t(c)]);
  }
  return h;
}
// RoPE on adjacent pairs (2i, 2i+1) of each head, angle = position * theta^(-2i / head_dim).
void rope(Mat& x, int64_t n, int64_t width, int64_t Dh, int64_t past, double theta) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < width; c += 2) {
      double ang = double(past + t) * std::pow(theta, -double(c % Dh) / double(Dh));
      double a = x[size_t(t * width + c)], b = x[size_t(t * width + c + 1)];
      x[size_t(t * width + c)] = a * std::cos(ang) - b * std::sin(ang);
      x[size_t(t * width + c + 1)] = b * std::cos(ang) + a * std::sin(ang);
    }
}

struct RefResult {
  HostOutputs out, mag;
};

RefResult reference_run(const Params& p, const HostInputs& in) {
  models::LlamaConfig c = config_of(p);
  const int64_t T = p.i("tokens"), past = p.i("past"), d = c.d_model, Dh = c.head_dim, H = c.heads;
  const int64_t HKV = c.kv_heads, G = H / HKV, qw = H * Dh, kvw = HKV * Dh, F = c.ffn, V = c.vocab;
  const auto& emb = in.at("token_embd.weight");
  Mat x(size_t(T * d));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = int64_t(in.at("tokens")[size_t(t)]);
    for (int64_t e = 0; e < d; ++e) x[size_t(t * d + e)] = double(emb[size_t(id * d + e)]);
  }
  RefResult R;
  for (int64_t l = 0; l < c.layers; ++l) {
    auto w = [&](const char* n) -> const std::vector<float>& {
      return in.at(models::layer_tensor(l, std::string(n) + ".weight"));
    };
    Mat h = rmsnorm(x, w("attn_norm"), T, d, c.rms_eps);
    Mat q = project(h, w("attn_q"), T, d, qw), k = project(h, w("attn_k"), T, d, kvw);
    Mat v = project(h, w("attn_v"), T, d, kvw);
    rope(q, T, qw, Dh, past, c.rope_theta);
    rope(k, T, kvw, Dh, past, c.rope_theta);
    const std::string kn = models::layer_tensor(l, "cache_k"), vn = models::layer_tensor(l, "cache_v");
    Mat kc(in.at(kn).begin(), in.at(kn).end()), vc(in.at(vn).begin(), in.at(vn).end());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < kvw; ++e) {
        kc[size_t((past + t) * kvw + e)] = k[size_t(t * kvw + e)];
        vc[size_t((past + t) * kvw + e)] = v[size_t(t * kvw + e)];
      }
    Mat attn(size_t(T * qw), 0.0), sc(size_t(past + T));
    for (int64_t hd = 0; hd < H; ++hd) {
      const int64_t g = hd / G;
      for (int64_t t = 0; t < T; ++t) {
        const int64_t n = past + t + 1;  // a token sees the cache up to its own position
        double mx = -std::numeric_limits<double>::infinity(), sum = 0;
        for (int64_t s = 0; s < n; ++s) {
          double dot = 0;
          for (int64_t e = 0; e < Dh; ++e)
            dot += q[size_t(t * qw + hd * Dh + e)] * kc[size_t(s * kvw + g * Dh + e)];
          sc[size_t(s)] = dot / std::sqrt(double(Dh));
          mx = std::max(mx, sc[size_t(s)]);
        }
        for (int64_t s = 0; s < n; ++s) sum += std::exp(sc[size_t(s)] - mx);
        for (int64_t s = 0; s < n; ++s)
          for (int64_t e = 0; e < Dh; ++e)
            attn[size_t(t * qw + hd * Dh + e)] +=
                std::exp(sc[size_t(s)] - mx) / sum * vc[size_t(s * kvw + g * Dh + e)];
      }
    }
    Mat o = project(attn, w("attn_output"), T, qw, d);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    Mat h2 = rmsnorm(x, w("ffn_norm"), T, d, c.rms_eps);
    Mat gt = project(h2, w("ffn_gate"), T, d, F), up = project(h2, w("ffn_up"), T, d, F);
    for (size_t i = 0; i < gt.size(); ++i) gt[i] = gt[i] / (1.0 + std::exp(-gt[i])) * up[i];
    Mat dn = project(gt, w("ffn_down"), T, F, d);
    for (size_t i = 0; i < x.size(); ++i) x[i] += dn[i];
    R.out[kn] = std::move(kc);
    R.out[vn] = std::move(vc);
  }
  Mat hf = rmsnorm(x, in.at("output_norm.weight"), T, d, c.rms_eps);
  Mat last(hf.begin() + (T - 1) * d, hf.end());
  R.out["logits"] = project(last, emb, 1, d, V);  // tied embeddings: the LM head reads token_embd
  Mat alast(last.size());
  std::transform(last.begin(), last.end(), alast.begin(), [](double a) { return std::fabs(a); });
  std::vector<float> aemb(emb.size());
  std::transform(emb.begin(), emb.end(), aemb.begin(), [](float a) { return std::fabs(a); });
  R.mag["logits"] = project(alast, aemb, 1, d, V);
  return R;
}

HostOutputs reference_llama(const Params& p, const HostInputs& in) { return reference_run(p, in).out; }
HostOutputs magnitude_llama(const Params& p, const HostInputs& in) { return reference_run(p, in).mag; }

ProgramSpec llama_spec() {
  return {"llama_decoder",
          "the Llama generator (models/llama.h) at toy shapes: embedding, decoder layers (RMSNorm, QKV, "
          "RoPE, GQA over a KV cache, O proj, SwiGLU MLP), final norm, LM head",
          {{"layers", "2", "decoder layers", 1, 64},
           {"d_model", "64", "model dimension", 2, 4096},
           {"heads", "4", "query heads", 1, 256},
           {"kv_heads", "2", "key/value heads (grouped-query attention; divides heads)", 1, 256},
           {"head_dim", "16", "head dimension (even: RoPE rotates pairs)", 2, 512},
           {"ffn", "128", "MLP hidden dimension", 1, 16384},
           {"vocab", "96", "vocabulary (the LM head's outputs; tied embeddings)", 1, 1 << 20},
           {"context", "32", "KV cache positions", 1, 1 << 16},
           {"tokens", "4", "new tokens in this call (1: one decode step)", 1, 4096},
           {"past", "12", "positions already in the KV cache before these tokens", 0, 1 << 16},
           {"attn_tile", "0", "cache positions per attention tile (0: largest divisor of context <= 256)"},
           {"weight_tile", "0",
            "rows of a weight matrix streamed per tile (0: each weight loaded whole; see docs/rdu.md)"},
           {"eps", "1e-5", "RMSNorm epsilon", 1e-30, 1},
           {"theta", "10000", "RoPE base", 2, 1e9}},
          build_llama,
          reference_llama,
          prepare_llama,
          magnitude_llama};
}
MP_REGISTER_PROGRAM(llama_spec);

}  // namespace
}  // namespace mp::examples
