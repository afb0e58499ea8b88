// The CPU engine for model programs with quantized weights: it walks an IR program once, binds each
// top-level node to a kernel (MatMul on a bound weight -> cpu::matmul / matvec on the quantized rows;
// elementwise and reduce patterns -> vector loops; the cached-attention loop nest -> a dedicated loop
// over the valid cache positions; anything else -> the generic node evaluation of runtime.h), and then
// runs that plan as often as asked. The program stays the single definition of the model.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/quant_matmul.h"
#include "backends/cpu/runtime.h"
#include "core/thread_pool.h"
#include "ir/ir.h"

namespace mp::cpu {

// Weights by tensor name: rows x cols in a GGML format (F32 for plain float data). A program tensor of
// shape [rows, cols] whose name is bound reads the weight in place; the engine never copies it, and the
// caller keeps the memory alive as long as the engine.
using WeightBindings = std::map<std::string, QMatrix>;

// How the plan of one program binds its nodes (for reports and tests).
struct PlanStats {
  int quant_matmul = 0;   // MatMul on a bound weight
  int permute = 0;        // MatMul by a constant signed permutation (the RoPE pair rotation)
  int float_matmul = 0;   // MatMul of two computed values
  int elementwise = 0;    // Map / Zip / Fill on vector loops
  int reduce = 0;         // row reductions
  int data_movement = 0;  // LoadTile / StoreTile / Gather / Scatter / Buffer
  int attention = 0;      // cached-attention nests on the dedicated loop
  int generic = 0;        // nodes evaluated by the generic CPU evaluation (correct, slow)
  std::string str() const;
};

class LlmEngine {
 public:
  // threads: the pool the kernels split their work over (>= 1).
  LlmEngine(WeightBindings weights, int threads);
  ~LlmEngine();
  LlmEngine(const LlmEngine&) = delete;
  LlmEngine& operator=(const LlmEngine&) = delete;

  class Plan;
  // Binds every node of p. Tensors that are not weights get float storage: InOut tensors (model state
  // such as the KV cache) belong to the engine and are shared by name between its plans, so the cache a
  // prefill plan writes is the one a decode plan reads (a name seen again must keep its shape); Input,
  // Output and Temp tensors belong to the plan. A weight's program shape must be [rows, cols] of its
  // binding.
  std::shared_ptr<Plan> plan(const ir::Program& p);
  void run(Plan& plan);
  const PlanStats& stats(const Plan& plan) const;

  // Float storage of a state (InOut) tensor, and of a plan's own tensor (inputs to fill, outputs to
  // read); user_error when there is no such tensor.
  std::vector<float>& tensor(const std::string& name);
  std::vector<float>& tensor(Plan& plan, const std::string& name);
  // Bytes of the engine's state tensors (the KV cache), and of one plan's tensors and value buffers.
  int64_t storage_bytes() const;
  int64_t storage_bytes(const Plan& plan) const;
  int threads() const;

  struct Impl;  // defined in llm_engine.cpp

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mp::cpu
