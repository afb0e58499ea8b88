// The model engine: a planner that binds the top-level nodes of a program to kernels once, and a plan
// that runs them. Value storage is assigned at plan time (buffers reused after a value's last use), so a
// run allocates nothing; expressions that depend only on element indices are evaluated at plan time.
#include "backends/cpu/llm_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

#include "backends/cpu/interpreter.h"
#include "core/quant.h"

namespace mp::cpu {

std::string PlanStats::str() const {
  std::ostringstream s;
  s << quant_matmul << " quantized matmul, " << permute << " permute, " << float_matmul << " float matmul, "
    << elementwise << " elementwise, " << reduce << " reduce, " << data_movement << " data movement, "
    << attention << " attention, " << generic << " generic";
  return s.str();
}

namespace {

using ir::Expr;
using ir::ExprOp;
using ir::Value;

// Loops the compiler vectorizes for the CPU it runs on (x86-64-v3 = AVX2 + FMA when present).
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define MP_VEC_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MP_VEC_CLONES
#endif

constexpr int kLanes = 16;

inline float dot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  float s = 0;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}
inline void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// exp for softmax: 2^k * p(r) with r in [-ln2/2, ln2/2], relative error ~2e-7 (a few float ulps).
inline float exp_approx(float x) {
  if (!(x > -87.f)) return x != x ? x : 0.f;
  x = std::min(x, 88.f);
  float k = std::nearbyint(x * 1.44269504089f);
  float r = x - k * 0.693145751953125f - k * 1.428606765330187e-06f;
  float p =
      1.f +
      r * (1.f + r * (0.5f + r * (0.166666672f + r * (0.0416664f + r * (0.00833638f + r * 0.00139958f)))));
  int32_t e = (int32_t(k) + 127) << 23;
  float s;
  std::memcpy(&s, &e, 4);
  return p * s;
}

// One query row of cached attention: softmax(q . K[s] * scale for s < n) weighted sum of V[s].
// sc: n floats of scratch; K and V rows `stride` apart.
MP_VEC_CLONES void attend_row(const float* q, const float* K, const float* V, int64_t stride, int64_t Dh,
                              int64_t n, float scale, float* sc, float* out) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t s = 0; s < n; ++s) {
    sc[s] = dot(q, K + s * stride, Dh) * scale;
    mx = std::max(mx, sc[s]);
  }
  double sum = 0;
  for (int64_t s = 0; s < n; ++s) sum += (sc[s] = exp_approx(sc[s] - mx));
  std::fill(out, out + Dh, 0.f);
  for (int64_t s = 0; s < n; ++s) axpy(sc[s], V + s * stride, out, Dh);
  float inv = float(1.0 / sum);
  for (int64_t e = 0; e < Dh; ++e) out[e] *= inv;
}

// A value's storage in a plan: float data (owned slot, alias of tensor storage, or a plan-time
// constant) and, for a loaded weight, its quantized matrix.
struct Buf {
  float* p = nullptr;
  const QMatrix* q = nullptr;
  int slot = -1;
  bool constant = false;
};

int64_t elems(const Value& v) { return ir::num_elements(v->shape); }

std::vector<int64_t> const_origin(const Value& v) {
  std::vector<int64_t> o;
  for (auto& a : v->origin) o.push_back(a.constant);
  return o;
}

// Row-major strides with broadcast axes (extent 1 in `in` but not in `out`) given stride 0.
std::vector<int64_t> bcast_strides(const ir::Shape& in, const ir::Shape& out) {
  std::vector<int64_t> st(in.size(), 0);
  int64_t s = 1;
  for (int a = int(in.size()) - 1; a >= 0; --a) {
    st[a] = (in[a] == 1 && out[a] != 1) ? 0 : s;
    s *= in[a];
  }
  return st;
}


bool uses_args(const ir::ExprNode& e) {
  if (e.op == ExprOp::Arg) return true;
  for (auto& k : e.kids)
    if (uses_args(*k)) return true;
  return false;
}

// An elementwise kernel: the expression flattened to instructions over arrays of n floats; operands
// are scalars, plan-time constant arrays, operand buffers or temporaries.
struct VecOperand {
  const float* p = nullptr;
  float s = 0;
  bool scalar = false;
  int scratch = -1;  // >= 0: the plan's scratch buffer of that number (p is set when the step runs)
};
struct VecIns {
  ExprOp op;
  float* dst;
  VecOperand a, b, c;
  int dst_scratch = -1;
};

MP_VEC_CLONES void run_ins(const VecIns& in, int64_t n) {
  float* d = in.dst;
  auto un = [&](auto f) {
    const float* a = in.a.p;
    for (int64_t i = 0; i < n; ++i) d[i] = f(a[i]);
  };
  auto bin = [&](auto f) {
    if (in.a.scalar) {
      float a = in.a.s;
      const float* b = in.b.p;
      for (int64_t i = 0; i < n; ++i) d[i] = f(a, b[i]);
    } else if (in.b.scalar) {
      const float* a = in.a.p;
      float b = in.b.s;
      for (int64_t i = 0; i < n; ++i) d[i] = f(a[i], b);
    } else {
      const float* a = in.a.p;
      const float* b = in.b.p;
      for (int64_t i = 0; i < n; ++i) d[i] = f(a[i], b[i]);
    }
  };
  switch (in.op) {
    case ExprOp::Neg:
      return un([](float x) { return -x; });
    case ExprOp::Exp:
      return un([](float x) { return exp_approx(x); });
    case ExprOp::Log:
      return un([](float x) { return std::log(x); });
    case ExprOp::Sqrt:
      return un([](float x) { return std::sqrt(x); });
    case ExprOp::Rsqrt:
      return un([](float x) { return 1.f / std::sqrt(x); });
    case ExprOp::Recip:
      return un([](float x) { return 1.f / x; });
    case ExprOp::Abs:
      return un([](float x) { return std::fabs(x); });
    case ExprOp::Tanh:
      return un([](float x) { return std::tanh(x); });
    case ExprOp::Sigmoid:
      return un([](float x) { return 1.f / (1.f + exp_approx(-x)); });
    case ExprOp::Silu:
      return un([](float x) { return x / (1.f + exp_approx(-x)); });
    case ExprOp::Cos:
      return un([](float x) { return float(std::cos(double(x))); });
    case ExprOp::Sin:
      return un([](float x) { return float(std::sin(double(x))); });
    case ExprOp::Floor:
      return un([](float x) { return std::floor(x); });
    case ExprOp::Add:
      return bin([](float x, float y) { return x + y; });
    case ExprOp::Sub:
      return bin([](float x, float y) { return x - y; });
    case ExprOp::Mul:
      return bin([](float x, float y) { return x * y; });
    case ExprOp::Div:
      return bin([](float x, float y) { return x / y; });
    case ExprOp::Max:
      return bin([](float x, float y) { return std::max(x, y); });
    case ExprOp::Min:
      return bin([](float x, float y) { return std::min(x, y); });
    case ExprOp::Pow:
      return bin([](float x, float y) { return float(std::pow(double(x), double(y))); });
    case ExprOp::Mod:
      return bin([](float x, float y) { return float(std::fmod(double(x), double(y))); });
    case ExprOp::Lt:
      return bin([](float x, float y) { return x < y ? 1.f : 0.f; });
    case ExprOp::Le:
      return bin([](float x, float y) { return x <= y ? 1.f : 0.f; });
    case ExprOp::Eq:
      return bin([](float x, float y) { return x == y ? 1.f : 0.f; });
    case ExprOp::And:
      return bin([](float x, float y) { return (x != 0 && y != 0) ? 1.f : 0.f; });
    case ExprOp::Select: {
      auto at = [](const VecOperand& o, int64_t i) { return o.scalar ? o.s : o.p[i]; };
      for (int64_t i = 0; i < n; ++i) d[i] = at(in.a, i) != 0 ? at(in.b, i) : at(in.c, i);
      return;
    }
    default:
      fail_internal("elementwise kernel: unexpected op ", ir::to_string(in.op));
  }
}

}  // namespace

class LlmEngine::Plan {
 public:
  std::vector<std::function<void()>> steps;
  PlanStats stats;
  std::vector<std::unique_ptr<std::vector<float>>> slots;   // value storage
  std::vector<std::unique_ptr<std::vector<float>>> consts;  // plan-time constants
  // Temporaries of one step at a time (elementwise sub-expressions, broadcast operands): sized at plan
  // time, addressed by number when a step runs.
  std::vector<std::vector<float>> scratch;
  int scratch_slot(int j, int64_t n) {
    if (int(scratch.size()) <= j) scratch.resize(size_t(j + 1));
    if (int64_t(scratch[size_t(j)].size()) < n) scratch[size_t(j)].resize(size_t(n));
    return j;
  }
  Memory mem;  // the program's own tensors (inputs, outputs, temps); InOut tensors live in the engine
  float* keep(std::vector<float> v) {
    consts.push_back(std::make_unique<std::vector<float>>(std::move(v)));
    return consts.back()->data();
  }
};

struct LlmEngine::Impl {
  WeightBindings weights;
  ThreadPool pool;
  Memory mem;                         // non-weight tensors; dequantized weights for generic nodes
  std::set<std::string> dequantized;  // weights copied into mem for the generic evaluation
  Impl(WeightBindings w, int threads) : weights(std::move(w)), pool(threads) {}
};

namespace {

// The attention nest the generator emits (models/llama.cpp): for kv head g and query head r of its
// group, online softmax over cache tiles of the query tile Q[:, (g*G + r)*Dh ...] against K/V[:, g*Dh ...]
// with the causal mask "key position <= the query's position", stored to Out at the same columns.
struct AttnMatch {
  ir::Tensor q, k, v, out;
  Value pos;
  int64_t T = 0, Dh = 0, HKV = 0, G = 0, C = 0;
  double scale = 1;
};

bool same_expr(const Expr& a, const Expr& b) { return a.str() == b.str(); }

std::optional<AttnMatch> match_attention(const ir::MetaPipe& m0) {
  auto single = [](const ir::MetaPipe& m) -> std::vector<ir::NodeRef> { return m.body(); };
  if (!m0.carried.empty()) return std::nullopt;
  auto b0 = single(m0);
  if (b0.size() != 1 || !b0[0]->as<ir::MetaPipe>()) return std::nullopt;
  const auto& m1 = b0[0]->cast<ir::MetaPipe>();
  if (!m1.carried.empty()) return std::nullopt;
  auto b1 = single(m1);
  if (b1.size() != 7) return std::nullopt;
  auto* lq = b1[0]->as<ir::LoadTile>();
  auto* fm = b1[1]->as<ir::Fill>();
  auto* fl = b1[2]->as<ir::Fill>();
  auto* fo = b1[3]->as<ir::Fill>();
  auto* fold = b1[4]->as<ir::MetaPipe>();
  auto* fin = b1[5]->as<ir::Zip>();
  auto* st = b1[6]->as<ir::StoreTile>();
  if (!lq || !fm || !fl || !fo || !fold || !fin || !st) return std::nullopt;
  AttnMatch a;
  a.HKV = m0.trip();
  a.G = m1.trip();
  a.q = lq->src;
  a.out = st->dst;
  if (lq->out->shape.size() != 2 || lq->masked || st->masked) return std::nullopt;
  a.T = lq->out->shape[0];
  a.Dh = lq->out->shape[1];
  const int64_t qw = a.HKV * a.G * a.Dh, kvw = a.HKV * a.Dh;
  auto qcol_ok = [&](const std::vector<ir::Affine>& off) {
    return off.size() == 2 && off[0].is_const() && off[0].constant == 0 && off[1].constant == 0 &&
           off[1].terms.size() == 2 && off[1].coef_of(m0.var) == a.G * a.Dh && off[1].coef_of(m1.var) == a.Dh;
  };
  if (!qcol_ok(lq->offset) || !qcol_ok(st->offset)) return std::nullopt;
  if (a.q->shape != ir::Shape{a.T, qw} || a.out->shape != ir::Shape{a.T, qw}) return std::nullopt;
  const double inf = std::numeric_limits<double>::infinity();
  if (fm->out->shape != ir::Shape{a.T, 1} || !same_expr(fm->f, Expr(-inf))) return std::nullopt;
  if (fl->out->shape != ir::Shape{a.T, 1} || !same_expr(fl->f, Expr(0.0))) return std::nullopt;
  if (fo->out->shape != ir::Shape{a.T, a.Dh} || !same_expr(fo->f, Expr(0.0))) return std::nullopt;
  if (fold->carried.size() != 3 || fold->carried[0].init != fm->out || fold->carried[1].init != fl->out ||
      fold->carried[2].init != fo->out)
    return std::nullopt;
  auto fb = fold->body();
  if (fb.size() != 12) return std::nullopt;
  auto* lk = fb[0]->as<ir::LoadTile>();
  auto* lv = fb[1]->as<ir::LoadTile>();
  auto* mm = fb[2]->as<ir::MatMul>();
  auto* zs = fb[3]->as<ir::Zip>();
  auto* rm = fb[4]->as<ir::Reduce>();
  auto* zm = fb[5]->as<ir::Zip>();
  auto* za = fb[6]->as<ir::Zip>();
  auto* zp = fb[7]->as<ir::Zip>();
  auto* rl = fb[8]->as<ir::Reduce>();
  auto* zl = fb[9]->as<ir::Zip>();
  auto* mv = fb[10]->as<ir::MatMul>();
  auto* zo = fb[11]->as<ir::Zip>();
  if (!lk || !lv || !mm || !zs || !rm || !zm || !za || !zp || !rl || !zl || !mv || !zo) return std::nullopt;
  a.k = lk->src;
  a.v = lv->src;
  if (lk->masked || lv->masked || lk->out->shape.size() != 2) return std::nullopt;
  const int64_t TK = lk->out->shape[0];
  a.C = TK * fold->trip();
  if (lk->out->shape != ir::Shape{TK, a.Dh} || lv->out->shape != ir::Shape{TK, a.Dh}) return std::nullopt;
  if (a.k->shape != ir::Shape{a.C, kvw} || a.v->shape != ir::Shape{a.C, kvw}) return std::nullopt;
  auto kv_ok = [&](const std::vector<ir::Affine>& off) {
    return off.size() == 2 && off[0].constant == 0 && off[0].terms.size() == 1 &&
           off[0].coef_of(fold->var) == TK && off[1].constant == 0 && off[1].terms.size() == 1 &&
           off[1].coef_of(m0.var) == a.Dh;
  };
  if (!kv_ok(lk->offset) || !kv_ok(lv->offset)) return std::nullopt;
  const auto& c = fold->carried;
  if (mm->a != lq->out || mm->b != lk->out || mm->transpose_a || !mm->transpose_b) return std::nullopt;
  // Mask: select(index(1) <= arg(1), arg(0) * scale, -inf), arg(1) the position of the query row.
  if (zs->ins.size() != 2 || zs->ins[0] != mm->out || zs->ins[1]->shape != ir::Shape{a.T, 1})
    return std::nullopt;
  const ir::ExprNode& e = zs->f.node();
  if (e.op != ExprOp::Select || e.kids.size() != 3) return std::nullopt;
  const auto& mul = *e.kids[1];
  if (mul.op != ExprOp::Mul || mul.kids.size() != 2 || mul.kids[1]->op != ExprOp::Const) return std::nullopt;
  a.scale = mul.kids[1]->value;
  Expr expect_mask = ir::select(Expr::index(1) <= Expr::arg(1), Expr::arg(0) * a.scale, -inf);
  if (!same_expr(zs->f, expect_mask)) return std::nullopt;
  a.pos = zs->ins[1];
  Expr x0 = Expr::arg(0), x1 = Expr::arg(1), x2 = Expr::arg(2);
  auto zip_is = [&](const ir::Zip* z, std::vector<Value> ins, const Expr& f) {
    return z->ins == ins && same_expr(z->f, f);
  };
  auto red_is = [&](const ir::Reduce* r, const Value& in, ir::Combiner comb) {
    return r->in == in && r->axis == 1 && r->combiner == comb && !r->pre && !r->custom;
  };
  if (!red_is(rm, zs->out, ir::Combiner::Max)) return std::nullopt;
  if (!zip_is(zm, {c[0].arg, rm->out}, ir::max(x0, x1))) return std::nullopt;
  if (!zip_is(za, {c[0].arg, zm->out}, ir::exp(x0 - x1))) return std::nullopt;
  if (!zip_is(zp, {zs->out, zm->out}, ir::exp(x0 - x1))) return std::nullopt;
  if (!red_is(rl, zp->out, ir::Combiner::Add)) return std::nullopt;
  if (!zip_is(zl, {c[1].arg, za->out, rl->out}, x0 * x1 + x2)) return std::nullopt;
  if (mv->a != zp->out || mv->b != lv->out || mv->transpose_a || mv->transpose_b) return std::nullopt;
  if (!zip_is(zo, {c[2].arg, za->out, mv->out}, x0 * x1 + x2)) return std::nullopt;
  if (c[0].next != zm->out || c[1].next != zl->out || c[2].next != zo->out) return std::nullopt;
  if (!zip_is(fin, {c[2].result, c[1].result}, x0 / x1)) return std::nullopt;
  if (st->in != fin->out) return std::nullopt;
  return a;
}

// Tensors a node reads or writes, and the values it uses that are defined outside it.
void node_tensors(const ir::NodeRef& n, std::set<std::string>& reads, std::set<std::string>& writes) {
  ir::walk({n}, [&](const ir::NodeRef& x, int) {
    if (auto* l = x->as<ir::LoadTile>()) reads.insert(l->src->name);
    if (auto* s = x->as<ir::StoreTile>()) writes.insert(s->dst->name);
    if (auto* g = x->as<ir::Gather>()) reads.insert(g->table->name);
    if (auto* s = x->as<ir::Scatter>()) writes.insert(s->table->name);
  });
}
std::vector<Value> outer_operands(const ir::NodeRef& n) {
  std::set<int> inner;
  std::vector<Value> outer;
  std::set<int> seen;
  ir::walk({n}, [&](const ir::NodeRef& x, int) {
    if (x->out) inner.insert(x->out->id);
    if (auto* m = x->as<ir::MetaPipe>())
      for (auto& c : m->carried) inner.insert(c.arg->id), inner.insert(c.result->id);
  });
  ir::walk({n}, [&](const ir::NodeRef& x, int) {
    for (auto& v : x->operands())
      if (v && !inner.count(v->id) && seen.insert(v->id).second) outer.push_back(v);
    if (auto* m = x->as<ir::MetaPipe>())
      for (auto& c : m->carried)
        if (c.next && !inner.count(c.next->id) && seen.insert(c.next->id).second) outer.push_back(c.next);
  });
  return outer;
}

}  // namespace

// One plan under construction.
struct Planner {
  Planner(LlmEngine::Impl& e, LlmEngine::Plan& pl, const ir::Program& pr) : eng(e), plan(pl), prog(pr) {}
  LlmEngine::Impl& eng;
  LlmEngine::Plan& plan;
  const ir::Program& prog;
  std::map<int, Buf> bufs;
  std::map<int, const ir::Node*> producer;
  std::map<int, size_t> last_use;  // top-level statement index of a value's last use
  std::vector<std::set<std::string>> writes_at;
  std::vector<int> free_slots;
  // Constant matrices found to be signed permutations: per column, the source row and the sign.
  std::map<int, std::optional<std::pair<std::vector<int64_t>, std::vector<float>>>> permutations;

  Buf& buf(const Value& v) {
    auto it = bufs.find(v->id);
    MP_INTERNAL_CHECK(it != bufs.end(), "engine: value %", v->id, " has no storage");
    return it->second;
  }
  float* alloc(const Value& v) {
    size_t n = size_t(elems(v));
    int best = -1;
    for (size_t i = 0; i < free_slots.size(); ++i) {
      int s = free_slots[i];
      if (plan.slots[size_t(s)]->size() >= n &&
          (best < 0 || plan.slots[size_t(s)]->size() < plan.slots[size_t(free_slots[size_t(best)])]->size()))
        best = int(i);
    }
    Buf b;
    if (best >= 0) {
      b.slot = free_slots[size_t(best)];
      free_slots.erase(free_slots.begin() + best);
    } else {
      plan.slots.push_back(std::make_unique<std::vector<float>>(n));
      b.slot = int(plan.slots.size() - 1);
    }
    b.p = plan.slots[size_t(b.slot)]->data();
    bufs[v->id] = b;
    return b.p;
  }
  const QMatrix* weight(const std::string& name) {
    auto it = eng.weights.find(name);
    return it == eng.weights.end() ? nullptr : &it->second;
  }
  HostTensor& storage(const ir::Tensor& t) {
    MP_INTERNAL_CHECK(!weight(t->name), "engine: '", t->name, "' is a weight, not engine storage");
    return t->role == ir::TensorRole::InOut ? eng.mem.at(t->name) : plan.mem.at(t->name);
  }
  // A weight as float rows in eng.mem, for the generic evaluation (made once per engine).
  void dequantize_into_mem(const std::string& name) {
    const QMatrix* q = weight(name);
    if (!q || eng.dequantized.count(name)) return;
    HostTensor h{{q->rows, q->cols}, ir::DType::f32, std::vector<float>(size_t(q->rows * q->cols))};
    uint64_t rb = *quant::row_bytes(q->type, q->cols);
    for (int64_t r = 0; r < q->rows; ++r)
      quant::dequantize_row(q->type, static_cast<const uint8_t*>(q->data) + r * rb,
                            &h.data[size_t(r * q->cols)], q->cols);
    eng.mem[name] = std::move(h);
    eng.dequantized.insert(name);
  }
  // Float data of a value at run time; a loaded quantized weight or a Fill is materialized at plan time.
  float* data(const Value& v) {
    Buf& b = buf(v);
    if (b.p) return b.p;
    if (b.q) {
      std::vector<float> d(size_t(b.q->rows * b.q->cols));
      uint64_t rb = *quant::row_bytes(b.q->type, b.q->cols);
      for (int64_t r = 0; r < b.q->rows; ++r)
        quant::dequantize_row(b.q->type, static_cast<const uint8_t*>(b.q->data) + r * rb,
                              &d[size_t(r * b.q->cols)], b.q->cols);
      b.p = plan.keep(std::move(d));
      b.constant = true;
      return b.p;
    }
    const ir::Node* n = producer.at(v->id);
    auto& f = n->cast<ir::Fill>();
    b.p = constant(f.f, v);
    b.constant = true;
    return b.p;
  }
  // An index-only expression over the elements of v (global indices from v's origin), in double. It is
  // evaluated only along the axes it reads (a RoPE frequency depends on the column alone) and
  // broadcast, and memoized: every layer's RoPE has the same one.
  std::map<std::string, float*> constants;
  std::vector<float> eval_constant(const Expr& e, const Value& v) {
    std::vector<bool> uses(v->shape.size(), false);
    std::function<void(const ir::ExprNode&)> scan = [&](const ir::ExprNode& x) {
      if (x.op == ExprOp::Index && x.index < int(uses.size())) uses[size_t(x.index)] = true;
      if (x.op == ExprOp::Random) uses.assign(uses.size(), true);
      for (auto& k : x.kids) scan(*k);
    };
    scan(e.node());
    ir::Shape small = v->shape;
    for (size_t a = 0; a < small.size(); ++a)
      if (!uses[a]) small[a] = 1;
    ir::ExprEval ev(e);
    std::vector<float> part(size_t(ir::num_elements(small)));
    auto org = const_origin(v);
    std::vector<int64_t> g(v->shape.size());
    ir::for_each_index(small, [&](int64_t flat, const std::vector<int64_t>& idx) {
      for (size_t a = 0; a < idx.size(); ++a) g[a] = org[a] + idx[a];
      part[size_t(flat)] = float(ev({}, g));
    });
    if (small == v->shape) return part;
    std::vector<float> out(size_t(elems(v)));
    auto st = bcast_strides(small, v->shape);
    ir::for_each_index(v->shape, [&](int64_t flat, const std::vector<int64_t>& idx) {
      int64_t o = 0;
      for (size_t a = 0; a < idx.size(); ++a) o += idx[a] * st[a];
      out[size_t(flat)] = part[size_t(o)];
    });
    return out;
  }
  float* constant(const Expr& e, const Value& v) {
    std::ostringstream key;
    key << e.str() << "|" << ir::to_string(v->shape);
    for (auto& a : v->origin) key << "," << a.str();
    auto it = constants.find(key.str());
    if (it != constants.end()) return it->second;
    float* p = plan.keep(eval_constant(e, v));
    constants[key.str()] = p;
    return p;
  }

  void compile(size_t i, const ir::NodeRef& n);
  void generic(const ir::NodeRef& n);
  bool try_attention(const ir::MetaPipe& m);
  void elementwise(const ir::Node& n, const std::vector<Value>& ins, const Expr& f);
  void matmul(const ir::MatMul& m);
};

void Planner::generic(const ir::NodeRef& n) {
  std::set<std::string> reads, writes;
  node_tensors(n, reads, writes);
  for (auto& t : reads) dequantize_into_mem(t);
  for (auto& t : writes)
    MP_USER_CHECK(!weight(t), n->where(), " writes '", t, "', which is bound to a read-only weight");
  std::vector<std::pair<Value, float*>> ins;
  for (auto& v : outer_operands(n)) ins.push_back({v, data(v)});
  float* out = n->out && !n->as<ir::MetaPipe>() ? alloc(n->out) : nullptr;
  // Engine-level tensors (the cache, dequantized weights) join the plan's memory for the evaluation;
  // moving a vector keeps its data where it is, so the other kernels' pointers stay valid.
  std::vector<std::string> shared;
  for (auto* set : {&reads, &writes})
    for (auto& t : *set)
      if (eng.mem.count(t) && !plan.mem.count(t)) shared.push_back(t);
  Memory* pmem = &plan.mem;
  Memory* emem = &eng.mem;
  ir::NodeRef node = n;
  plan.steps.push_back([ins, out, pmem, emem, shared, node]() {
    struct Lend {
      Memory *p, *e;
      const std::vector<std::string>& names;
      Lend(Memory* p_, Memory* e_, const std::vector<std::string>& n_) : p(p_), e(e_), names(n_) {
        for (auto& t : names) (*p)[t] = std::move(e->at(t));
      }
      ~Lend() {
        for (auto& t : names) {
          (*e)[t] = std::move(p->at(t));
          p->erase(t);
        }
      }
    } lend(pmem, emem, shared);
    Memory* mem = pmem;
    Env env;
    for (auto& [v, p] : ins) {
      auto t = std::make_shared<Tile>();
      t->shape = v->shape;
      t->origin = const_origin(v);
      t->data.assign(p, p + elems(v));
      env.set(v, std::move(t));
    }
    if (auto* m = node->as<ir::MetaPipe>()) {
      interpret_metapipe(*m, env, *mem);
      return;
    }
    auto t = eval_node(*node, env, *mem);
    if (out) {
      MP_INTERNAL_CHECK(int64_t(t->data.size()) == elems(node->out), "engine: generic ", node->where(),
                        " gave a tile of another size");
      std::copy(t->data.begin(), t->data.end(), out);
    }
  });
  ++plan.stats.generic;
}

void Planner::elementwise(const ir::Node& n, const std::vector<Value>& ins, const Expr& f) {
  const Value& out = n.out;
  const int64_t N = elems(out);
  int next_scratch = 0;
  std::vector<VecIns> code;
  struct Expand {
    const float* src;
    int dst;
    std::vector<int64_t> strides;
  };
  std::vector<Expand> expand;
  std::vector<VecOperand> args;
  for (auto& v : ins) {
    float* p = data(v);
    if (v->shape == out->shape) {
      args.push_back({p, 0, false, -1});
    } else {
      int j = plan.scratch_slot(next_scratch++, N);
      expand.push_back({p, j, bcast_strides(v->shape, out->shape)});
      args.push_back({nullptr, 0, false, j});
    }
  }
  auto filled = [&](float s) { return VecOperand{constant(Expr(double(s)), out), 0, false, -1}; };
  std::function<VecOperand(const ir::ExprNode&, bool)> comp = [&](const ir::ExprNode& e,
                                                                  bool root) -> VecOperand {
    if (e.op == ExprOp::Const) return {nullptr, float(e.value), true, -1};
    if (e.op == ExprOp::Arg) {
      MP_INTERNAL_CHECK(e.index < int(args.size()), n.where(), ": arg(", e.index, ") without an operand");
      return args[size_t(e.index)];
    }
    if (!uses_args(e)) return {constant(Expr(std::make_shared<ir::ExprNode>(e)), out), 0, false, -1};
    VecIns in{e.op, nullptr, {}, {}, {}, -1};
    VecOperand* ops[3] = {&in.a, &in.b, &in.c};
    MP_INTERNAL_CHECK(e.kids.size() <= 3, n.where(), ": expression op with ", e.kids.size(), " operands");
    for (size_t k = 0; k < e.kids.size(); ++k) *ops[k] = comp(*e.kids[k], false);
    // Unary ops and the first operand of a binary op read arrays; a scalar there is broadcast once.
    if (e.kids.size() == 1 && in.a.scalar) in.a = filled(in.a.s);
    if (e.kids.size() == 2 && in.a.scalar && in.b.scalar) in.a = filled(in.a.s);
    if (!root) in.dst_scratch = plan.scratch_slot(next_scratch++, N);
    code.push_back(in);
    return root ? VecOperand{nullptr, 0, false, -2} : VecOperand{nullptr, 0, false, in.dst_scratch};
  };
  float* dst = alloc(out);
  VecOperand r = comp(f.node(), true);
  if (r.scratch != -2) {  // the whole expression is an operand or a constant: copy it
    VecIns cp{ExprOp::Add, nullptr, r.scalar ? filled(r.s) : r, {nullptr, 0.f, true, -1}, {}, -1};
    code.push_back(cp);
  }
  ir::Shape shape = out->shape;
  LlmEngine::Plan* pl = &plan;
  plan.steps.push_back([code, expand, N, shape, dst, pl]() {
    auto at = [&](int j) { return pl->scratch[size_t(j)].data(); };
    for (auto& x : expand) {
      float* d = at(x.dst);
      ir::for_each_index(shape, [&](int64_t flat, const std::vector<int64_t>& idx) {
        int64_t o = 0;
        for (size_t a = 0; a < idx.size(); ++a) o += idx[a] * x.strides[a];
        d[flat] = x.src[o];
      });
    }
    for (VecIns in : code) {
      in.dst = in.dst_scratch >= 0 ? at(in.dst_scratch) : dst;
      for (VecOperand* o : {&in.a, &in.b, &in.c})
        if (o->scratch >= 0) o->p = at(o->scratch);
      run_ins(in, N);
    }
  });
  ++plan.stats.elementwise;
}

void Planner::matmul(const ir::MatMul& m) {
  const Value& out = m.out;
  Buf& bb = buf(m.b);
  if (bb.q && m.transpose_b && !m.transpose_a && !buf(m.a).q) {
    const QMatrix* W = bb.q;
    const float* x = data(m.a);
    int64_t M = m.a->shape[0];
    float* y = alloc(out);
    ThreadPool* pool = &eng.pool;
    if (M == 1)
      plan.steps.push_back([W, x, y, pool]() { matvec(*W, x, y, *pool); });
    else
      plan.steps.push_back([W, x, y, M, pool]() { cpu::matmul(*W, x, M, y, *pool); });
    ++plan.stats.quant_matmul;
    return;
  }
  const int64_t M = out->shape[0], N = out->shape[1];
  const int64_t K = m.a->shape[m.transpose_a ? 0 : 1];
  // A constant B whose every column holds at most one nonzero, +1 or -1: out[:, j] = sign * a[:, src].
  auto* fill = producer.count(m.b->id) ? producer.at(m.b->id)->as<ir::Fill>() : nullptr;
  if (fill && !m.transpose_a && !bb.p) {
    auto it = permutations.find(m.b->id);
    if (it == permutations.end()) {
      ir::ExprEval ev(fill->f);
      auto org = const_origin(m.b);
      std::vector<int64_t> src(size_t(N), -1);
      std::vector<float> sign(size_t(N), 0.f);
      bool ok = true;
      int64_t g[2];
      for (int64_t j = 0; j < N && ok; ++j)
        for (int64_t k = 0; k < K && ok; ++k) {
          if (m.transpose_b)
            g[0] = org[0] + j, g[1] = org[1] + k;
          else
            g[0] = org[0] + k, g[1] = org[1] + j;
          double w = ev({}, g);
          if (w == 0) continue;
          if ((w != 1 && w != -1) || src[size_t(j)] >= 0) ok = false;
          src[size_t(j)] = k, sign[size_t(j)] = float(w);
        }
      it = permutations.emplace(m.b->id, ok ? std::optional(std::pair(src, sign)) : std::nullopt).first;
    }
    bool perm = it->second.has_value();
    if (perm) {
      // References, not a structured binding: clang before 16 cannot capture bindings in a lambda.
      const auto& src = it->second->first;
      const auto& sign = it->second->second;
      const float* a = data(m.a);
      float* y = alloc(out);
      plan.steps.push_back([a, y, M, N, K, src, sign]() {
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j)
            y[i * N + j] = src[size_t(j)] < 0 ? 0.f : sign[size_t(j)] * a[i * K + src[size_t(j)]];
      });
      ++plan.stats.permute;
      return;
    }
  }
  const float* a = data(m.a);
  const float* b = data(m.b);
  float* y = alloc(out);
  bool ta = m.transpose_a, tb = m.transpose_b;
  plan.steps.push_back([a, b, y, M, N, K, ta, tb]() {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += double(ta ? a[k * M + i] : a[i * K + k]) * double(tb ? b[j * K + k] : b[k * N + j]);
        y[i * N + j] = float(s);
      }
  });
  ++plan.stats.float_matmul;
}

bool Planner::try_attention(const ir::MetaPipe& m) {
  auto am = match_attention(m);
  if (!am) return false;
  for (auto* t : {&am->q, &am->k, &am->v, &am->out})
    if (weight((*t)->name)) return false;
  const AttnMatch a = *am;
  const float* q = storage(a.q).data.data();
  const float* k = storage(a.k).data.data();
  const float* v = storage(a.v).data.data();
  float* o = storage(a.out).data.data();
  const float* pos = data(a.pos);
  ThreadPool* pool = &eng.pool;
  plan.steps.push_back([a, q, k, v, o, pos, pool]() {
    const int64_t H = a.HKV * a.G, qw = H * a.Dh, kvw = a.HKV * a.Dh;
    for (int64_t t = 0; t < a.T; ++t) {
      float p = pos[t];
      MP_USER_CHECK(p >= 0 && p < float(a.C) && p == std::floor(p), "attention over '", a.k->name,
                    "': position ", p, " of token ", t, " is outside the cache [0, ", a.C, ")");
    }
    pool->parallel_for(H * a.T, [&](int64_t begin, int64_t end) {
      std::vector<float> sc(size_t(a.C));
      for (int64_t ht = begin; ht < end; ++ht) {
        int64_t h = ht / a.T, t = ht % a.T, g = h / a.G;
        attend_row(q + t * qw + h * a.Dh, k + g * a.Dh, v + g * a.Dh, kvw, a.Dh, int64_t(pos[t]) + 1,
                   float(a.scale), sc.data(), o + t * qw + h * a.Dh);
      }
    });
  });
  ++plan.stats.attention;
  return true;
}

void Planner::compile(size_t i, const ir::NodeRef& n) {
  if (n->out) producer[n->out->id] = n.get();
  switch (n->kind) {
    case ir::NodeKind::Fill:
      bufs[n->out->id] = Buf{};  // materialized on first use (data()), or read by a permute MatMul
      return;
    case ir::NodeKind::LoadTile: {
      auto& l = n->cast<ir::LoadTile>();
      bool consts = std::all_of(l.offset.begin(), l.offset.end(), [](auto& a) { return a.is_const(); });
      if (!consts || l.masked) return generic(n);
      if (const QMatrix* q = weight(l.src->name)) {
        if (l.out->shape == l.src->shape) {
          Buf b;
          b.q = q;
          if (q->type == quant::QType::F32) b.p = const_cast<float*>(static_cast<const float*>(q->data));
          b.constant = true;
          bufs[l.out->id] = b;
          ++plan.stats.data_movement;
          return;
        }
        return generic(n);
      }
      HostTensor& h = storage(l.src);
      const auto& s = l.out->shape;
      const auto& ts = l.src->shape;
      // Contiguous when every axis after the first is whole; an alias needs the tensor unchanged until
      // the value's last use.
      bool contiguous = true;
      for (size_t a = 1; a < s.size(); ++a)
        contiguous = contiguous && s[a] == ts[a] && l.offset[a].constant == 0;
      bool written = false;
      size_t last = last_use.count(l.out->id) ? last_use.at(l.out->id) : i;
      for (size_t j = i + 1; j <= last && j < writes_at.size(); ++j)
        written = written || writes_at[j].count(l.src->name);
      int64_t start = 0, stride = 1;
      for (int a = int(ts.size()) - 1; a >= 0; --a)
        start += l.offset[size_t(a)].constant * stride, stride *= ts[size_t(a)];
      if (contiguous && !written) {
        Buf b;
        b.p = h.data.data() + start;
        bufs[l.out->id] = b;
        ++plan.stats.data_movement;
        return;
      }
      if (s.size() != 2) return generic(n);
      float* src = h.data.data();
      float* dst = alloc(l.out);
      int64_t r0 = l.offset[0].constant, c0 = l.offset[1].constant, R = s[0], Cc = s[1], W = ts[1];
      plan.steps.push_back([=]() {
        for (int64_t r = 0; r < R; ++r) std::copy_n(src + (r0 + r) * W + c0, Cc, dst + r * Cc);
      });
      ++plan.stats.data_movement;
      return;
    }
    case ir::NodeKind::StoreTile: {
      auto& s = n->cast<ir::StoreTile>();
      bool consts = std::all_of(s.offset.begin(), s.offset.end(), [](auto& a) { return a.is_const(); });
      if (!consts || s.masked || s.in->shape.size() != 2 || weight(s.dst->name)) return generic(n);
      float* dst = storage(s.dst).data.data();
      const float* src = data(s.in);
      int64_t r0 = s.offset[0].constant, c0 = s.offset[1].constant, R = s.in->shape[0], Cc = s.in->shape[1],
              W = s.dst->shape[1];
      plan.steps.push_back([=]() {
        for (int64_t r = 0; r < R; ++r) std::copy_n(src + r * Cc, Cc, dst + (r0 + r) * W + c0);
      });
      ++plan.stats.data_movement;
      return;
    }
    case ir::NodeKind::Map: {
      auto& m = n->cast<ir::Map>();
      return elementwise(*n, {m.in}, m.f);
    }
    case ir::NodeKind::Zip: {
      auto& z = n->cast<ir::Zip>();
      return elementwise(*n, z.ins, z.f);
    }
    case ir::NodeKind::Reduce: {
      auto& r = n->cast<ir::Reduce>();
      if (r.in->shape.size() != 2 || r.axis != 1 || r.pre || r.custom) return generic(n);
      const float* in = data(r.in);
      float* out = alloc(r.out);
      int64_t R = r.in->shape[0], Cc = r.in->shape[1];
      ir::Combiner comb = r.combiner;
      double id = r.identity;
      plan.steps.push_back([=]() {
        for (int64_t i = 0; i < R; ++i) {
          double acc = id;
          const float* row = in + i * Cc;
          for (int64_t c = 0; c < Cc; ++c) {
            double x = row[c];
            switch (comb) {
              case ir::Combiner::Add:
                acc += x;
                break;
              case ir::Combiner::Mul:
                acc *= x;
                break;
              case ir::Combiner::Max:
                acc = std::max(acc, x);
                break;
              default:
                acc = std::min(acc, x);
                break;
            }
          }
          out[i] = float(acc);
        }
      });
      ++plan.stats.reduce;
      return;
    }
    case ir::NodeKind::MatMul:
      return matmul(n->cast<ir::MatMul>());
    case ir::NodeKind::Gather: {
      auto& g = n->cast<ir::Gather>();
      const float* idx = data(g.index);
      float* out = alloc(g.out);
      int64_t R = g.index->shape[0], rows = g.table->shape[0], Cc = g.table->shape[1];
      std::string tname = g.table->name, where = g.where();
      const QMatrix* q = weight(tname);
      const float* table = q ? nullptr : storage(g.table).data.data();
      plan.steps.push_back([=]() {
        for (int64_t r = 0; r < R; ++r) {
          float f = idx[r];
          int64_t row = int64_t(f);
          MP_USER_CHECK(float(row) == f && row >= 0 && row < rows, where, ": index ", f, " at row ", r,
                        " is out of range [0, ", rows, ") of '", tname, "'");
          if (q) {
            uint64_t rb = *quant::row_bytes(q->type, q->cols);
            quant::dequantize_row(q->type, static_cast<const uint8_t*>(q->data) + row * rb, out + r * Cc, Cc);
          } else {
            std::copy_n(table + row * Cc, Cc, out + r * Cc);
          }
        }
      });
      ++plan.stats.data_movement;
      return;
    }
    case ir::NodeKind::Scatter: {
      auto& s = n->cast<ir::Scatter>();
      if (weight(s.table->name)) return generic(n);
      const float* idx = data(s.index);
      const float* rowsv = data(s.rows);
      float* table = storage(s.table).data.data();
      int64_t R = s.index->shape[0], rows = s.table->shape[0], Cc = s.table->shape[1];
      std::string tname = s.table->name, where = s.where();
      plan.steps.push_back([=]() {
        for (int64_t r = 0; r < R; ++r) {
          float f = idx[r];
          int64_t row = int64_t(f);
          MP_USER_CHECK(float(row) == f && row >= 0 && row < rows, where, ": index ", f, " at row ", r,
                        " is out of range [0, ", rows, ") of '", tname, "'");
          std::copy_n(rowsv + r * Cc, Cc, table + row * Cc);
        }
      });
      ++plan.stats.data_movement;
      return;
    }
    case ir::NodeKind::Buffer: {
      auto& b = n->cast<ir::Buffer>();
      data(b.in);
      Buf alias = buf(b.in);
      alias.slot = -1;  // the operand's slot stays with the operand
      bufs[b.out->id] = alias;
      if (last_use.count(b.out->id) && last_use.count(b.in->id))
        last_use[b.in->id] = std::max(last_use[b.in->id], last_use[b.out->id]);
      ++plan.stats.data_movement;
      return;
    }
    case ir::NodeKind::MetaPipe:
      if (try_attention(n->cast<ir::MetaPipe>())) return;
      return generic(n);
  }
}

LlmEngine::LlmEngine(WeightBindings weights, int threads)
    : impl_(std::make_unique<Impl>(std::move(weights), threads)) {
  for (auto& [name, q] : impl_->weights) {
    MP_USER_CHECK(q.rows >= 1 && q.cols >= 1 && q.data, "weight '", name, "': empty binding");
    MP_USER_CHECK(quant::row_bytes(q.type, q.cols).has_value(), "weight '", name, "': a row of ", q.cols,
                  " elements is not a whole number of ", quant::to_string(q.type), " blocks");
  }
}
LlmEngine::~LlmEngine() = default;

int LlmEngine::threads() const { return impl_->pool.threads(); }

std::shared_ptr<LlmEngine::Plan> LlmEngine::plan(const ir::Program& p) {
  MP_USER_CHECK(!p.metapipelined, "engine: program '", p.name,
                "' is metapipelined; the engine takes the program before the passes");
  Impl& e = *impl_;
  auto plan = std::make_shared<Plan>();
  for (auto& t : p.tensors) {
    if (auto it = e.weights.find(t->name); it != e.weights.end()) {
      const QMatrix& q = it->second;
      ir::Shape want = t->shape.size() == 1 ? ir::Shape{1, t->shape[0]} : t->shape;
      MP_USER_CHECK(want == ir::Shape({q.rows, q.cols}), "weight '", t->name, "' is bound to ", q.rows, " x ",
                    q.cols, " ", quant::to_string(q.type), " but the program reads it as ",
                    ir::to_string(t->shape));
      MP_USER_CHECK(t->dtype == ir::DType::f32, "weight '", t->name,
                    "' must be an f32 tensor of the program");
      continue;
    }
    HostTensor fresh{t->shape, t->dtype, std::vector<float>(size_t(ir::num_elements(t->shape)), 0.f)};
    if (t->role != ir::TensorRole::InOut) {
      plan->mem.emplace(t->name, std::move(fresh));
      continue;
    }
    auto it = e.mem.find(t->name);
    if (it == e.mem.end()) {
      e.mem.emplace(t->name, std::move(fresh));
    } else {
      MP_USER_CHECK(it->second.shape == t->shape, "engine: tensor '", t->name, "' of program '", p.name,
                    "' is ", ir::to_string(t->shape), " but an earlier plan made it ",
                    ir::to_string(it->second.shape));
    }
  }
  Planner pl(e, *plan, p);
  pl.writes_at.resize(p.body.size());
  for (size_t i = 0; i < p.body.size(); ++i) {
    std::set<std::string> reads;
    node_tensors(p.body[i], reads, pl.writes_at[i]);
    for (auto& v : outer_operands(p.body[i])) pl.last_use[v->id] = i;
  }
  for (size_t i = 0; i < p.body.size(); ++i) {
    pl.compile(i, p.body[i]);
    // Values whose last use was this statement give their slot back.
    for (auto& v : outer_operands(p.body[i])) {
      if (pl.last_use[v->id] != i) continue;
      auto it = pl.bufs.find(v->id);
      if (it != pl.bufs.end() && it->second.slot >= 0) {
        pl.free_slots.push_back(it->second.slot);
        it->second.slot = -1;
      }
    }
  }
  return plan;
}

void LlmEngine::run(Plan& plan) {
  for (auto& s : plan.steps) s();
}

const PlanStats& LlmEngine::stats(const Plan& plan) const { return plan.stats; }

std::vector<float>& LlmEngine::tensor(const std::string& name) {
  auto it = impl_->mem.find(name);
  MP_USER_CHECK(it != impl_->mem.end() && !impl_->weights.count(name) && !impl_->dequantized.count(name),
                "engine: no state tensor '", name,
                "' (InOut tensors of a planned program; weights are read-only)");
  return it->second.data;
}
std::vector<float>& LlmEngine::tensor(Plan& plan, const std::string& name) {
  auto it = plan.mem.find(name);
  MP_USER_CHECK(it != plan.mem.end(), "engine: the plan has no tensor '", name, "'");
  return it->second.data;
}

int64_t LlmEngine::storage_bytes() const {
  int64_t b = 0;
  for (auto& [n, h] : impl_->mem) b += int64_t(h.data.size() * sizeof(float));
  return b;
}
int64_t LlmEngine::storage_bytes(const Plan& plan) const {
  int64_t b = 0;
  for (auto& [n, h] : plan.mem) b += int64_t(h.data.size() * sizeof(float));
  for (auto& s : plan.slots) b += int64_t(s->size() * sizeof(float));
  for (auto& s : plan.consts) b += int64_t(s->size() * sizeof(float));
  return b;
}

}  // namespace mp::cpu
