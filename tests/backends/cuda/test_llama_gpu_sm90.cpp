// The GPU Llama engine on Hopper against the CPU, in each launch mode, every buffer poisoned first:
// - a 2-layer model with random Q4_1 weights: the three modes agree with each other (per-layer and
//   megakernel bit for bit), and with the CPU engine running the same program on the same weights
//   dequantized to float;
// - SmolLM2-135M's shapes with random Q4_1 and Q8_0 weights (no file needed): first-step logits and 32
//   greedy tokens against the CPU engine on the same weights dequantized to float;
// - SmolLM2-135M from the installed GGUF (skipped when missing): the first decode step's logits and 32
//   greedy tokens against the CPU path on the prompts of tests/models;
// - bad input: a context beyond the KV cache, a model that does not fit;
// - tensor parallelism: the shards on this GPU against the whole model, and NCCL with one rank.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "backends/cpu/llm_engine.h"
#include "backends/cuda/llama_gpu.h"
#include "core/device.h"
#include "core/quant.h"
#include "models/gguf.h"
#include "models/llama.h"
#include "models/llama_runner.h"
#include "models/model_cache.h"
#include "models/tokenizer.h"
#include "tests/support/expect_user_error.h"
#include "tests/support/watchdog.h"

namespace mp::cuda {
namespace {

bool have_hopper() {
  auto g = query_gpu();
  return g && gpu_is_hopper(*g);
}

LlamaGpuShapes shapes(const models::LlamaConfig& c) { return shapes_of(c, models::rope_frequency); }

// A preset's model with random weights of type t (LlamaRunner::random), for a KV cache of ctx.
std::unique_ptr<models::LlamaRunner> random_runner(const models::LlamaConfig& c, int64_t ctx, uint64_t seed,
                                                   quant::QType t) {
  models::RunnerOptions ro;
  ro.context = ctx;
  return models::LlamaRunner::random(c, ro, seed, t);
}

struct Decode {
  std::vector<float> first_logits;  // after the prompt
  std::vector<int32_t> tokens;      // greedy: the prompt's prediction, then n - 1 more
};

Decode run_gpu(LlamaGpu& g, const std::vector<int32_t>& prompt, int n) {
  g.poison();
  g.feed(prompt);
  Decode r;
  r.first_logits = g.logits();
  r.tokens.push_back(g.last_prediction());
  auto more = g.generate(n - 1);
  r.tokens.insert(r.tokens.end(), more.begin(), more.end());
  return r;
}

int32_t argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

// The CPU engine on float weights: the generator's decode program run position by position.
// Also keeps the logits of each greedy step (`steps`: the prompt's, then those after each token).
Decode run_cpu_float(const models::LlamaConfig& c, const cpu::WeightBindings& fw, int64_t ctx,
                     const std::vector<int32_t>& prompt, int n, int threads = 2,
                     std::vector<std::vector<float>>* steps = nullptr) {
  cpu::LlmEngine e(fw, threads);
  models::LlamaProgramOptions po;
  po.tokens = 1, po.context = ctx;
  auto plan = e.plan(models::build_llama_program(c, po));
  Decode r;
  int64_t pos = 0;
  auto step = [&](int32_t t) {
    e.tensor(*plan, "tokens")[0] = float(t);
    e.tensor(*plan, "pos")[0] = float(pos++);
    e.run(*plan);
    return e.tensor(*plan, "logits");
  };
  std::vector<float> l;
  for (int32_t t : prompt) l = step(t);
  r.first_logits = l;
  for (int i = 0; i < n; ++i) {
    r.tokens.push_back(argmax(l));
    if (steps) steps->push_back(l);
    if (i + 1 < n) l = step(r.tokens.back());
  }
  return r;
}

// The gap between the largest and the second largest value.
float top2_margin(std::vector<float> v) {
  std::nth_element(v.begin(), v.begin() + 1, v.end(), std::greater<float>());
  return v[0] - v[1];
}

// A runner's quantized weights dequantized to float (the storage in `keep`), for the float CPU reference.
cpu::WeightBindings dequantized(const models::LlamaRunner& runner, std::vector<std::vector<float>>& keep) {
  cpu::WeightBindings fw;
  for (auto& [name, q] : runner.weights()) {
    keep.emplace_back(size_t(q.rows * q.cols));
    const uint64_t rb = *quant::row_bytes(q.type, q.cols);
    for (int64_t r = 0; r < q.rows; ++r)
      quant::dequantize_row(q.type, static_cast<const uint8_t*>(q.data) + r * rb,
                            &keep.back()[size_t(r * q.cols)], q.cols);
    fw[name] = cpu::QMatrix{quant::QType::F32, keep.back().data(), q.rows, q.cols};
  }
  return fw;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(double(x)));
  return m;
}
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return std::isfinite(m) ? m : INFINITY;
}
bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

// Tiny model: 2 layers, d 64, 4/2 heads of 16, FFN 128, vocab 96; Q4_1 matrices, a Q8_0 embedding.
// Tolerance against the CPU on the dequantized weights: the only difference in what is computed is the
// GPU's bf16 KV cache (relative rounding of at most 2^-9 per stored key and value) and the order of fp32
// sums, which should keep the logits within a few 1e-3 of the largest; we allow 2% (the test prints the
// value it sees).
TEST(SM90_LlamaGpu, TinyModelModesAgreeWithEachOtherAndTheCpu) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU";
  test::Watchdog wd(600, "GPU Llama test");  // room for compute-sanitizer, which slows every launch
  auto c = models::LlamaConfig::preset("toy");
  const int64_t ctx = 64;
  auto runner = random_runner(c, ctx, 7, quant::QType::Q4_1);
  // The same weights dequantized to float for the CPU reference.
  std::vector<std::vector<float>> keep;
  const cpu::WeightBindings fw = dequantized(*runner, keep);
  const std::vector<int32_t> prompt = {3, 17, 42, 5, 88, 23, 61};
  const int n = 40;  // the prompt and n tokens span 47 of the 64 positions
  Decode cpu = run_cpu_float(c, fw, ctx, prompt, n);
  ASSERT_TRUE(all_finite(cpu.first_logits));

  std::vector<Decode> runs;
  for (Launch m : {Launch::per_op, Launch::per_layer, Launch::megakernel}) {
    SCOPED_TRACE(to_string(m));
    LlamaGpuOptions o;
    o.launch = m, o.context = ctx;
    auto g = LlamaGpu::create(shapes(c), runner->weights(), o);
    runs.push_back(run_gpu(*g, prompt, n));
    const Decode& r = runs.back();
    ASSERT_TRUE(all_finite(r.first_logits));
    const double md = max_diff(r.first_logits, cpu.first_logits), mx = max_abs(cpu.first_logits);
    std::printf("%s: first logits max |diff| %.4g of max |logit| %.3g; launches/token %.1f\n", to_string(m),
                md, mx, double(g->stats().launches) / double(g->stats().positions));
    EXPECT_LE(md, 0.02 * mx);
    EXPECT_EQ(g->stats().launches, g->stats().positions * g->schedule().launches_per_token());
    // Greedy tokens: equal until a step where the CPU's own top-2 margin is below the tolerance.
    EXPECT_EQ(r.tokens[0], cpu.tokens[0]);
    EXPECT_EQ(g->position(), int64_t(prompt.size()) + n - 1);
  }
  // per-layer and megakernel run the same fused operations: bit for bit the same. per-op runs them
  // unfused, through the same device functions: the same up to the compiler's contractions.
  EXPECT_EQ(runs[2].first_logits, runs[1].first_logits);
  EXPECT_LE(max_diff(runs[0].first_logits, runs[1].first_logits), 1e-4 * max_abs(runs[0].first_logits));
  for (size_t k = 1; k < runs.size(); ++k) EXPECT_EQ(runs[k].tokens, runs[0].tokens) << "mode " << k;
  // The megakernel with every tuning switch at its alternative (other task sizes, the 2-block kernel,
  // fetch-ahead, whole-task prefetch): each row is still one warp's sum in the same order, so the values
  // agree up to the compiler's contractions, and the tokens are the same.
  {
    SCOPED_TRACE("megakernel, tuning alternatives");
    LlamaGpuOptions o;
    o.launch = Launch::megakernel, o.context = ctx;
    apply_tuning("min-blocks=3,loads=8,prefetch-kib=all,split=two-per-worker,fetch-ahead=1,combine=fused", o);
    auto g = LlamaGpu::create(shapes(c), runner->weights(), o);
    Decode r = run_gpu(*g, prompt, n);
    EXPECT_LE(max_diff(r.first_logits, runs[2].first_logits), 1e-4 * max_abs(runs[2].first_logits));
    EXPECT_EQ(r.tokens, runs[2].tokens);
  }
  // The O projection prefetched into L2 during the attention (an l2_prefetch operation per layer, a
  // hint), the weights loaded with the default L2 policy instead of evict-first (another hint), and
  // per-layer's launches one after the other instead of overlapped (pdl=0): the fused modes' values bit
  // for bit as without them.
  for (Launch m : {Launch::per_layer, Launch::megakernel})
    for (const char* tune : {"l2-ahead-kib=64", "l2-hint=normal", "l2-ahead-kib=64,l2-hint=normal", "pdl=0"}) {
      SCOPED_TRACE(std::string(to_string(m)) + ", " + tune);
      LlamaGpuOptions o;
      o.launch = m, o.context = ctx;
      apply_tuning(tune, o);
      auto g = LlamaGpu::create(shapes(c), runner->weights(), o);
      Decode r = run_gpu(*g, prompt, n);
      EXPECT_EQ(r.first_logits, runs[2].first_logits);
      EXPECT_EQ(r.tokens, runs[2].tokens);
    }
  // The GPU's tokens fed back to the CPU reference, position by position: the predictions agree wherever
  // the CPU's top-2 margin is clear of the tolerance.
  int agree = 0;
  while (agree < n && runs[0].tokens[size_t(agree)] == cpu.tokens[size_t(agree)]) ++agree;
  std::printf("greedy: %d of %d tokens equal the CPU's\n", agree, n);
  EXPECT_GE(agree, 16);
}

// SmolLM2-135M's shapes (30 layers, d 576, 9 / 3 heads of 64, FFN 1536, vocab 49,152) with random
// weights, so that the check needs no model file: Q4_1 matrices (or Q8_0) and a Q8_0 embedding from
// LlamaRunner::random, the same blocks bound to the GPU engine (kept quantized, as a file's would be)
// and, dequantized to float, to the CPU engine running the generator's decode program. What differs is
// the GPU's bf16 KV cache (a relative rounding of at most 2^-9 per stored key and value) and the order of
// fp32 sums; through 30 layers that should stay well under 1% of the largest logit, and we allow
// max |diff| <= 0.02 * max |logit| at every step.
// Random weights give flat logits (top-2 gaps of a few units on logits of ~60), so near-ties are common.
// Two checks of the 32 greedy tokens, in all three modes, every buffer poisoned first:
// - fed the CPU's tokens one by one, the GPU's logits stay within the tolerance at every step and its
//   prediction equals the CPU's at every step where the CPU's top-2 margin exceeds the tolerance;
// - generating on its own (predictions fed back on the GPU), its tokens equal the CPU's up to the first
//   step with a CPU margin below the tolerance (all 32 if there is none).
TEST(SM90_LlamaGpu, SmolLM2ShapesRandomWeightsTokensEqualTheCpu) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU";
  test::Watchdog wd(600, "GPU Llama test");
  auto c = models::LlamaConfig::preset("smollm2-135m");
  const int64_t ctx = 128;
  const int n = 32;
  const std::vector<int32_t> prompt = {1, 4093, 17, 30511, 256, 9, 48000, 1200, 77, 5};
  for (quant::QType type : {quant::QType::Q4_1, quant::QType::Q8_0}) {
    SCOPED_TRACE(quant::to_string(type));
    auto runner = random_runner(c, ctx, type == quant::QType::Q4_1 ? 29 : 31, type);
    std::vector<std::vector<float>> keep, cpu_steps;
    const cpu::WeightBindings fw = dequantized(*runner, keep);
    Decode cpu = run_cpu_float(c, fw, ctx, prompt, n, 8, &cpu_steps);
    ASSERT_TRUE(all_finite(cpu.first_logits));
    const double tol = 0.02 * max_abs(cpu.first_logits);
    int clear = 0;  // steps before the first CPU near-tie
    while (clear < n && top2_margin(cpu_steps[size_t(clear)]) >= tol) ++clear;
    for (Launch m : {Launch::per_op, Launch::per_layer, Launch::megakernel}) {
      SCOPED_TRACE(to_string(m));
      LlamaGpuOptions o;
      o.launch = m, o.context = ctx;
      auto g = LlamaGpu::create(shapes(c), runner->weights(), o);
      // Fed the CPU's tokens.
      g->poison();
      g->feed(prompt);
      double worst = 0;
      int checked = 0;
      for (int i = 0; i < n; ++i) {
        SCOPED_TRACE("step " + std::to_string(i));
        const std::vector<float> l = g->logits();
        ASSERT_TRUE(all_finite(l));
        worst = std::max(worst, max_diff(l, cpu_steps[size_t(i)]));
        EXPECT_LE(max_diff(l, cpu_steps[size_t(i)]), tol);
        const int32_t pred = g->last_prediction();
        EXPECT_EQ(pred, argmax(l)) << "the GPU's argmax task and its logits disagree";
        if (top2_margin(cpu_steps[size_t(i)]) >= tol) {
          EXPECT_EQ(pred, cpu.tokens[size_t(i)]);
          ++checked;
        }
        if (i + 1 < n) g->feed({cpu.tokens[size_t(i)]});
      }
      // Generating on its own.
      g->reset();
      Decode r = run_gpu(*g, prompt, n);
      int agree = 0;
      while (agree < n && r.tokens[size_t(agree)] == cpu.tokens[size_t(agree)]) ++agree;
      std::printf(
          "%s %s: max |diff| of logits over %d steps %.4g (tolerance %.4g); predictions equal at %d clear "
          "steps; generating, %d of %d tokens equal the CPU's (first CPU near-tie at step %d)\n",
          quant::to_string(type), to_string(m), n, worst, tol, checked, agree, n, clear);
      EXPECT_GE(agree, clear);
      EXPECT_EQ(g->stats().launches, g->stats().positions * g->schedule().launches_per_token());
    }
  }
}

// The engine in bf16 weights gives the same tokens as in native Q4_1 on the tiny model's first steps,
// and a position beyond the KV cache is a user error naming both lengths.
TEST(SM90_LlamaGpu, Bf16WeightsAndContextLimit) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU";
  test::Watchdog wd(120, "GPU Llama test");
  auto c = models::LlamaConfig::preset("toy");
  auto runner = random_runner(c, 16, 11, quant::QType::Q8_0);
  LlamaGpuOptions o;
  o.context = 16;
  auto native = LlamaGpu::create(shapes(c), runner->weights(), o);
  o.weights = GpuWeights::bf16;
  auto bf = LlamaGpu::create(shapes(c), runner->weights(), o);
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  Decode a = run_gpu(*native, prompt, 4), b = run_gpu(*bf, prompt, 4);
  EXPECT_LE(max_diff(a.first_logits, b.first_logits), 0.02 * max_abs(a.first_logits));
  EXPECT_EQ(a.tokens[0], b.tokens[0]);
  EXPECT_EQ(native->position(), 7);
  EXPECT_USER_ERROR(native->generate(10), "the tokens need 17 positions but the KV cache holds 16");
  EXPECT_USER_ERROR(native->feed({95, 96}), "token id 96 is outside the vocabulary [0, 96)");
  native->reset();
  EXPECT_USER_ERROR(native->generate(1), "feed a prompt first");
}

// Decodes n tokens after `prompt` with the weights converted to bf16, in mode m with the --gpu-tune list
// `tune`.
Decode decode_bf16(const models::LlamaConfig& c, models::LlamaRunner& runner, Launch m, int64_t ctx,
                   const std::string& tune, const std::vector<int32_t>& prompt, int n) {
  LlamaGpuOptions o;
  o.launch = m, o.context = ctx, o.weights = GpuWeights::bf16;
  apply_tuning(tune, o);
  auto g = LlamaGpu::create(shapes(c), runner.weights(), o);
  return run_gpu(*g, prompt, n);
}

// bf16 GEMV rows streamed through the shared-memory ring (bulk copies) against the register loads, on
// SmolLM2-135M's shapes (rows of 1,152 and 3,072 bytes) with weights converted to bf16, in each launch
// mode: the 4 KiB segments hold a whole row; 1 KiB segments split rows into 2 or 3 with a partial last
// one, over a ring of 3. The lanes sum the same pieces in the same order, so the logits agree up to the
// compiler's contractions (1e-4 of the largest) and the greedy tokens are the same.
TEST(SM90_LlamaGpu, StreamedGemvEqualsRegisterLoads) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU";
  test::Watchdog wd(300, "GPU Llama test");
  auto c = models::LlamaConfig::preset("smollm2-135m");
  const int64_t ctx = 48;
  auto runner = random_runner(c, ctx, 23, quant::QType::Q8_0);
  const std::vector<int32_t> prompt = {1, 17, 400, 9000, 31, 5};
  for (Launch m : {Launch::per_op, Launch::per_layer, Launch::megakernel}) {
    SCOPED_TRACE(to_string(m));
    auto run = [&](const char* tune) { return decode_bf16(c, *runner, m, ctx, tune, prompt, 12); };
    // The streamed GEMV reads whole rows: compared with the register loads of whole rows (slices=1).
    const Decode regs = run("stream=0,slices=1"), whole = run("stream=4,seg-kib=4"),
                 split = run("stream=3,seg-kib=1");
    ASSERT_TRUE(all_finite(whole.first_logits) && all_finite(split.first_logits));
    EXPECT_LE(max_diff(whole.first_logits, regs.first_logits), 1e-4 * max_abs(regs.first_logits));
    EXPECT_LE(max_diff(split.first_logits, regs.first_logits), 1e-4 * max_abs(regs.first_logits));
    EXPECT_EQ(whole.tokens, regs.tokens);
    EXPECT_EQ(split.tokens, regs.tokens);
  }
}

// loads=8 in the 3-block kernel: bf16 column slices of at most 4 pieces per lane run two rows at a time
// (load_row_pair_bf16), longer ones 8 loads of one row; every row's sum is the one loads=4 adds, piece
// for piece, so the logits are bit for bit the same; and with the first pair's loads issued before the
// task's wait (preload=1, the default) as after it (preload=0). SmolLM2-135M's shapes with bf16 weights: rows of
// 576 columns (72 pieces) and the down projection's 1,536 (whole or in 2 slices), in both fused modes and
// per-op, with column slices chosen and with whole rows.
TEST(SM90_LlamaGpu, PairedRowsEqualOneRowAtATime) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU";
  test::Watchdog wd(300, "GPU Llama test");
  auto c = models::LlamaConfig::preset("smollm2-135m");
  const int64_t ctx = 48;
  auto runner = random_runner(c, ctx, 29, quant::QType::Q8_0);
  const std::vector<int32_t> prompt = {3, 170, 4000, 12, 9};
  for (Launch m : {Launch::per_op, Launch::per_layer, Launch::megakernel})
    for (const char* slices : {"slices=auto", "slices=1", "slices=2"}) {
      SCOPED_TRACE(std::string(to_string(m)) + " " + slices);
      auto run = [&](const char* loads) {
        return decode_bf16(c, *runner, m, ctx, std::string("min-blocks=3,") + loads + "," + slices, prompt, 8);
      };
      const Decode one = run("loads=4"), two = run("loads=8"), late = run("loads=8,preload=0");
      ASSERT_TRUE(all_finite(one.first_logits));
      EXPECT_EQ(two.first_logits, one.first_logits);
      EXPECT_EQ(two.tokens, one.tokens);
      EXPECT_EQ(late.first_logits, two.first_logits);
      EXPECT_EQ(late.tokens, two.tokens);
    }
}

// The three places of the split-KV combine compute the same merge (combine_element) of the same
// partials, and RoPE with the KV append in the attention tasks the same rotation (rope_pair) and bf16
// rows as the rope_append operation: the same logits and tokens in both fused modes.
TEST(SM90_LlamaGpu, CombinePlacesAgree) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU";
  test::Watchdog wd(300, "GPU Llama test");
  auto c = models::LlamaConfig::preset("smollm2-135m");
  const int64_t ctx = 200;
  auto runner = random_runner(c, ctx, 37, quant::QType::Q8_0);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 150; ++i) prompt.push_back(int32_t((i * 7919 + 13) % c.vocab));  // several chunks
  for (Launch m : {Launch::per_layer, Launch::megakernel}) {
    SCOPED_TRACE(to_string(m));
    std::vector<Decode> r;
    for (const char* cm : {"combine=separate", "combine=fused", "combine=last", "combine=last,rope=separate",
                           "combine=fused,rope=separate"}) {
      LlamaGpuOptions o;
      o.launch = m, o.context = ctx;
      apply_tuning(cm, o);
      auto g = LlamaGpu::create(shapes(c), runner->weights(), o);
      ASSERT_GT(g->schedule().attn_chunks, 1);
      r.push_back(run_gpu(*g, prompt, 12));
    }
    ASSERT_TRUE(all_finite(r[0].first_logits));
    for (size_t k = 1; k < r.size(); ++k) {
      EXPECT_LE(max_diff(r[k].first_logits, r[0].first_logits), 1e-5 * max_abs(r[0].first_logits)) << k;
      EXPECT_EQ(r[k].tokens, r[0].tokens) << k;
    }
  }
}

// Tracing: every task of the last position gets ordered times on a real SM, the results do not change,
// and the summary and CSV come out of them.
TEST(SM90_LlamaGpu, TraceTimesEveryTask) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU";
  test::Watchdog wd(300, "GPU Llama test");
  auto c = models::LlamaConfig::preset("smollm2-135m");
  const int64_t ctx = 48;
  auto runner = random_runner(c, ctx, 31, quant::QType::Q8_0);
  const std::vector<int32_t> prompt = {1, 17, 400, 9000, 31, 5};
  for (Launch m : {Launch::per_op, Launch::megakernel}) {
    SCOPED_TRACE(to_string(m));
    LlamaGpuOptions o;
    o.launch = m, o.context = ctx;
    auto plain = LlamaGpu::create(shapes(c), runner->weights(), o);
    EXPECT_USER_ERROR(plain->trace(), "made without tracing");
    o.trace = true;
    auto traced = LlamaGpu::create(shapes(c), runner->weights(), o);
    const Decode a = run_gpu(*plain, prompt, 8), b = run_gpu(*traced, prompt, 8);
    EXPECT_EQ(max_diff(a.first_logits, b.first_logits), 0.0);
    EXPECT_EQ(a.tokens, b.tokens);
    const auto t = traced->trace();
    ASSERT_EQ(t.size(), traced->schedule().tasks.size());
    const int sms = traced->stats().sm_count;
    for (size_t i = 0; i < t.size(); ++i) {
      ASSERT_GT(t[i].fetched, 0u) << "task " << i;
      ASSERT_LE(t[i].fetched, t[i].ready) << "task " << i;
      ASSERT_LE(t[i].ready, t[i].finished) << "task " << i;
      ASSERT_LT(t[i].sm, uint32_t(sms)) << "task " << i;
    }
    const std::string sum = trace_summary(traced->schedule(), t, traced->op_weight_bytes());
    EXPECT_NE(sum.find("ffn_down"), std::string::npos) << sum;
    EXPECT_NE(sum.find("attention"), std::string::npos) << sum;
  }
}

TEST(SM90_LlamaGpu, ModelThatDoesNotFitSaysHowMuch) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU";
  auto c = models::LlamaConfig::preset("llama3.1-8b");
  c.layers = 1024;  // 0.5 TB of bf16
  LlamaGpuOptions o;
  o.context = 1024;
  EXPECT_USER_ERROR(LlamaGpu::random(shapes(c), o, 1), "GiB of GPU memory (weights ");
}

// SmolLM2-135M-Instruct (Q4_1) against the CPU path on the prompts of tests/models. Tolerance of the
// first decode step's logits: the CPU engine quantizes each matmul's input activations to 8 bits (up to
// ~0.8 on logits of magnitude 20-35 against float activations, tests/models/test_llama_reference.cpp),
// the GPU keeps them in fp32 with a bf16 KV cache; we allow max |diff| <= 0.05 * max |logit|. Greedy
// tokens must agree for all 32 steps, except from a step where the CPU's own top-2 margin is below that
// tolerance (a near-tie that the CPU's 8-bit activations can flip); every prompt agrees for at least 8.
TEST(SM90_LlamaGpu, SmolLM2TokensAndLogitsEqualTheCpuPath) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU";
  std::string path;
  try {
    path = models::default_model_path();
  } catch (const user_error& e) {
    GTEST_SKIP() << e.what();
  }
  test::Watchdog wd(300, "GPU Llama test");
  auto f = models::GgufFile::open(path);
  auto c = models::LlamaConfig::from_gguf(f);
  auto tok = models::Tokenizer::from_gguf(f);
  const std::vector<std::string> prompts = {
      "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
      tok.chat_prompt("What are the three primary colors?")};
  const int n = 32;
  models::RunnerOptions ro;
  ro.context = 256;
  ro.threads = 8;
  auto cpu_runner = models::LlamaRunner::from_gguf(f, ro);
  struct Case {
    Launch launch;
    GpuWeights weights;
  };
  const std::vector<Case> cases = {{Launch::per_op, GpuWeights::native},
                                   {Launch::per_layer, GpuWeights::native},
                                   {Launch::megakernel, GpuWeights::native},
                                   {Launch::megakernel, GpuWeights::bf16}};
  std::vector<std::unique_ptr<LlamaGpu>> gpus;
  for (auto& k : cases) {
    LlamaGpuOptions o;
    o.launch = k.launch, o.weights = k.weights, o.context = 256;
    gpus.push_back(LlamaGpu::create(shapes(c), cpu_runner->weights(), o));
  }
  for (size_t p = 0; p < prompts.size(); ++p) {
    SCOPED_TRACE("prompt " + std::to_string(p));
    std::vector<int32_t> prompt = tok.encode(prompts[p], true);
    cpu_runner->reset();
    Decode cpu;
    std::vector<float> l = cpu_runner->forward(prompt);
    cpu.first_logits = l;
    std::vector<float> margins;
    for (int i = 0; i < n; ++i) {
      cpu.tokens.push_back(argmax(l));
      std::vector<float> s = l;
      std::nth_element(s.begin(), s.begin() + 1, s.end(), std::greater<float>());
      margins.push_back(s[0] - s[1]);
      if (i + 1 < n) l = cpu_runner->forward({cpu.tokens.back()});
    }
    const double tol = 0.05 * max_abs(cpu.first_logits);
    for (size_t k = 0; k < cases.size(); ++k) {
      SCOPED_TRACE(std::string(to_string(cases[k].launch)) + " " + to_string(cases[k].weights));
      gpus[k]->reset();
      Decode g = run_gpu(*gpus[k], prompt, n);
      ASSERT_TRUE(all_finite(g.first_logits));
      const double md = max_diff(g.first_logits, cpu.first_logits);
      EXPECT_LE(md, tol) << "max |logit| " << max_abs(cpu.first_logits);
      int agree = 0;
      while (agree < n && g.tokens[size_t(agree)] == cpu.tokens[size_t(agree)]) ++agree;
      std::printf(
          "prompt %zu, %s %s: first logits max |diff| %.3f (tolerance %.3f); %d of %d greedy tokens agree\n",
          p, to_string(cases[k].launch), to_string(cases[k].weights), md, tol, agree, n);
      if (agree < n) {
        EXPECT_LT(margins[size_t(agree)], tol)
            << "token " << agree << ": GPU " << g.tokens[size_t(agree)] << ", CPU "
            << cpu.tokens[size_t(agree)] << " with a CPU top-2 margin of " << margins[size_t(agree)];
        EXPECT_GE(agree, 8);
      }
    }
  }
}

// ---- Tensor parallelism ----

// The shards of a tensor-parallel run, all on this GPU in one engine (LlamaGpuOptions::tp_local), against
// the whole model: a 2-layer model with random Q4_1 weights (tp 2, every mode), Llama-3.1-8B's shapes cut
// to 2 layers with random bf16 weights generated on the GPU (each shard a block of the same random
// matrices), and SmolLM2 from the installed GGUF over 3 shards (its 9 / 3 heads). The shards' partial
// sums are added in another order than the whole model's rows, so the logits agree to fp32 rounding
// (max |diff| <= 1e-3 of the largest logit; bf16 activations nowhere) and the greedy tokens are equal.
void compare_shards(LlamaGpu& whole, LlamaGpu& shards, const std::vector<int32_t>& prompt, int n) {
  Decode a = run_gpu(whole, prompt, n), b = run_gpu(shards, prompt, n);
  ASSERT_TRUE(all_finite(b.first_logits));
  const double md = max_diff(a.first_logits, b.first_logits), mx = max_abs(a.first_logits);
  std::printf("  first logits max |diff| %.3g of max |logit| %.3g; %zu tokens %s\n", md, mx, a.tokens.size(),
              a.tokens == b.tokens ? "equal" : "DIFFER");
  EXPECT_LE(md, 1e-3 * mx);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(shards.stats().all_reduces, shards.stats().positions * shards.schedule().all_reduces_per_token());
  EXPECT_GT(shards.stats().all_reduces, 0);
}

TEST(SM90_LlamaGpuTp, ToyModelShardsEqualTheWholeModel) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU";
  test::Watchdog wd(600, "GPU tensor-parallel test");  // room for compute-sanitizer
  auto compare = compare_shards;
  {
    auto c = models::LlamaConfig::preset("toy");
    auto runner = random_runner(c, 64, 7, quant::QType::Q4_1);
    for (Launch m : {Launch::per_op, Launch::per_layer, Launch::megakernel}) {
      SCOPED_TRACE(std::string("toy ") + to_string(m));
      std::printf("toy, %s, 2 shards:\n", to_string(m));
      LlamaGpuOptions o;
      o.launch = m, o.context = 64;
      auto whole = LlamaGpu::create(shapes(c), runner->weights(), o);
      o.tp = 2, o.tp_local = true;
      auto shards = LlamaGpu::create(shapes(c), runner->weights(), o);
      EXPECT_EQ(shards->schedule().tp_size, 2);
      compare(*whole, *shards, {3, 17, 42, 5, 88}, 24);
    }
  }
}

TEST(SM90_LlamaGpuTp, LargerModelShardsEqualTheWholeModel) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU";
  test::Watchdog wd(300, "GPU tensor-parallel test");
  auto compare = compare_shards;
  {
    auto c = models::LlamaConfig::preset("llama3.1-8b");
    c.layers = 2;
    LlamaGpuOptions o;
    o.launch = Launch::megakernel, o.context = 256;
    auto whole = LlamaGpu::random(shapes(c), o, 5);
    o.tp = 2, o.tp_local = true;
    auto shards = LlamaGpu::random(shapes(c), o, 5);
    std::printf("llama3.1-8b shapes, 2 layers, random bf16, 2 shards:\n");
    compare(*whole, *shards, {128000, 791, 6460, 315}, 16);
  }
  std::string path;
  try {
    path = models::default_model_path();
  } catch (const user_error&) {
    return;  // no SmolLM2 file: the two cases above stand
  }
  auto f = models::GgufFile::open(path);
  auto c = models::LlamaConfig::from_gguf(f);
  auto tok = models::Tokenizer::from_gguf(f);
  models::RunnerOptions ro;
  ro.context = 1;
  auto bind = models::LlamaRunner::from_gguf(f, ro);
  LlamaGpuOptions o;
  o.launch = Launch::megakernel, o.context = 256;
  auto whole = LlamaGpu::create(shapes(c), bind->weights(), o);
  o.tp = 3, o.tp_local = true;
  auto shards = LlamaGpu::create(shapes(c), bind->weights(), o);
  std::printf("SmolLM2 GGUF, 3 shards:\n");
  compare(*whole, *shards, tok.encode("def fibonacci(n):\n", true), 32);
}

// NCCL with one rank: the whole code path of a tensor-parallel run (the communicator from a unique-id
// file, an all-reduce on its own stream after each projection, the L2 prefetch meanwhile, the cut
// launch groups) on this one GPU. One rank's sum is its own buffer, so the logits equal the
// single-GPU engine's bit for bit.
TEST(SM90_LlamaGpuTp, NcclOneRankEqualsTheSingleGpuEngine) {
  if (!have_hopper()) GTEST_SKIP() << "no Hopper GPU";
  if (!have_nccl()) GTEST_SKIP() << "this build has no NCCL";
  test::Watchdog wd(300, "GPU tensor-parallel test");
  auto c = models::LlamaConfig::preset("toy");
  auto runner = random_runner(c, 64, 9, quant::QType::Q8_0);
  for (Launch m : {Launch::per_op, Launch::per_layer, Launch::megakernel}) {
    SCOPED_TRACE(to_string(m));
    LlamaGpuOptions o;
    o.launch = m, o.context = 64;
    auto whole = LlamaGpu::create(shapes(c), runner->weights(), o);
    std::string dir = (std::filesystem::temp_directory_path() / "mp-nccl-test-XXXXXX").string();
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    o.tp = 1, o.tp_rank = 0, o.tp_id_file = std::string(dir) + "/id";
    auto tp = LlamaGpu::create(shapes(c), runner->weights(), o);
    Decode a = run_gpu(*whole, {3, 17, 42, 5}, 20), b = run_gpu(*tp, {3, 17, 42, 5}, 20);
    EXPECT_EQ(a.first_logits, b.first_logits);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(tp->stats().all_reduces, tp->stats().positions * 2 * c.layers);
    std::remove(o.tp_id_file.c_str());
    rmdir(dir.c_str());
  }
}

}  // namespace
}  // namespace mp::cuda
