// A Llama model ready to run on the CPU: its weights (a GGUF file's tensors, bound in place, or random
// quantized blocks for a preset's shapes), the engine, and the generator's programs planned once per
// token count (a prefill of T tokens, decode of 1). The KV cache holds `context` positions.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/llm_engine.h"
#include "models/llama.h"

namespace mp::models {

class GgufFile;

struct RunnerOptions {
  int threads = 1;
  int64_t context = 0;  // cache positions; 0 = the model's context
  int64_t batch = 32;   // a longer prompt runs as programs of at most this many tokens (bounds activations)
};

class LlamaRunner {
 public:
  // Binds the file's tensors by name (the file must stay open while the runner lives).
  static std::unique_ptr<LlamaRunner> from_gguf(const GgufFile& f, const RunnerOptions& o);
  // Random weights in `type` (Q4_1 or Q8_0 blocks; F32 norms near 1) for a preset's shapes, scaled so
  // activations stay of unit size. share_layers: every layer reads the first layer's matrices (the
  // memory traffic per token is the same; an 8B model's shapes then fit in ~1 GB).
  static std::unique_ptr<LlamaRunner> random(const LlamaConfig& c, const RunnerOptions& o, uint64_t seed,
                                             quant::QType type = quant::QType::Q4_1,
                                             bool share_layers = false);

  const LlamaConfig& config() const { return cfg_; }
  int64_t context() const { return ctx_; }
  int64_t position() const { return pos_; }  // tokens already in the cache
  void reset() { pos_ = 0; }

  // Runs `tokens` at positions position().. (in calls of at most `batch` tokens) and returns the last
  // token's logits (vocab floats).
  // user_error when they do not fit the context (naming both lengths) or a token id is out of range.
  const std::vector<float>& forward(const std::vector<int32_t>& tokens);
  // Plans the programs a forward of `tokens` tokens runs, ahead of time (forward does it on first use).
  void prepare(int64_t tokens);

  const cpu::PlanStats& stats(int64_t tokens);
  cpu::LlmEngine::Plan& plan(int64_t tokens);  // prepare(tokens) and its plan
  cpu::LlmEngine& engine() { return *engine_; }
  const cpu::WeightBindings& weights() const { return weights_; }
  int64_t weight_bytes() const;  // bytes of the bound weights
  int64_t kv_cache_bytes() const;

 private:
  LlamaRunner(LlamaConfig c, cpu::WeightBindings w, const RunnerOptions& o);
  LlamaConfig cfg_;
  cpu::WeightBindings weights_;
  std::vector<std::vector<uint8_t>> owned_;  // random weights' blocks
  std::unique_ptr<cpu::LlmEngine> engine_;
  std::map<int64_t, std::shared_ptr<cpu::LlmEngine::Plan>> plans_;
  std::vector<float> logits_;
  int64_t ctx_ = 0, pos_ = 0, batch_ = 32;
};

// Fills n elements of type `type` with random blocks whose values are uniform-ish in [-a, a].
std::vector<uint8_t> random_blocks(quant::QType type, int64_t rows, int64_t cols, double a, uint64_t seed);

}  // namespace mp::models
