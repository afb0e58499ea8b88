// The C++ front end: write parallel patterns and metapipelines almost as the slides do, and get IR.
//
//   ProgramBuilder b("matmul");
//   auto A = b.input("A", {M, K}), B = b.input("B", {K, N});
//   auto C = b.output("C", {M, N});
//   METAPIPE(M / MM, [&]() {
//     auto a_tile = LOAD_TILE(A, {MM, K});
//     METAPIPE(N / NN, [&]() {
//       auto b_tile = LOAD_TILE(B, {K, NN}, row_par = 4);
//       auto c = MAT_MUL(a_tile, b_tile);
//       auto c_tile = BUFFER(c);
//       STORE_TILE(C, c_tile);
//     });
//   });
//   ir::Program p = b.finish();
//
// A LOAD_TILE / STORE_TILE without at(...) binds each axis the tile splits (tile < extent) to the
// innermost enclosing METAPIPEs, in axis order, and checks the trip counts match. Whole-tensor programs
// use LOAD(T) / STORE(T, v) outside any METAPIPE and let the tile pass split them.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "ir/ir.h"

namespace mp::front {

using ir::Combiner;
using ir::DType;
using ir::Expr;
using ir::Shape;
using ir::Tensor;
using ir::Value;

// A METAPIPE's loop index inside its body; converts to an affine offset (i * 64 is "64*i").
struct Idx {
  ir::LoopVar var;
  operator ir::Affine() const { return ir::Affine::var(var); }  // NOLINT
  ir::Affine operator*(int64_t k) const { return ir::Affine::var(var, k); }
};

// Named arguments: LOAD_TILE(B, shape, row_par = 4, masked = true, at(0, j * 64)).
struct RowPar {
  int value;
};
struct RowParTag {
  RowPar operator=(int v) const { return {v}; }  // NOLINT: the named-argument idiom
};
inline constexpr RowParTag row_par{};
struct Masked {
  bool value;
};
struct MaskedTag {
  Masked operator=(bool v) const { return {v}; }  // NOLINT
};
inline constexpr MaskedTag masked{};
struct Depth {
  int value;
};
struct DepthTag {
  Depth operator=(int v) const { return {v}; }  // NOLINT
};
inline constexpr DepthTag depth{};
struct At {
  std::vector<ir::Affine> offset;
};
template <class... T>
At at(T... offsets) {
  return At{{ir::Affine(offsets)...}};
}
struct Named {
  std::string name;
};
inline Named named(std::string n) { return {std::move(n)}; }
struct TransposeA {};
struct TransposeB {};
inline constexpr TransposeA transpose_a{};
inline constexpr TransposeB transpose_b{};

// Element-function helpers: the global index of the element along an axis, a seeded uniform [0, 1).
inline Expr index(int axis) { return Expr::index(axis); }
inline Expr uniform(uint64_t seed) { return Expr::random(seed); }
constexpr int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

class ProgramBuilder {
 public:
  explicit ProgramBuilder(std::string name);  // becomes the current builder of this thread
  ~ProgramBuilder();
  ProgramBuilder(const ProgramBuilder&) = delete;
  ProgramBuilder& operator=(const ProgramBuilder&) = delete;

  Tensor input(std::string name, Shape shape, DType dt = DType::f32);
  Tensor output(std::string name, Shape shape, DType dt = DType::f32);
  Tensor inout(std::string name, Shape shape, DType dt = DType::f32);
  Tensor temp(std::string name, Shape shape, DType dt = DType::f32);
  void param(const std::string& name, const std::string& value) { p_.params[name] = value; }

  ir::Program finish();  // verifies and returns the program; the builder is spent
  ir::Program& program() { return p_; }

  static ProgramBuilder& current();  // user_error when no builder is active

  // Used by the pattern functions below.
  void emit(ir::NodeRef n);
  std::vector<ir::Affine> implicit_offsets(const Tensor& t, const Shape& tile, const char* what);
  void metapipe(int64_t trip, const std::function<void(Idx)>& body);
  std::vector<Value> metapipe_fold(
      int64_t trip, const std::vector<Value>& init,
      const std::function<std::vector<Value>(Idx, const std::vector<Value>&)>& body);

 private:
  ir::Program p_;
  std::vector<std::vector<ir::NodeRef>*> scopes_;
  std::vector<ir::LoopVar> loops_;
  ProgramBuilder* prev_ = nullptr;
  bool finished_ = false;
};

// METAPIPE(n, body): body is [&]() {...} or [&](Idx i) {...}.
template <class F>
void METAPIPE(int64_t trip, F&& body) {
  if constexpr (std::is_invocable_v<F, Idx>)
    ProgramBuilder::current().metapipe(trip, [&](Idx i) { body(i); });
  else
    ProgramBuilder::current().metapipe(trip, [&](Idx) { body(); });
}
// METAPIPE_FOLD(n, {init...}, [&](Idx i, const std::vector<Value>& state) { ...; return next; }):
// a metapipeline with loop-carried values (accumulators, running statistics); returns the final values.
std::vector<Value> METAPIPE_FOLD(
    int64_t trip, const std::vector<Value>& init,
    const std::function<std::vector<Value>(Idx, const std::vector<Value>&)>& body);

namespace detail {
struct TileOpts {
  int row_par = 1;
  bool masked = false;
  std::vector<ir::Affine> offset;
  bool has_offset = false;
  int depth = 2;
  std::string name;
  void apply(const RowPar& r) { row_par = r.value; }
  void apply(const Masked& m) { masked = m.value; }
  void apply(const At& a) { offset = a.offset, has_offset = true; }
  void apply(const Depth& d) { depth = d.value; }
  void apply(const Named& n) { name = n.name; }
};
Value load_tile(const Tensor& t, const Shape& tile, const TileOpts& o);
void store_tile(const Tensor& t, const Value& v, const TileOpts& o);
Value buffer(const Value& v, const TileOpts& o);
}  // namespace detail

template <class... O>
Value LOAD_TILE(const Tensor& t, const Shape& tile, const O&... opts) {
  detail::TileOpts o;
  (o.apply(opts), ...);
  return detail::load_tile(t, tile, o);
}
template <class... O>
void STORE_TILE(const Tensor& t, const Value& v, const O&... opts) {
  detail::TileOpts o;
  (o.apply(opts), ...);
  detail::store_tile(t, v, o);
}
template <class... O>
Value BUFFER(const Value& v, const O&... opts) {
  detail::TileOpts o;
  (o.apply(opts), ...);
  return detail::buffer(v, o);
}
// The whole tensor as one value (before tiling) and its store.
Value LOAD(const Tensor& t);
void STORE(const Tensor& t, const Value& v);

Value MAT_MUL(const Value& a, const Value& b);
Value MAT_MUL(const Value& a, const Value& b, TransposeB);
Value MAT_MUL(const Value& a, const Value& b, TransposeA);

// Elementwise patterns; the result dtype is the first operand's (f32 for i32 operands).
Value MAP(const Value& v, const std::function<Expr(Expr)>& f);
Value ZIP(const Value& a, const Value& b, const std::function<Expr(Expr, Expr)>& f);
Value ZIP(const Value& a, const Value& b, const Value& c, const std::function<Expr(Expr, Expr, Expr)>& f);
Value ZIP(const std::vector<Value>& ins, const std::function<Expr(const std::vector<Expr>&)>& f);
// A tile computed from its element indices only: FILL({64, 64}, eq(index(0), index(1))).
Value FILL(const Shape& shape, const Expr& f, DType dt = DType::f32);

Value REDUCE(const Value& v, int axis, Combiner c);
// Any associative combiner with its identity: REDUCE(v, 1, [](Expr acc, Expr x) { return max(acc, x); },
// -inf).
Value REDUCE(const Value& v, int axis, const std::function<Expr(Expr, Expr)>& combine, double identity);
inline Value SUM(const Value& v, int axis) { return REDUCE(v, axis, Combiner::Add); }
inline Value MAX(const Value& v, int axis) { return REDUCE(v, axis, Combiner::Max); }

Value GATHER(const Tensor& table, const Value& index);
void SCATTER(const Tensor& table, const Value& index, const Value& rows);

}  // namespace mp::front
