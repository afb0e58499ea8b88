// The stage graph the simulator runs: stages (loads, stores, compute) connected through on-chip buffers,
// with the work of one iteration, the PCU/PMU/AGCU needs, buffer depth (N-buffering) and bytes, and off-chip
// tensors. Built by the lowering of a metapipelined IR program or by hand (tests, built-in benchmarks).
//
// Token semantics: every stage runs `iterations` times. Iteration i of a consumer reads token i / reuse of
// each input buffer; a producer completes one token every `accumulate` iterations (a reduction fills one
// token over several iterations). A buffer of depth D holds at most D tokens that are written or not yet
// released by all consumers; a stage fires when its input tokens are complete and its output slot is free.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mp::rdu {

enum class StageKind { Load, Store, Compute };
const char* to_string(StageKind k);

// How a load or store walks an off-chip tensor: iteration i touches `rows` rows of `row_bytes` bytes,
// `row_stride` apart, starting at byte (i % wrap) * iter_stride (plus a fixed offset). Contiguous tiles
// have rows = 1.
struct Access {
  int64_t rows = 1;
  int64_t row_bytes = 0;
  int64_t row_stride = 0;
  int64_t iter_stride = 0;
  int64_t wrap = 1 << 30;
  int64_t offset = 0;
  std::function<int64_t(int64_t)> base;  // optional: start byte of iteration i (overrides iter_stride/wrap)
  std::function<int64_t(int64_t, int64_t)> row_at;  // optional: byte of row r of iteration i (gathers)
  int64_t bytes() const { return rows * row_bytes; }
};

struct Input {
  int buffer = -1;
  int64_t reuse = 1;  // consecutive iterations that read the same token
};

// Functional mode: a stage's kernel sees its input and output slots (floats) and, for loads and stores, the
// host copy of its tensor. It runs when the simulator fires the iteration, so wrong token ordering in the
// simulator produces wrong values.
// Slots also hold an opaque object per token (the IR lowering keeps run-time tiles there).
struct StageIO {
  int64_t iter = 0;
  std::vector<const float*> in;
  std::vector<float*> out;
  std::vector<const std::shared_ptr<void>*> in_obj;
  std::vector<std::shared_ptr<void>*> out_obj;
  float* tensor = nullptr;  // loads and stores
  int64_t tensor_elems = 0;
  std::vector<std::shared_ptr<void>>* tensor_objs = nullptr;  // per token, for spills of object slots
};
using Kernel = std::function<void(StageIO&)>;

struct Stage {
  std::string name;
  StageKind kind = StageKind::Compute;
  int64_t iterations = 1;
  std::vector<Input> inputs;
  std::vector<int> outputs;  // buffers
  int64_t accumulate = 1;    // iterations per output token
  // Compute work of one iteration: `elements` vector elements with `ops` ALU ops each (a chain of
  // ceil(ops / pcu.stages) PCUs), and/or a matmul m x k x n (SIMD: lanes x stages MACs per PCU and cycle;
  // systolic: the systolic model). `par` copies split the work. A stage with neither (ops = 0) is control
  // only (forwarding a loop-carried result): no PCU, one cycle per iteration.
  int64_t elements = 0;
  int ops = 1;
  int64_t m = 0, k = 0, n = 0;
  int par = 1;
  bool systolic_ok = true;  // a matmul may use the PCUs' systolic mode when the arch has it
  // Dependency depth of the top-level statement the stage comes from (0: reads nothing an earlier
  // statement wrote; else 1 + the deepest statement it waits for). Memory streams of different depths
  // are ordered by those waits, so the mapping lets them share the AGCUs (see plan_streams).
  int phase = 0;
  int statement = -1;  // index of that top-level statement in the program's body (-1: built by hand)
  // Cycles between an iteration's end and its output token's completion spent outside the fabric, on a
  // transfer that uses no mesh link, PMU or program memory (a socket-to-socket all-reduce): the token's
  // readers wait for it, everything else goes on.
  int64_t delay_cycles = 0;
  // Loads and stores.
  int tensor = -1;
  Access access;
  Kernel kernel;         // functional mode only
  double flops() const;  // per iteration
  bool is_matmul() const { return m > 0; }
  bool is_control() const { return kind == StageKind::Compute && !is_matmul() && ops == 0; }
};

struct Buffer {
  std::string name;
  int64_t bytes = 0;           // one token
  int depth = 2;               // N of the N-buffer
  int64_t initial_tokens = 0;  // tokens present before the start (loop-carried values)
  bool control = false;        // carries only ordering (a kernel-call boundary already provides it)
  int access_lanes = 0;        // widest parallel access (par x lanes of a reader or writer); set by mapping
  // Set by mapping: a loop-carried accumulator held in the pipeline register of the PCU that combines it
  // (no PMU, no mesh route); its token is ready when the combining stage can take its next iteration.
  bool in_register = false;
  int64_t elems() const { return bytes / 4; }
};

// An off-chip tensor (fp32 elements).
struct Tensor {
  std::string name;
  int64_t bytes = 0;
  int64_t base = 0;                         // assigned by Graph::layout() unless set
  std::vector<float> host;                  // functional mode: contents
  std::vector<std::shared_ptr<void>> objs;  // functional mode: spilled object tokens
};

struct Graph {
  std::string name;
  std::vector<Stage> stages;
  std::vector<Buffer> buffers;
  std::vector<Tensor> tensors;
  // Functional mode: initial contents of buffers with initial tokens (one token each, in slot order).
  std::vector<std::vector<float>> initial_data;

  int add_tensor(std::string name, int64_t bytes);
  int add_buffer(std::string name, int64_t bytes, int depth = 2);
  int add_stage(Stage s);
  // Tokens each buffer receives over the run and each consumer needs; throws user_error naming the buffer
  // when producers and consumers disagree, or a stage reads a buffer nobody writes.
  void validate() const;
  void layout();  // give tensors disjoint, row-aligned off-chip addresses
  int producer_of(int buffer) const;
  std::vector<int> consumers_of(int buffer) const;
  double total_flops() const;
  int64_t offchip_bytes(bool write) const;
};

}  // namespace mp::rdu
