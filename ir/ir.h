// The parallel-pattern IR: off-chip tensors, on-chip SSA values, pattern nodes (MatMul, Map, Zip, Reduce,
// Gather, Scatter, ...) and METAPIPE loops whose bodies are split into stages joined by N-buffers.
// See docs/ir.md for a tour; backends read it through Program, MetaPipe::stages / buffers and analysis.h.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "ir/expr.h"

namespace mp::ir {

// ---------------------------------------------------------------------------------------------------
// Types and shapes

enum class DType { f32, bf16, f16, i32 };
const char* to_string(DType t);
int64_t bytes_of(DType t);
DType parse_dtype(const std::string& s);  // "f32", "bf16", "f16", "i32"; user_error otherwise

using Shape = std::vector<int64_t>;
std::string to_string(const Shape& s);  // "[64, 128]"
int64_t num_elements(const Shape& s);

// An off-chip tensor (DRAM / HBM). Inputs are filled by the caller, outputs read back; InOut is both
// (e.g. a KV cache that a program appends to); Temp is off-chip scratch between top-level statements.
enum class TensorRole { Input, Output, InOut, Temp };
const char* to_string(TensorRole r);
struct TensorInfo {
  int id = 0;
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  TensorRole role = TensorRole::Input;
  int64_t bytes() const { return num_elements(shape) * bytes_of(dtype); }
};
using Tensor = std::shared_ptr<const TensorInfo>;

// The induction variable of one METAPIPE: runs 0, 1, ..., trip-1.
struct LoopVarInfo {
  int id = 0;
  std::string name;  // "i0", "i1", ... unless the front end names it
  int64_t trip = 1;
};
using LoopVar = std::shared_ptr<const LoopVarInfo>;

// constant + sum(coef * var): tile offsets in elements, e.g. 64*i0 + 0.
struct Affine {
  int64_t constant = 0;
  std::vector<std::pair<LoopVar, int64_t>> terms;  // (var, coefficient), at most one term per var

  Affine() = default;
  Affine(int64_t c) : constant(c) {}  // NOLINT: offsets are often constants
  static Affine var(const LoopVar& v, int64_t coef = 1);
  bool is_const() const { return terms.empty(); }
  int64_t max_value() const;  // with every var at trip-1 (coefficients may be negative: then at 0)
  int64_t min_value() const;
  int64_t coef_of(const LoopVar& v) const;
  std::string str() const;  // "64*i0 + 16"
};
Affine operator+(const Affine& a, const Affine& b);
Affine operator*(const Affine& a, int64_t k);
inline Affine operator*(int64_t k, const Affine& a) { return a * k; }

// An on-chip value (a tile or a whole-tensor value before tiling). Immutable, identified by id; passes
// that do not change a value keep the same object. origin[axis] is the global index of element 0 along
// each axis (what Expr::index(axis) adds the local index to): LoadTile sets it to the tile offset.
struct ValueInfo {
  int id = 0;
  std::string name;  // optional, for printing only
  Shape shape;       // the full tile shape; with masking the last tile of a loop may be smaller at run time
  DType dtype = DType::f32;
  std::vector<Affine> origin;
  int64_t bytes() const { return num_elements(shape) * bytes_of(dtype); }
};
using Value = std::shared_ptr<const ValueInfo>;

// ---------------------------------------------------------------------------------------------------
// Nodes. The list below is expanded for the enum, the printer, the verifier, the interpreter and the
// checked downcast, so adding a node makes the compiler point at every place to update.

// clang-format off
#define MP_FOR_EACH_NODE(X) \
  X(Fill) X(LoadTile) X(StoreTile) X(Map) X(Zip) X(Reduce) X(MatMul) X(Gather) X(Scatter) X(Buffer) X(MetaPipe)
// clang-format on

enum class NodeKind {
#define MP_NODE_ENUM(n) n,
  MP_FOR_EACH_NODE(MP_NODE_ENUM)
#undef MP_NODE_ENUM
};
const char* to_string(NodeKind k);

struct Node;
using NodeRef = std::shared_ptr<Node>;
#define MP_NODE_FWD(n) struct n;
MP_FOR_EACH_NODE(MP_NODE_FWD)
#undef MP_NODE_FWD

struct Node {
  explicit Node(NodeKind k) : kind(k) {}
  virtual ~Node() = default;
  const NodeKind kind;
  int id = 0;     // unique within a Program; printed as #id in messages ("MatMul #7")
  Value out;      // the result, or null (StoreTile, Scatter; MetaPipe results are in MetaPipe::carried)
  int par = 1;    // parallel units (PCUs) the op is spread over; set by the parallelize pass
  int lanes = 1;  // SIMD lanes per unit; set by the parallelize pass

  virtual std::vector<Value> operands() const = 0;  // on-chip values read (MetaPipe: carried inits)
  virtual NodeRef clone() const = 0;                // deep copy (values are shared: they are immutable)
  std::string where() const;                        // "MatMul #7" for messages

  template <class T>
  T* as() {
    return kind == T::kKind ? static_cast<T*>(this) : nullptr;
  }
  template <class T>
  const T* as() const {
    return kind == T::kKind ? static_cast<const T*>(this) : nullptr;
  }
  template <class T>
  T& cast();  // internal_error if the kind differs
  template <class T>
  const T& cast() const;
};

#define MP_NODE_BOILERPLATE(Name)                   \
  static constexpr NodeKind kKind = NodeKind::Name; \
  Name() : Node(kKind) {}                           \
  NodeRef clone() const override { return std::make_shared<Name>(*this); }

// A tile filled from an element function of its global indices (no args): constants, masks, tables.
struct Fill : Node {
  MP_NODE_BOILERPLATE(Fill)
  Expr f;
  std::vector<Value> operands() const override { return {}; }
};

// Copy tensor[offset : offset+shape] from off-chip memory into an on-chip tile. masked: the tile may
// extend past the tensor's end (last tile of a non-dividing loop); it is then cut to the valid part.
// row_par: how many rows are fetched in parallel (address generators / AGCU streams), at most the rows.
struct LoadTile : Node {
  MP_NODE_BOILERPLATE(LoadTile)
  Tensor src;
  std::vector<Affine> offset;  // one per tensor axis, in elements
  bool masked = false;
  int row_par = 1;
  std::vector<Value> operands() const override { return {}; }
};

// Copy an on-chip tile to tensor[offset : offset+shape]; masked: elements past the end are dropped.
struct StoreTile : Node {
  MP_NODE_BOILERPLATE(StoreTile)
  Tensor dst;
  Value in;
  std::vector<Affine> offset;
  bool masked = false;
  std::vector<Value> operands() const override { return {in}; }
};

// out[e] = f(in[e]) elementwise.
struct Map : Node {
  MP_NODE_BOILERPLATE(Map)
  Value in;
  Expr f;  // of arg(0), maybe index(axis)
  std::vector<Value> operands() const override { return {in}; }
};

// out[e] = f(ins[0][e], ins[1][e], ...) with broadcasting: an operand axis of extent 1 repeats.
struct Zip : Node {
  MP_NODE_BOILERPLATE(Zip)
  std::vector<Value> ins;
  Expr f;  // of arg(0..n-1)
  std::vector<Value> operands() const override { return ins; }
};

// Reduce one axis with an associative combiner; the axis stays with extent 1 (keepdims), so a Zip can
// broadcast the result back. pre (optional, of arg(0)) is applied to each element before combining
// (the fuse pass folds a Map into it).
enum class Combiner { Add, Max, Min, Mul, Custom };
const char* to_string(Combiner c);
struct Reduce : Node {
  MP_NODE_BOILERPLATE(Reduce)
  Value in;
  int axis = 0;
  Combiner combiner = Combiner::Add;
  std::optional<Expr> custom;  // Custom: f(arg(0) = accumulator, arg(1) = element)
  double identity = 0;         // the combiner's identity (set for every combiner)
  std::optional<Expr> pre;     // absent: the element itself
  std::vector<Value> operands() const override { return {in}; }
};

// out = op(a) x op(b), fp32 accumulation; a: [M, K] (or [K, M] when transpose_a), b: [K, N] (or [N, K]
// when transpose_b); out: [M, N]. With masked tiles the actual K of a partial tile is used.
struct MatMul : Node {
  MP_NODE_BOILERPLATE(MatMul)
  Value a, b;
  bool transpose_a = false, transpose_b = false;
  std::vector<Value> operands() const override { return {a, b}; }
};

// out[r, :] = table[index[r], :] : rows of an off-chip tensor picked by an i32 index tile [n] or [n, 1].
struct Gather : Node {
  MP_NODE_BOILERPLATE(Gather)
  Tensor table;
  Value index;
  std::vector<Value> operands() const override { return {index}; }
};

// table[index[r], :] = rows[r, :] : write rows of an on-chip tile to off-chip rows picked by an index.
struct Scatter : Node {
  MP_NODE_BOILERPLATE(Scatter)
  Tensor table;
  Value index, rows;
  std::vector<Value> operands() const override { return {index, rows}; }
};

// The user's BUFFER(v): v materialized in on-chip memory with `depth` slots; out is the same data.
// It marks a stage boundary for the metapipeline pass (and may change the access pattern).
struct Buffer : Node {
  MP_NODE_BOILERPLATE(Buffer)
  Value in;
  int depth = 2;
  std::vector<Value> operands() const override { return {in}; }
};

// Work of one stage per loop iteration (filled by the metapipeline pass from analysis.h).
struct OffChipAccess {
  Tensor tensor;
  bool store = false;
  int64_t bytes = 0;  // per iteration
  enum class Pattern { Contiguous, Strided, Random } pattern = Pattern::Contiguous;
  int64_t run_bytes = 0;     // contiguous bytes per burst (a row of the tile, or one gathered row)
  int64_t runs = 0;          // bursts per iteration
  int64_t stride_bytes = 0;  // distance between bursts (Strided)
  int row_par = 1;           // parallel streams asked for (LoadTile::row_par)
};
struct Work {
  double flops = 0;      // multiply-adds count 2 (MatMul 2*M*N*K)
  int64_t elem_ops = 0;  // elementwise operations (Map / Zip / Reduce / Fill)
  int64_t load_bytes = 0, store_bytes = 0;
  std::vector<OffChipAccess> accesses;
  Work& operator+=(const Work& o);
  Work scaled(int64_t k) const;  // k repetitions (a nested loop's trip)
};

// A group of consecutive body nodes run by one pipeline stage. A nested MetaPipe is one node of a stage.
struct Stage {
  std::string name;  // "s0", "s1", ... (or "body" before metapipelining)
  std::vector<NodeRef> ops;
  Work work;  // per iteration of the enclosing loop, including nested loops' full runs
};

// On-chip storage of a metapipeline: Stream buffers carry a value from its producer stage to the
// consumer stages (depth slots: 2 = double buffering); State buffers hold a loop-carried value inside
// the stage that updates it (depth 1).
struct BufferInfo {
  enum class Kind { Stream, State } kind = Kind::Stream;
  std::string name;  // "b0", ...
  Value value;
  int producer = 0;            // stage index
  std::vector<int> consumers;  // stage indices (> producer for Stream)
  int depth = 2;
  int64_t slot_bytes = 0;  // one tile
  int64_t bytes() const { return slot_bytes * depth; }
};

// A loop-carried value: arg starts as init, becomes next at the end of each iteration; result is
// next after the last iteration (MLIR's iter_args).
struct Carried {
  Value init, arg, next, result;
};

// METAPIPE(trip, body): a loop whose body is a pipeline of stages; stages run concurrently across
// iterations (iteration k+1's loads overlap iteration k's compute), intermediates live in N-buffers.
// Before the metapipeline pass the body is one Stage named "body" and buffers is empty.
struct MetaPipe : Node {
  MP_NODE_BOILERPLATE(MetaPipe)
  MetaPipe(const MetaPipe& o);  // deep copy of the body
  MetaPipe& operator=(const MetaPipe&) = delete;
  LoopVar var;
  bool masked = false;  // trip = ceil(extent / tile): the last iteration works on partial tiles
  std::vector<Carried> carried;
  std::vector<Stage> stages;
  std::vector<BufferInfo> buffers;
  bool scheduled = false;  // true after the metapipeline pass

  int64_t trip() const { return var->trip; }
  std::vector<Value> operands() const override;
  std::vector<NodeRef> body() const;  // every node of every stage, in order
  // Stage graph edges (producer, consumer), one per Stream buffer consumer, deduplicated.
  std::vector<std::pair<int, int>> edges() const;
};

template <class T>
T& Node::cast() {
  if (kind != T::kKind) fail_internal("node ", where(), " is not a ", to_string(T::kKind));
  return static_cast<T&>(*this);
}
template <class T>
const T& Node::cast() const {
  if (kind != T::kKind) fail_internal("node ", where(), " is not a ", to_string(T::kKind));
  return static_cast<const T&>(*this);
}

// Call f(node, depth) for every node in program order, entering MetaPipe bodies.
template <class F>
void walk(const std::vector<NodeRef>& nodes, F&& f, int depth = 0) {
  for (const auto& n : nodes) {
    f(n, depth);
    if (auto* m = n->as<MetaPipe>())
      for (const auto& s : m->stages) walk(s.ops, f, depth + 1);
  }
}

// ---------------------------------------------------------------------------------------------------
// A program: off-chip tensors and a list of top-level statements run in order (each top-level MetaPipe
// is one "kernel call" worth of work; off-chip tensors written by one are visible to the next).

struct Program {
  std::string name;
  std::vector<Tensor> tensors;
  std::vector<NodeRef> body;
  std::map<std::string, std::string> params;  // the parameters it was built with (for printing)

  // What has been done to it; the verifier checks the matching invariants.
  bool tiled = false, fused = false, parallelized = false, metapipelined = false;
  bool masking = false;               // non-dividing tiles may be masked
  int64_t onchip_budget = 8ll << 20;  // bytes of on-chip memory (PMU / SRAM) the program may use

  int next_id = 1;  // ids for values, nodes, loop vars and tensors

  Program clone() const;  // deep copy of the nodes; values and tensors are shared (immutable)
  Tensor tensor(const std::string& name) const;  // user_error naming the tensors present when absent

  // Factories that hand out ids.
  Value new_value(Shape shape, DType dt, std::vector<Affine> origin, std::string name = "");
  LoopVar new_loop_var(int64_t trip, std::string name = "");
  Tensor add_tensor(std::string name, Shape shape, DType dt, TensorRole role);
  template <class T>
  std::shared_ptr<T> new_node() {
    auto n = std::make_shared<T>();
    n->id = next_id++;
    return n;
  }
};

// Result shapes and checks shared by the front end and passes: each throws a user_error naming the node
// and the fix. These are the checking factories: they fill `out` (a fresh value) and return the node.
std::shared_ptr<Fill> make_fill(Program& p, Shape shape, DType dt, Expr f, std::vector<Affine> origin = {});
std::shared_ptr<LoadTile> make_load(Program& p, const Tensor& src, Shape tile, std::vector<Affine> offset,
                                    bool masked, int row_par = 1);
std::shared_ptr<StoreTile> make_store(Program& p, const Tensor& dst, const Value& in,
                                      std::vector<Affine> offset, bool masked);
std::shared_ptr<Map> make_map(Program& p, const Value& in, Expr f, DType out_dt);
std::shared_ptr<Zip> make_zip(Program& p, std::vector<Value> ins, Expr f, DType out_dt);
std::shared_ptr<Reduce> make_reduce(Program& p, const Value& in, int axis, Combiner c,
                                    std::optional<Expr> custom = {}, double identity = 0);
std::shared_ptr<MatMul> make_matmul(Program& p, const Value& a, const Value& b, bool ta, bool tb);
std::shared_ptr<Gather> make_gather(Program& p, const Tensor& table, const Value& index);
std::shared_ptr<Scatter> make_scatter(Program& p, const Tensor& table, const Value& index, const Value& rows);
std::shared_ptr<Buffer> make_buffer(Program& p, const Value& in, int depth);

// The broadcast result shape of a Zip (user_error on mismatch, naming `where`).
Shape broadcast_shapes(const std::vector<Value>& ins, const std::string& where);

}  // namespace mp::ir
