// Scalar expressions: construction, printing, substitution and a flattened evaluator.
#include "ir/expr.h"

#include <cmath>
#include <functional>

#include "core/error.h"

namespace mp::ir {

const char* to_string(ExprOp op) {
  switch (op) {
#define MP_EXPR_NAME(n) \
  case ExprOp::n:       \
    return #n;
    MP_FOR_EACH_EXPR_OP(MP_EXPR_NAME)
#undef MP_EXPR_NAME
  }
  return "?";
}

static int arity(ExprOp op) {
  switch (op) {
    case ExprOp::Const:
    case ExprOp::Arg:
    case ExprOp::Index:
    case ExprOp::Random:
      return 0;
    case ExprOp::Add:
    case ExprOp::Sub:
    case ExprOp::Mul:
    case ExprOp::Div:
    case ExprOp::Max:
    case ExprOp::Min:
    case ExprOp::Pow:
    case ExprOp::Mod:
    case ExprOp::Lt:
    case ExprOp::Le:
    case ExprOp::Eq:
    case ExprOp::And:
      return 2;
    case ExprOp::Select:
      return 3;
    default:
      return 1;
  }
}

Expr::Expr(double c) {
  auto n = std::make_shared<ExprNode>();
  n->op = ExprOp::Const;
  n->value = c;
  n_ = std::move(n);
}

Expr Expr::arg(int i) {
  auto n = std::make_shared<ExprNode>();
  n->op = ExprOp::Arg;
  n->index = i;
  return Expr(std::shared_ptr<const ExprNode>(std::move(n)));
}
Expr Expr::index(int axis) {
  auto n = std::make_shared<ExprNode>();
  n->op = ExprOp::Index;
  n->index = axis;
  return Expr(std::shared_ptr<const ExprNode>(std::move(n)));
}
Expr Expr::random(uint64_t seed) {
  auto n = std::make_shared<ExprNode>();
  n->op = ExprOp::Random;
  n->seed = seed;
  return Expr(std::shared_ptr<const ExprNode>(std::move(n)));
}
Expr Expr::make(ExprOp op, std::vector<Expr> kids) {
  MP_INTERNAL_CHECK(int(kids.size()) == arity(op), "expression ", to_string(op), " takes ", arity(op),
                    " operands");
  auto n = std::make_shared<ExprNode>();
  n->op = op;
  for (auto& k : kids) n->kids.push_back(k.ptr());
  return Expr(std::shared_ptr<const ExprNode>(std::move(n)));
}

static void print_expr(const ExprNode& n, std::string& o) {
  auto bin = [&](const char* sym) {
    o += "(";
    print_expr(*n.kids[0], o);
    o += sym;
    print_expr(*n.kids[1], o);
    o += ")";
  };
  switch (n.op) {
    case ExprOp::Const: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", n.value);
      o += buf;
      return;
    }
    case ExprOp::Arg:
      o += n.index < 4 ? std::string(1, "xyzw"[n.index]) : "a" + std::to_string(n.index);
      return;
    case ExprOp::Index:
      o += "idx" + std::to_string(n.index);
      return;
    case ExprOp::Random:
      o += "rand(" + std::to_string(n.seed) + ")";
      return;
    case ExprOp::Add:
      return bin(" + ");
    case ExprOp::Sub:
      return bin(" - ");
    case ExprOp::Mul:
      return bin(" * ");
    case ExprOp::Div:
      return bin(" / ");
    case ExprOp::Mod:
      return bin(" % ");
    case ExprOp::Lt:
      return bin(" < ");
    case ExprOp::Le:
      return bin(" <= ");
    case ExprOp::Eq:
      return bin(" == ");
    case ExprOp::And:
      return bin(" && ");
    default: {
      std::string name = to_string(n.op);
      for (auto& c : name) c = char(std::tolower(c));
      o += name + "(";
      for (size_t i = 0; i < n.kids.size(); ++i) {
        if (i) o += ", ";
        print_expr(*n.kids[i], o);
      }
      o += ")";
    }
  }
}

std::string Expr::str() const {
  std::string o;
  print_expr(*n_, o);
  return o;
}

static void visit_expr(const ExprNode& n, const std::function<void(const ExprNode&)>& f) {
  f(n);
  for (auto& k : n.kids) visit_expr(*k, f);
}

int Expr::max_arg() const {
  int m = -1;
  visit_expr(*n_, [&](const ExprNode& n) {
    if (n.op == ExprOp::Arg) m = std::max(m, n.index);
  });
  return m;
}
int Expr::max_index_axis() const {
  int m = -1;
  visit_expr(*n_, [&](const ExprNode& n) {
    if (n.op == ExprOp::Index) m = std::max(m, n.index);
  });
  return m;
}
int64_t Expr::op_count() const {
  int64_t c = 0;
  visit_expr(*n_, [&](const ExprNode& n) { c += arity(n.op) > 0 || n.op == ExprOp::Random; });
  return std::max<int64_t>(c, 1);
}

static std::shared_ptr<const ExprNode> subst(const std::shared_ptr<const ExprNode>& n,
                                             const std::vector<Expr>& s) {
  if (n->op == ExprOp::Arg) {
    MP_INTERNAL_CHECK(n->index < int(s.size()), "substitute: arg ", n->index, " has no replacement");
    return s[n->index].ptr();
  }
  if (n->kids.empty()) return n;
  auto c = std::make_shared<ExprNode>(*n);
  for (auto& k : c->kids) k = subst(k, s);
  return c;
}
Expr Expr::substitute(const std::vector<Expr>& subs) const { return Expr(subst(n_, subs)); }

Expr operator+(const Expr& a, const Expr& b) { return Expr::make(ExprOp::Add, {a, b}); }
Expr operator-(const Expr& a, const Expr& b) { return Expr::make(ExprOp::Sub, {a, b}); }
Expr operator*(const Expr& a, const Expr& b) { return Expr::make(ExprOp::Mul, {a, b}); }
Expr operator/(const Expr& a, const Expr& b) { return Expr::make(ExprOp::Div, {a, b}); }
Expr operator-(const Expr& a) { return Expr::make(ExprOp::Neg, {a}); }
Expr operator<(const Expr& a, const Expr& b) { return Expr::make(ExprOp::Lt, {a, b}); }
Expr operator<=(const Expr& a, const Expr& b) { return Expr::make(ExprOp::Le, {a, b}); }
Expr operator>(const Expr& a, const Expr& b) { return Expr::make(ExprOp::Lt, {b, a}); }
Expr operator>=(const Expr& a, const Expr& b) { return Expr::make(ExprOp::Le, {b, a}); }
Expr operator%(const Expr& a, const Expr& b) { return Expr::make(ExprOp::Mod, {a, b}); }
Expr operator&&(const Expr& a, const Expr& b) { return Expr::make(ExprOp::And, {a, b}); }
Expr eq(const Expr& a, const Expr& b) { return Expr::make(ExprOp::Eq, {a, b}); }
Expr exp(const Expr& a) { return Expr::make(ExprOp::Exp, {a}); }
Expr log(const Expr& a) { return Expr::make(ExprOp::Log, {a}); }
Expr sqrt(const Expr& a) { return Expr::make(ExprOp::Sqrt, {a}); }
Expr rsqrt(const Expr& a) { return Expr::make(ExprOp::Rsqrt, {a}); }
Expr recip(const Expr& a) { return Expr::make(ExprOp::Recip, {a}); }
Expr abs(const Expr& a) { return Expr::make(ExprOp::Abs, {a}); }
Expr tanh(const Expr& a) { return Expr::make(ExprOp::Tanh, {a}); }
Expr sigmoid(const Expr& a) { return Expr::make(ExprOp::Sigmoid, {a}); }
Expr silu(const Expr& a) { return Expr::make(ExprOp::Silu, {a}); }
Expr cos(const Expr& a) { return Expr::make(ExprOp::Cos, {a}); }
Expr sin(const Expr& a) { return Expr::make(ExprOp::Sin, {a}); }
Expr floor(const Expr& a) { return Expr::make(ExprOp::Floor, {a}); }
Expr max(const Expr& a, const Expr& b) { return Expr::make(ExprOp::Max, {a, b}); }
Expr min(const Expr& a, const Expr& b) { return Expr::make(ExprOp::Min, {a, b}); }
Expr pow(const Expr& a, const Expr& b) { return Expr::make(ExprOp::Pow, {a, b}); }
Expr select(const Expr& c, const Expr& a, const Expr& b) { return Expr::make(ExprOp::Select, {c, a, b}); }

// splitmix64 finalizer over (seed, indices): a counter-based generator, so any tiling draws the same value
// for the same element.
double random_uniform(uint64_t seed, std::span<const int64_t> index) {
  auto mix = [](uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  uint64_t h = mix(seed);
  for (int64_t i : index) h = mix(h ^ uint64_t(i));
  return double(h >> 11) * (1.0 / 9007199254740992.0);
}

ExprEval::ExprEval(const Expr& e) {
  // Post-order: operands pushed before their operation.
  std::function<int(const ExprNode&)> emit = [&](const ExprNode& n) -> int {
    int depth = 0, i = 0;
    for (auto& k : n.kids) depth = std::max(depth, i++ + emit(*k));
    code_.push_back({n.op, n.value, n.index, n.seed});
    return std::max(depth, 1);
  };
  max_depth_ = emit(e.node()) + 1;
}

double ExprEval::operator()(std::span<const double> args, std::span<const int64_t> index) const {
  double st[64];
  MP_INTERNAL_CHECK(max_depth_ < 64, "expression too deep to evaluate (", max_depth_, ")");
  int sp = 0;
  for (const auto& in : code_) {
    switch (in.op) {
      case ExprOp::Const:
        st[sp++] = in.value;
        break;
      case ExprOp::Arg:
        st[sp++] = args[in.index];
        break;
      case ExprOp::Index:
        st[sp++] = in.index < int(index.size()) ? double(index[in.index]) : 0.0;
        break;
      case ExprOp::Random:
        st[sp++] = random_uniform(in.seed, index);
        break;
      case ExprOp::Neg:
        st[sp - 1] = -st[sp - 1];
        break;
      case ExprOp::Exp:
        st[sp - 1] = std::exp(st[sp - 1]);
        break;
      case ExprOp::Log:
        st[sp - 1] = std::log(st[sp - 1]);
        break;
      case ExprOp::Sqrt:
        st[sp - 1] = std::sqrt(st[sp - 1]);
        break;
      case ExprOp::Rsqrt:
        st[sp - 1] = 1.0 / std::sqrt(st[sp - 1]);
        break;
      case ExprOp::Recip:
        st[sp - 1] = 1.0 / st[sp - 1];
        break;
      case ExprOp::Abs:
        st[sp - 1] = std::fabs(st[sp - 1]);
        break;
      case ExprOp::Tanh:
        st[sp - 1] = std::tanh(st[sp - 1]);
        break;
      case ExprOp::Sigmoid:
        st[sp - 1] = 1.0 / (1.0 + std::exp(-st[sp - 1]));
        break;
      case ExprOp::Silu:
        st[sp - 1] = st[sp - 1] / (1.0 + std::exp(-st[sp - 1]));
        break;
      case ExprOp::Cos:
        st[sp - 1] = std::cos(st[sp - 1]);
        break;
      case ExprOp::Sin:
        st[sp - 1] = std::sin(st[sp - 1]);
        break;
      case ExprOp::Floor:
        st[sp - 1] = std::floor(st[sp - 1]);
        break;
      case ExprOp::Select:
        sp -= 2;
        st[sp - 1] = st[sp - 1] != 0 ? st[sp] : st[sp + 1];
        break;
      default: {
        double b = st[--sp], &a = st[sp - 1];
        switch (in.op) {
          case ExprOp::Add:
            a = a + b;
            break;
          case ExprOp::Sub:
            a = a - b;
            break;
          case ExprOp::Mul:
            a = a * b;
            break;
          case ExprOp::Div:
            a = a / b;
            break;
          case ExprOp::Max:
            a = std::max(a, b);
            break;
          case ExprOp::Min:
            a = std::min(a, b);
            break;
          case ExprOp::Pow:
            a = std::pow(a, b);
            break;
          case ExprOp::Mod:
            a = a - b * std::floor(a / b);
            break;
          case ExprOp::Lt:
            a = a < b;
            break;
          case ExprOp::Le:
            a = a <= b;
            break;
          case ExprOp::Eq:
            a = a == b;
            break;
          case ExprOp::And:
            a = (a != 0) && (b != 0);
            break;
          default:
            fail_internal("ExprEval: unhandled op ", to_string(in.op));
        }
      }
    }
  }
  return st[0];
}

}  // namespace mp::ir
