// The Llama generator's program: it verifies, runs on the reference interpreter at toy sizes, and the CPU
// engine's plan of the same program (quantized matmuls, vector loops, the attention loop) agrees with
// the interpreter on prefill and decode.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/cpu/interpreter.h"
#include "core/quant.h"
#include "ir/verify.h"
#include "models/llama.h"
#include "models/llama_runner.h"
#include "tests/support/expect_user_error.h"

namespace mp::models {
namespace {

// Float contents of every weight binding, as the interpreter's inputs.
std::map<std::string, std::vector<float>> dequantized(const cpu::WeightBindings& w) {
  std::map<std::string, std::vector<float>> m;
  for (auto& [name, q] : w) {
    std::vector<float> f(size_t(q.rows * q.cols));
    uint64_t rb = *quant::row_bytes(q.type, q.cols);
    for (int64_t r = 0; r < q.rows; ++r)
      quant::dequantize_row(q.type, static_cast<const uint8_t*>(q.data) + r * rb, &f[size_t(r * q.cols)],
                            q.cols);
    m[name] = std::move(f);
  }
  return m;
}

// Runs `calls` (token lists) through the interpreter, carrying the KV cache between programs; returns
// the last call's logits.
std::vector<float> interpret_calls(const LlamaConfig& c, int64_t context, const cpu::WeightBindings& w,
                                   const std::vector<std::vector<int32_t>>& calls) {
  auto inputs = dequantized(w);
  std::map<std::string, std::vector<float>> cache;
  for (int64_t l = 0; l < c.layers; ++l)
    for (const char* t : {"cache_k", "cache_v"})
      cache[layer_tensor(l, t)] = std::vector<float>(size_t(context * c.kv_heads * c.head_dim), 0.f);
  int64_t pos = 0;
  std::vector<float> logits;
  for (auto& toks : calls) {
    LlamaProgramOptions o;
    o.tokens = int64_t(toks.size());
    o.context = context;
    o.attn_tile = 8;
    ir::Program p = build_llama_program(c, o);
    auto in = inputs;
    for (auto& [n, v] : cache) in[n] = v;
    for (auto t : toks) in["tokens"].push_back(float(t)), in["pos"].push_back(float(pos++));
    cpu::Memory mem = cpu::make_memory(p, in);
    cpu::interpret(p, mem);
    for (auto& [n, v] : cache) v = mem.at(n).data;
    logits = mem.at("logits").data;
  }
  return logits;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

TEST(LlamaProgram, VerifiesForPresets) {
  for (auto& name : LlamaConfig::preset_names()) {
    LlamaConfig c = LlamaConfig::preset(name);
    LlamaProgramOptions o;
    o.tokens = 4;
    o.context = std::min<int64_t>(c.context, 512);
    ir::Program p = build_llama_program(c, o);
    EXPECT_NO_THROW(ir::verify(p)) << name;
    int matmuls = 0, attention_loops = 0;
    ir::walk(p.body, [&](const ir::NodeRef& n, int depth) {
      matmuls += depth == 0 && n->as<ir::MatMul>() ? 1 : 0;
      attention_loops += depth == 0 && n->as<ir::MetaPipe>() ? 1 : 0;
    });
    // Per layer q, k, v, two RoPE rotations, o, gate, up, down; then the LM head.
    EXPECT_EQ(matmuls, 9 * c.layers + 1) << name;
    EXPECT_EQ(attention_loops, c.layers) << name;
    EXPECT_EQ(p.tensor("logits")->shape, (ir::Shape{1, c.vocab}));
  }
}

TEST(LlamaProgram, Llama31Shapes) {
  LlamaConfig c = LlamaConfig::preset("llama3.1-8b");
  EXPECT_EQ(c.layers, 32);
  EXPECT_EQ(c.d_model, 4096);
  EXPECT_EQ(c.heads, 32);
  EXPECT_EQ(c.kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.ffn, 14336);
  EXPECT_EQ(c.vocab, 128256);
  ASSERT_TRUE(c.rope_scaling.has_value());
  // Llama 3 scaling: the highest frequencies (wavelength < 8192/4) are kept, the lowest (wavelength >
  // 8192) divided by 8, the middle blended.
  EXPECT_DOUBLE_EQ(rope_frequency(c, 0), 1.0);
  double f_low = std::pow(500000.0, -126.0 / 128.0);
  EXPECT_NEAR(rope_frequency(c, 63), f_low / 8, 1e-12 * f_low);
  double f_mid = std::pow(500000.0, -64.0 / 128.0), wl = 2 * M_PI / f_mid;
  ASSERT_GT(wl, 2048);
  ASSERT_LT(wl, 8192);
  double s = (8192 / wl - 1) / 3;
  EXPECT_NEAR(rope_frequency(c, 32), (1 - s) * f_mid / 8 + s * f_mid, 1e-12);
}

// The engine and the interpreter run the same program: float weights agree to fp32 rounding.
TEST(LlamaEngine, MatchesInterpreterFloatWeights) {
  LlamaConfig c = LlamaConfig::preset("toy");
  RunnerOptions o;
  o.threads = 2;
  o.context = 32;
  auto r = LlamaRunner::random(c, o, 7, quant::QType::F32);
  std::vector<std::vector<int32_t>> calls = {{3, 17, 42, 5, 88}, {9}, {60}};
  std::vector<float> got;
  for (auto& t : calls) got = r->forward(t);
  EXPECT_EQ(r->position(), 7);
  auto want = interpret_calls(c, 32, r->weights(), calls);
  ASSERT_GT(max_abs(want), 0.1);
  EXPECT_LT(max_diff(got, want), 2e-5 * max_abs(want) + 1e-5);
  const cpu::PlanStats& s = r->stats(5);
  EXPECT_EQ(s.attention, c.layers) << s.str();
  EXPECT_EQ(s.generic, 0) << s.str();
  EXPECT_EQ(s.quant_matmul, 7 * c.layers + 1) << s.str();
  EXPECT_EQ(s.permute, 2 * c.layers) << s.str();
}

// Quantized weights: the engine quantizes activations to 8-bit blocks for the integer dot products
// (an error of up to 1/254 of each 32-element block's largest value, per matmul input), so it agrees
// with the interpreter (float activations, the same dequantized weights) to ~2% RMS after 15 matmuls of a
// random, untrained model (measured 1.6% for Q8_0, 2.1% for Q4_1); the trained model's check against the
// NumPy reference is test_llama_reference.
TEST(LlamaEngine, MatchesInterpreterQuantizedWeights) {
  LlamaConfig c = LlamaConfig::preset("toy");
  RunnerOptions o;
  o.threads = 1;
  o.context = 16;
  for (auto type : {quant::QType::Q4_1, quant::QType::Q8_0}) {
    auto r = LlamaRunner::random(c, o, 11, type);
    std::vector<std::vector<int32_t>> calls = {{1, 2, 3, 4}, {50}};
    std::vector<float> got;
    for (auto& t : calls) got = r->forward(t);
    auto want = interpret_calls(c, 16, r->weights(), calls);
    ASSERT_GT(max_abs(want), 0.1);
    double se = 0, sw = 0;
    for (size_t i = 0; i < got.size(); ++i) se += std::pow(got[i] - want[i], 2), sw += std::pow(want[i], 2);
    EXPECT_LT(std::sqrt(se / sw), 0.04) << quant::to_string(type);
    EXPECT_LT(max_diff(got, want), 0.08 * max_abs(want)) << quant::to_string(type);
  }
}

TEST(LlamaEngine, PrefillEqualsTokenByToken) {
  LlamaConfig c = LlamaConfig::preset("toy");
  RunnerOptions o;
  o.threads = 2;
  o.context = 16;
  auto a = LlamaRunner::random(c, o, 3, quant::QType::F32);
  auto b = LlamaRunner::random(c, o, 3, quant::QType::F32);
  std::vector<int32_t> toks = {5, 6, 7, 8, 9, 10};
  auto la = a->forward(toks);
  std::vector<float> lb;
  for (auto t : toks) lb = b->forward({t});
  EXPECT_LT(max_diff(la, lb), 1e-4 * max_abs(la) + 1e-5);
}

TEST(LlamaErrors, BadConfigsAndCalls) {
  LlamaConfig c = LlamaConfig::preset("toy");
  EXPECT_USER_ERROR(LlamaConfig::preset("gpt5"), "unknown model shapes 'gpt5'");
  LlamaConfig bad = c;
  bad.kv_heads = 3;
  EXPECT_USER_ERROR(bad.check(), "not a multiple of 3 kv heads");
  LlamaProgramOptions po;
  po.tokens = 65;
  EXPECT_USER_ERROR(build_llama_program(c, po), "65 tokens do not fit a context of 64");
  RunnerOptions o;
  o.context = 8;
  auto r = LlamaRunner::random(c, o, 1, quant::QType::Q8_0);
  EXPECT_USER_ERROR(r->forward({1, 2, 3, 4, 5, 6, 7, 8, 9}), "need 9 positions but the context holds 8");
  EXPECT_USER_ERROR(r->forward({96}), "token id 96 is outside the vocabulary [0, 96)");
  o.threads = 0;
  EXPECT_USER_ERROR(LlamaRunner::random(c, o, 1), "--threads 0 must be in [1, 1024]");
}

TEST(LlamaErrors, WeightShapeMismatch) {
  LlamaConfig c = LlamaConfig::preset("toy");
  auto r = LlamaRunner::random(c, RunnerOptions{1, 8}, 1, quant::QType::Q8_0);
  cpu::WeightBindings w = r->weights();
  w["blk.0.attn_q.weight"].rows = 32;
  cpu::LlmEngine e(w, 1);
  LlamaProgramOptions po;
  po.context = 8;
  EXPECT_USER_ERROR(e.plan(build_llama_program(c, po)), "weight 'blk.0.attn_q.weight' is bound to 32 x 64");
}

}  // namespace
}  // namespace mp::models
