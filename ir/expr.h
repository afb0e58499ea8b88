// Scalar expressions: the element functions of Map, Zip, Fill and custom Reduce combiners.
// An Expr is a small immutable tree over the pattern's inputs (arg(i)), the global index of the element
// along an axis (index(axis)), constants and a seeded counter-based RNG, so a backend can read, print,
// cost and evaluate it without running C++ lambdas.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace mp::ir {

// clang-format off
#define MP_FOR_EACH_EXPR_OP(X)                                                                             \
  X(Const) X(Arg) X(Index) X(Neg) X(Exp) X(Log) X(Sqrt) X(Rsqrt) X(Recip) X(Abs) X(Tanh) X(Sigmoid) X(Silu) \
  X(Cos) X(Sin) X(Floor) X(Add) X(Sub) X(Mul) X(Div) X(Max) X(Min) X(Pow) X(Mod) X(Lt) X(Le) X(Eq) X(And)  \
  X(Select) X(Random)
// clang-format on

enum class ExprOp {
#define MP_EXPR_ENUM(n) n,
  MP_FOR_EACH_EXPR_OP(MP_EXPR_ENUM)
#undef MP_EXPR_ENUM
};
const char* to_string(ExprOp op);

struct ExprNode {
  ExprOp op = ExprOp::Const;
  double value = 0;   // Const
  int index = 0;      // Arg: input number; Index: axis
  uint64_t seed = 0;  // Random
  std::vector<std::shared_ptr<const ExprNode>> kids;
};

// A value-semantics handle with operators, so front-end lambdas read like math: exp(x - m) / s.
class Expr {
 public:
  Expr() : Expr(0.0) {}
  Expr(double c);  // NOLINT: constants convert implicitly
  Expr(int c) : Expr(double(c)) {}
  explicit Expr(std::shared_ptr<const ExprNode> n) : n_(std::move(n)) {}
  const ExprNode& node() const { return *n_; }
  const std::shared_ptr<const ExprNode>& ptr() const { return n_; }

  static Expr arg(int i);
  static Expr index(int axis);
  // Uniform in [0, 1) from (seed, global indices of the element): the same value whatever the tiling.
  static Expr random(uint64_t seed);
  static Expr make(ExprOp op, std::vector<Expr> kids);

  std::string str() const;
  int max_arg() const;         // highest arg(i) used, -1 when none
  int max_index_axis() const;  // highest index(axis) used, -1 when none
  int64_t op_count() const;    // arithmetic operations per element (for work estimates)
  // Replace arg(i) by subs[i] (used by fusion to compose element functions).
  Expr substitute(const std::vector<Expr>& subs) const;

 private:
  std::shared_ptr<const ExprNode> n_;
};

Expr operator+(const Expr& a, const Expr& b);
Expr operator-(const Expr& a, const Expr& b);
Expr operator*(const Expr& a, const Expr& b);
Expr operator/(const Expr& a, const Expr& b);
Expr operator-(const Expr& a);
Expr operator<(const Expr& a, const Expr& b);
Expr operator<=(const Expr& a, const Expr& b);
Expr operator>(const Expr& a, const Expr& b);
Expr operator>=(const Expr& a, const Expr& b);
Expr operator%(const Expr& a, const Expr& b);
Expr operator&&(const Expr& a, const Expr& b);
Expr eq(const Expr& a, const Expr& b);
Expr exp(const Expr& a);
Expr log(const Expr& a);
Expr sqrt(const Expr& a);
Expr rsqrt(const Expr& a);
Expr recip(const Expr& a);
Expr abs(const Expr& a);
Expr tanh(const Expr& a);
Expr sigmoid(const Expr& a);
Expr silu(const Expr& a);
Expr cos(const Expr& a);
Expr sin(const Expr& a);
Expr floor(const Expr& a);
Expr max(const Expr& a, const Expr& b);
Expr min(const Expr& a, const Expr& b);
Expr pow(const Expr& a, const Expr& b);
Expr select(const Expr& cond, const Expr& a, const Expr& b);

// Evaluates an expression many times quickly (flattened to a stack program once).
class ExprEval {
 public:
  explicit ExprEval(const Expr& e);
  double operator()(std::span<const double> args, std::span<const int64_t> index) const;

 private:
  struct Ins {
    ExprOp op;
    double value;
    int index;
    uint64_t seed;
  };
  std::vector<Ins> code_;
  int max_depth_ = 0;
};

// The counter-based generator behind Expr::random, exposed so references draw the same numbers.
double random_uniform(uint64_t seed, std::span<const int64_t> index);

}  // namespace mp::ir
