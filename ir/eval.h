// Evaluation of the IR on the host: host tensors (off-chip memory), run-time tiles, the environment of
// values and loop indices, and the evaluation of one pattern node. Every backend that computes real values
// uses it: the CPU interpreter and metapipelined executor schedule these evaluations on threads, the
// simulated dataflow accelerator (backends/rdu) in the order its stages fire.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/ir.h"

namespace mp::ir {

// Visit every multi-index of shape in row-major order: f(flat, idx).
template <class F>
void for_each_index(const ir::Shape& shape, F&& f) {
  int64_t n = ir::num_elements(shape);
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t flat = 0; flat < n; ++flat) {
    f(flat, idx);
    for (int a = int(shape.size()) - 1; a >= 0; --a) {
      if (++idx[a] < shape[a]) break;
      idx[a] = 0;
    }
  }
}

// An off-chip tensor's contents. Values are kept as float; bf16 / f16 tensors hold values rounded to
// their precision (rounding happens on every store), i32 tensors hold integers.
struct HostTensor {
  ir::Shape shape;
  ir::DType dtype = ir::DType::f32;
  std::vector<float> data;
};
// Off-chip memory of one run, by tensor name.
using Memory = std::map<std::string, HostTensor>;

// Allocates every tensor of p (inputs filled from `inputs` when given, outputs and temps poisoned with NaN).
Memory make_memory(const ir::Program& p, const std::map<std::string, std::vector<float>>& inputs);
// Fresh random inputs for every Input / InOut tensor (uniform [-1, 1), rounded to the tensor's dtype).
std::map<std::string, std::vector<float>> random_inputs(const ir::Program& p, uint64_t seed);
float round_to(ir::DType dt, float x);

// A run-time tile: its actual shape (a masked last tile may be smaller than the IR shape), the global
// index of its element 0 per axis, and row-major data.
struct Tile {
  ir::Shape shape;
  std::vector<int64_t> origin;
  std::vector<float> data;
};
using TileRef = std::shared_ptr<const Tile>;

// Values and loop indices visible at a point of the program; lookups walk to the parents.
class Env {
 public:
  explicit Env(const Env* parent = nullptr) : parent_(parent) {}
  void set(const ir::Value& v, TileRef t) { vals_[v->id] = std::move(t); }
  TileRef get(const ir::Value& v) const;
  void set_loop(const ir::LoopVar& var, int64_t i) { loops_[var->id] = i; }
  int64_t loop(const ir::LoopVar& var) const;
  int64_t eval(const ir::Affine& a) const;

 private:
  const Env* parent_;
  std::unordered_map<int, TileRef> vals_;
  std::unordered_map<int, int64_t> loops_;
};

// Evaluates one node other than MetaPipe: reads operands from env and memory, returns the result tile
// (null for StoreTile / Scatter, which write memory).
TileRef eval_node(const ir::Node& n, const Env& env, Memory& mem);

}  // namespace mp::ir
