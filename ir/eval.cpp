// Evaluation of single pattern nodes on run-time tiles, shared by the CPU backends and the simulated
// accelerator's functional mode.
// Kept plain: loops over elements, fp64 accumulation, rounding to the tensor dtype on stores.
#include "ir/eval.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/random.h"

namespace mp::ir {

float round_to(ir::DType dt, float x) {
  if (dt == ir::DType::f32 || std::isnan(x) || std::isinf(x)) return x;
  if (dt == ir::DType::i32) return std::nearbyint(x);
  uint32_t u;
  std::memcpy(&u, &x, 4);
  int drop = dt == ir::DType::bf16 ? 16 : 13;  // f16: 10 mantissa bits (range not emulated)
  uint32_t half = 1u << (drop - 1), lsb = (u >> drop) & 1u;
  u = (u + half - 1 + lsb) & ~((1u << drop) - 1);  // round to nearest even
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

Memory make_memory(const ir::Program& p, const std::map<std::string, std::vector<float>>& inputs) {
  Memory m;
  for (auto& t : p.tensors) {
    HostTensor h{t->shape, t->dtype, std::vector<float>(size_t(ir::num_elements(t->shape)), std::nanf(""))};
    auto it = inputs.find(t->name);
    if (it != inputs.end()) {
      MP_USER_CHECK(it->second.size() == h.data.size(), "input '", t->name, "' has ", it->second.size(),
                    " values but the tensor ", ir::to_string(t->shape), " needs ", h.data.size());
      for (size_t i = 0; i < h.data.size(); ++i) h.data[i] = round_to(t->dtype, it->second[i]);
    } else {
      MP_USER_CHECK(t->role != ir::TensorRole::Input && t->role != ir::TensorRole::InOut, "input tensor '",
                    t->name, "' was not given a value");
    }
    m.emplace(t->name, std::move(h));
  }
  return m;
}

std::map<std::string, std::vector<float>> random_inputs(const ir::Program& p, uint64_t seed) {
  std::map<std::string, std::vector<float>> in;
  uint64_t k = 0;
  for (auto& t : p.tensors) {
    ++k;
    if (t->role != ir::TensorRole::Input && t->role != ir::TensorRole::InOut) continue;
    auto v = random_floats(size_t(ir::num_elements(t->shape)), seed * 1000003 + k);
    for (auto& x : v) x = round_to(t->dtype, x);
    in[t->name] = std::move(v);
  }
  return in;
}

TileRef Env::get(const ir::Value& v) const {
  for (const Env* e = this; e; e = e->parent_) {
    auto it = e->vals_.find(v->id);
    if (it != e->vals_.end()) return it->second;
  }
  fail_internal("value %", v->id, " has no run-time tile (used before definition?)");
}
int64_t Env::loop(const ir::LoopVar& var) const {
  for (const Env* e = this; e; e = e->parent_) {
    auto it = e->loops_.find(var->id);
    if (it != e->loops_.end()) return it->second;
  }
  fail_internal("loop variable ", var->name, " is not bound");
}
int64_t Env::eval(const ir::Affine& a) const {
  int64_t r = a.constant;
  for (auto& [v, c] : a.terms) r += c * loop(v);
  return r;
}

namespace {

// Row-major strides of a shape.
std::vector<int64_t> strides(const ir::Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int a = int(s.size()) - 2; a >= 0; --a) st[a] = st[a + 1] * s[a + 1];
  return st;
}


// The part of a tile at `start` that lies inside `dims` (masked tiles are cut; unmasked ones must fit).
ir::Shape clipped(const ir::Node& n, const ir::Shape& tile, const std::vector<int64_t>& start,
                  const ir::Shape& dims, bool masked, const std::string& tensor) {
  ir::Shape s = tile;
  for (size_t a = 0; a < s.size(); ++a) {
    int64_t room = dims[a] - start[a];
    if (room < s[a]) {
      MP_USER_CHECK(masked && room > 0, n.where(), " accesses ", tensor, " axis ", a, " at ", start[a], "..",
                    start[a] + tile[a], " beyond its extent ", dims[a], " (out of bounds)");
      s[a] = room;
    }
  }
  return s;
}

TileRef load(const ir::LoadTile& l, const Env& env, Memory& mem) {
  auto& h = mem.at(l.src->name);
  std::vector<int64_t> start;
  for (auto& o : l.offset) start.push_back(env.eval(o));
  auto t = std::make_shared<Tile>();
  t->shape = clipped(l, l.out->shape, start, h.shape, l.masked, l.src->name);
  t->origin = start;
  t->data.resize(size_t(ir::num_elements(t->shape)));
  auto st = strides(h.shape);
  for_each_index(t->shape, [&](int64_t flat, const std::vector<int64_t>& idx) {
    int64_t g = 0;
    for (size_t a = 0; a < idx.size(); ++a) g += (start[a] + idx[a]) * st[a];
    t->data[flat] = h.data[g];
  });
  return t;
}

void store(const ir::StoreTile& s, const Env& env, Memory& mem) {
  auto& h = mem.at(s.dst->name);
  auto in = env.get(s.in);
  std::vector<int64_t> start;
  for (auto& o : s.offset) start.push_back(env.eval(o));
  auto shape = clipped(s, in->shape, start, h.shape, s.masked, s.dst->name);
  auto st = strides(h.shape), ist = strides(in->shape);
  for_each_index(shape, [&](int64_t, const std::vector<int64_t>& idx) {
    int64_t g = 0, l = 0;
    for (size_t a = 0; a < idx.size(); ++a) g += (start[a] + idx[a]) * st[a], l += idx[a] * ist[a];
    h.data[g] = round_to(h.dtype, in->data[l]);
  });
}

// Elementwise with broadcasting over operands (Map, Zip, Fill).
TileRef elementwise(const ir::Node& n, const std::vector<TileRef>& ins, const std::vector<ir::Value>& irs,
                    const ir::Expr& f, const Env& env) {
  const ir::Shape& nominal = n.out->shape;
  auto t = std::make_shared<Tile>();
  t->shape = nominal;
  t->origin.assign(nominal.size(), 0);
  // A masked (partial) tile meets full-size ones (e.g. a Fill-initialized accumulator): the result covers
  // the smallest run-time extent among the operands that are not broadcast on that axis.
  for (size_t a = 0; a < nominal.size(); ++a) {
    bool first = true;
    for (size_t i = 0; i < ins.size(); ++i)
      if (irs[i]->shape[a] == nominal[a]) {
        if (first) t->origin[a] = ins[i]->origin[a];
        t->shape[a] = first ? ins[i]->shape[a] : std::min(t->shape[a], ins[i]->shape[a]);
        first = false;
      }
  }
  if (ins.empty()) {
    for (size_t a = 0; a < nominal.size(); ++a)
      t->origin[a] = a < n.out->origin.size() ? env.eval(n.out->origin[a]) : 0;
  }
  std::vector<std::vector<int64_t>> ist;
  for (auto& in : ins) ist.push_back(strides(in->shape));
  t->data.resize(size_t(ir::num_elements(t->shape)));
  ir::ExprEval ev(f);
  std::vector<double> args(ins.size());
  std::vector<int64_t> gidx(nominal.size());
  for_each_index(t->shape, [&](int64_t flat, const std::vector<int64_t>& idx) {
    for (size_t i = 0; i < ins.size(); ++i) {
      int64_t l = 0;
      for (size_t a = 0; a < idx.size(); ++a) l += (irs[i]->shape[a] == 1 ? 0 : idx[a]) * ist[i][a];
      args[i] = ins[i]->data[l];
    }
    for (size_t a = 0; a < idx.size(); ++a) gidx[a] = t->origin[a] + idx[a];
    t->data[flat] = round_to(n.out->dtype, float(ev(args, gidx)));
  });
  return t;
}

TileRef reduce(const ir::Reduce& r, const Env& env) {
  auto in = env.get(r.in);
  auto t = std::make_shared<Tile>();
  t->shape = in->shape;
  t->shape[r.axis] = 1;
  t->origin = in->origin;
  t->origin[r.axis] = 0;
  int64_t n_out = ir::num_elements(t->shape);
  std::vector<double> acc(size_t(n_out), r.identity);
  std::optional<ir::ExprEval> comb, pre;
  if (r.custom) comb.emplace(*r.custom);
  if (r.pre) pre.emplace(*r.pre);
  auto ost = strides(t->shape);
  std::vector<int64_t> gidx(in->shape.size());
  for_each_index(in->shape, [&](int64_t flat, const std::vector<int64_t>& idx) {
    int64_t o = 0;
    for (size_t a = 0; a < idx.size(); ++a) o += (int(a) == r.axis ? 0 : idx[a]) * ost[a];
    double x = in->data[flat];
    if (pre) {
      for (size_t a = 0; a < idx.size(); ++a) gidx[a] = in->origin[a] + idx[a];
      double arg[1] = {x};
      x = (*pre)(arg, gidx);
    }
    double& a = acc[o];
    switch (r.combiner) {
      case ir::Combiner::Add:
        a += x;
        break;
      case ir::Combiner::Mul:
        a *= x;
        break;
      case ir::Combiner::Max:
        a = std::max(a, x);
        break;
      case ir::Combiner::Min:
        a = std::min(a, x);
        break;
      case ir::Combiner::Custom: {
        double args[2] = {a, x};
        a = (*comb)(args, gidx);
        break;
      }
    }
  });
  t->data.resize(size_t(n_out));
  for (int64_t i = 0; i < n_out; ++i) t->data[i] = float(acc[i]);
  return t;
}

TileRef matmul(const ir::MatMul& m, const Env& env) {
  auto a = env.get(m.a), b = env.get(m.b);
  int64_t M = a->shape[m.transpose_a ? 1 : 0], K = a->shape[m.transpose_a ? 0 : 1];
  int64_t Kb = b->shape[m.transpose_b ? 1 : 0], N = b->shape[m.transpose_b ? 0 : 1];
  MP_INTERNAL_CHECK(K == Kb, m.where(), ": run-time inner extents differ (", K, " vs ", Kb,
                    "): the operands' masked tiles disagree");
  auto t = std::make_shared<Tile>();
  t->shape = {M, N};
  t->origin = {a->origin[m.transpose_a ? 1 : 0], b->origin[m.transpose_b ? 0 : 1]};
  t->data.assign(size_t(M * N), 0.f);
  auto A = [&](int64_t i, int64_t k) {
    return double(m.transpose_a ? a->data[k * M + i] : a->data[i * K + k]);
  };
  auto B = [&](int64_t k, int64_t j) {
    return double(m.transpose_b ? b->data[j * K + k] : b->data[k * N + j]);
  };
  std::vector<double> row(static_cast<size_t>(N));
  for (int64_t i = 0; i < M; ++i) {
    std::fill(row.begin(), row.end(), 0.0);
    for (int64_t k = 0; k < K; ++k) {
      double x = A(i, k);
      if (!m.transpose_b) {
        const float* br = &b->data[k * N];
        for (int64_t j = 0; j < N; ++j) row[j] += x * br[j];
      } else {
        for (int64_t j = 0; j < N; ++j) row[j] += x * B(k, j);
      }
    }
    for (int64_t j = 0; j < N; ++j) t->data[i * N + j] = float(row[j]);
  }
  return t;
}

int64_t index_at(const ir::Node& n, const Tile& idx, int64_t r, const ir::Tensor& table) {
  float f = idx.data[r];
  int64_t i = int64_t(f);
  MP_USER_CHECK(float(i) == f && i >= 0 && i < table->shape[0], n.where(), ": index ", f, " at row ", r,
                " is out of range [0, ", table->shape[0], ") of '", table->name, "'");
  return i;
}

TileRef gather(const ir::Gather& g, const Env& env, Memory& mem) {
  auto idx = env.get(g.index);
  auto& h = mem.at(g.table->name);
  int64_t n = idx->shape[0], C = h.shape[1];
  auto t = std::make_shared<Tile>();
  t->shape = {n, C};
  t->origin = {idx->origin[0], 0};
  t->data.resize(size_t(n * C));
  for (int64_t r = 0; r < n; ++r) {
    int64_t row = index_at(g, *idx, r, g.table);
    std::copy_n(&h.data[row * C], C, &t->data[r * C]);
  }
  return t;
}

void scatter(const ir::Scatter& s, const Env& env, Memory& mem) {
  auto idx = env.get(s.index), rows = env.get(s.rows);
  auto& h = mem.at(s.table->name);
  int64_t n = idx->shape[0], C = h.shape[1];
  MP_INTERNAL_CHECK(rows->shape[0] == n && rows->shape[1] == C, s.where(), ": run-time shapes differ");
  for (int64_t r = 0; r < n; ++r) {
    int64_t row = index_at(s, *idx, r, s.table);
    for (int64_t c = 0; c < C; ++c) h.data[row * C + c] = round_to(h.dtype, rows->data[r * C + c]);
  }
}

}  // namespace

TileRef eval_node(const ir::Node& n, const Env& env, Memory& mem) {
  switch (n.kind) {
    case ir::NodeKind::Fill:
      return elementwise(n, {}, {}, n.cast<ir::Fill>().f, env);
    case ir::NodeKind::LoadTile:
      return load(n.cast<ir::LoadTile>(), env, mem);
    case ir::NodeKind::StoreTile:
      store(n.cast<ir::StoreTile>(), env, mem);
      return nullptr;
    case ir::NodeKind::Map: {
      auto& m = n.cast<ir::Map>();
      return elementwise(n, {env.get(m.in)}, {m.in}, m.f, env);
    }
    case ir::NodeKind::Zip: {
      auto& z = n.cast<ir::Zip>();
      std::vector<TileRef> ins;
      for (auto& v : z.ins) ins.push_back(env.get(v));
      return elementwise(n, ins, z.ins, z.f, env);
    }
    case ir::NodeKind::Reduce:
      return reduce(n.cast<ir::Reduce>(), env);
    case ir::NodeKind::MatMul:
      return matmul(n.cast<ir::MatMul>(), env);
    case ir::NodeKind::Gather:
      return gather(n.cast<ir::Gather>(), env, mem);
    case ir::NodeKind::Scatter:
      scatter(n.cast<ir::Scatter>(), env, mem);
      return nullptr;
    case ir::NodeKind::Buffer:
      return env.get(n.cast<ir::Buffer>().in);
    case ir::NodeKind::MetaPipe:
      fail_internal("eval_node: a MetaPipe is scheduled by the backend that runs the program");
  }
  fail_internal("eval_node: unknown node kind");
}

}  // namespace mp::ir
