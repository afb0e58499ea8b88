// The runner: weight bindings, plans per token count, and the per-call inputs (token ids, positions).
#include "models/llama_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/quant.h"

namespace mp::models {

namespace {
uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

std::vector<uint8_t> random_blocks(quant::QType type, int64_t rows, int64_t cols, double a, uint64_t seed) {
  auto rb = quant::row_bytes(type, cols);
  MP_USER_CHECK(rb.has_value(), "random weights: a row of ", cols, " elements is not a whole number of ",
                quant::to_string(type), " blocks");
  std::vector<uint8_t> out(size_t(*rb) * size_t(rows));
  uint64_t s = seed * 0x2545f4914f6cdd1dull + 1;
  const int64_t blocks = int64_t(out.size()) / quant::info(type).block_bytes;
  if (type == quant::QType::Q8_0) {
    auto* b = reinterpret_cast<quant::BlockQ8_0*>(out.data());
    uint16_t d = quant::float_to_fp16(float(a / 127.0));
    for (int64_t i = 0; i < blocks; ++i) {
      b[i].d = d;
      for (int k = 0; k < int(quant::kQK); k += 8) {
        uint64_t r = splitmix(s);
        for (int j = 0; j < 8; ++j) b[i].qs[k + j] = int8_t(int((r >> (8 * j)) & 0xff) % 255 - 127);
      }
    }
  } else if (type == quant::QType::Q4_1) {
    auto* b = reinterpret_cast<quant::BlockQ4_1*>(out.data());
    uint16_t d = quant::float_to_fp16(float(2 * a / 15.0)), m = quant::float_to_fp16(float(-a));
    for (int64_t i = 0; i < blocks; ++i) {
      b[i].d = d, b[i].m = m;
      uint64_t r0 = splitmix(s), r1 = splitmix(s);
      std::memcpy(b[i].qs, &r0, 8);
      std::memcpy(b[i].qs + 8, &r1, 8);
    }
  } else if (type == quant::QType::F32) {
    auto* f = reinterpret_cast<float*>(out.data());
    for (int64_t i = 0; i < rows * cols; ++i) f[i] = float(a * (double(splitmix(s) >> 11) * 0x1p-53 * 2 - 1));
  } else {
    throw not_supported(std::string("random weights of type ") + quant::to_string(type));
  }
  return out;
}

LlamaRunner::LlamaRunner(LlamaConfig c, cpu::WeightBindings w, const RunnerOptions& o)
    : cfg_(std::move(c)), weights_(std::move(w)) {
  MP_USER_CHECK(o.threads >= 1 && o.threads <= 1024, "--threads ", o.threads, " must be in [1, 1024]");
  ctx_ = o.context ? o.context : cfg_.context;
  batch_ = o.batch;
  MP_USER_CHECK(batch_ >= 1, "batch ", batch_, " must be >= 1");
  MP_USER_CHECK(ctx_ >= 1 && ctx_ <= cfg_.context, "context ", ctx_, " must be in [1, ", cfg_.context,
                "] (the model's context length)");
  engine_ = std::make_unique<cpu::LlmEngine>(weights_, o.threads);
}

std::unique_ptr<LlamaRunner> LlamaRunner::random(const LlamaConfig& c, const RunnerOptions& o, uint64_t seed,
                                                 quant::QType type, bool share_layers) {
  c.check();
  cpu::WeightBindings w;
  std::vector<std::vector<uint8_t>> owned;
  std::map<std::string, const uint8_t*> first_layer;
  uint64_t k = 0;
  auto add = [&](const std::string& name, quant::QType t, int64_t rows, int64_t cols, double a,
                 const std::string& shared_key) {
    ++k;
    if (share_layers && !shared_key.empty()) {
      if (auto it = first_layer.find(shared_key); it != first_layer.end()) {
        w[name] = cpu::QMatrix{t, it->second, rows, cols};
        return;
      }
    }
    owned.push_back(random_blocks(t, rows, cols, a, seed * 1000003 + k));
    if (t == quant::QType::F32) {  // norm weights: 1 + small noise
      auto* f = reinterpret_cast<float*>(owned.back().data());
      for (int64_t i = 0; i < rows * cols; ++i) f[i] += 1.f;
    }
    w[name] = cpu::QMatrix{t, owned.back().data(), rows, cols};
    if (!shared_key.empty()) first_layer.emplace(shared_key, owned.back().data());
  };
  const int64_t d = c.d_model, qw = c.heads * c.head_dim, kvw = c.kv_heads * c.head_dim;
  auto lin = [](int64_t fan_in) { return std::sqrt(3.0 / double(fan_in)); };  // unit-variance outputs
  add("token_embd.weight", type == quant::QType::F32 ? type : quant::QType::Q8_0, c.vocab, d, 1.0, "");
  add("output_norm.weight", quant::QType::F32, 1, d, 0.1, "");
  if (!c.tied_embeddings) add("output.weight", type, c.vocab, d, lin(d), "");
  for (int64_t l = 0; l < c.layers; ++l) {
    auto n = [&](const char* t) { return layer_tensor(l, t); };
    add(n("attn_norm.weight"), quant::QType::F32, 1, d, 0.1, "");
    add(n("attn_q.weight"), type, qw, d, lin(d), "q");
    add(n("attn_k.weight"), type, kvw, d, lin(d), "k");
    add(n("attn_v.weight"), type, kvw, d, lin(d), "v");
    add(n("attn_output.weight"), type, d, qw, lin(qw), "o");
    add(n("ffn_norm.weight"), quant::QType::F32, 1, d, 0.1, "");
    add(n("ffn_gate.weight"), type, c.ffn, d, lin(d), "g");
    add(n("ffn_up.weight"), type, c.ffn, d, lin(d), "u");
    add(n("ffn_down.weight"), type, d, c.ffn, lin(c.ffn), "dn");
  }
  std::unique_ptr<LlamaRunner> r(new LlamaRunner(c, std::move(w), o));
  r->owned_ = std::move(owned);
  return r;
}

void LlamaRunner::prepare(int64_t tokens) {
  if (tokens > batch_ && tokens % batch_) prepare(tokens % batch_);  // the last call's size
  tokens = std::min(tokens, batch_);
  if (plans_.count(tokens)) return;
  LlamaProgramOptions po;
  po.tokens = tokens;
  po.context = ctx_;
  plans_[tokens] = engine_->plan(build_llama_program(cfg_, po));
}

cpu::LlmEngine::Plan& LlamaRunner::plan(int64_t tokens) {
  prepare(tokens);
  return *plans_.at(std::min(tokens, batch_));
}

const cpu::PlanStats& LlamaRunner::stats(int64_t tokens) { return engine_->stats(plan(tokens)); }

const std::vector<float>& LlamaRunner::forward(const std::vector<int32_t>& tokens) {
  const int64_t T = int64_t(tokens.size());
  MP_USER_CHECK(T >= 1, "forward: no tokens");
  MP_USER_CHECK(pos_ + T <= ctx_, "the prompt and generated tokens need ", pos_ + T,
                " positions but the context holds ", ctx_);
  for (int64_t t = 0; t < T; ++t)
    MP_USER_CHECK(tokens[size_t(t)] >= 0 && tokens[size_t(t)] < cfg_.vocab, "token id ", tokens[size_t(t)],
                  " is outside the vocabulary [0, ", cfg_.vocab, ")");
  for (int64_t begin = 0; begin < T; begin += batch_) {
    const int64_t n = std::min(batch_, T - begin);
    prepare(n);
    auto& plan = *plans_.at(n);
    auto& tok = engine_->tensor(plan, "tokens");
    auto& pos = engine_->tensor(plan, "pos");
    for (int64_t t = 0; t < n; ++t)
      tok[size_t(t)] = float(tokens[size_t(begin + t)]), pos[size_t(t)] = float(pos_ + t);
    engine_->run(plan);
    pos_ += n;
    if (begin + n == T) logits_ = engine_->tensor(plan, "logits");
  }
  return logits_;
}

int64_t LlamaRunner::weight_bytes() const {
  int64_t b = 0;
  std::map<const void*, bool> seen;
  for (auto& [n, q] : weights_)
    if (!seen[q.data]) seen[q.data] = true, b += int64_t(*quant::row_bytes(q.type, q.cols)) * q.rows;
  return b;
}

int64_t LlamaRunner::kv_cache_bytes() const {
  return cfg_.layers * 2 * ctx_ * cfg_.kv_heads * cfg_.head_dim * int64_t(sizeof(float));
}

}  // namespace mp::models
