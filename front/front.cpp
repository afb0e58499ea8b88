// The front end's builder: a thread-local current program, scopes for METAPIPE bodies, implicit tile
// offsets, and the pattern functions that call the IR's checking factories.
#include "front/front.h"

namespace mp::front {

static thread_local ProgramBuilder* g_current = nullptr;

ProgramBuilder::ProgramBuilder(std::string name) : prev_(g_current) {
  p_.name = std::move(name);
  scopes_.push_back(&p_.body);
  g_current = this;
}
ProgramBuilder::~ProgramBuilder() { g_current = prev_; }

ProgramBuilder& ProgramBuilder::current() {
  if (!g_current)
    fail_user("a pattern (LOAD_TILE, MAP, METAPIPE, ...) was used with no ProgramBuilder active");
  return *g_current;
}

Tensor ProgramBuilder::input(std::string name, Shape shape, DType dt) {
  return p_.add_tensor(std::move(name), std::move(shape), dt, ir::TensorRole::Input);
}
Tensor ProgramBuilder::output(std::string name, Shape shape, DType dt) {
  return p_.add_tensor(std::move(name), std::move(shape), dt, ir::TensorRole::Output);
}
Tensor ProgramBuilder::inout(std::string name, Shape shape, DType dt) {
  return p_.add_tensor(std::move(name), std::move(shape), dt, ir::TensorRole::InOut);
}
Tensor ProgramBuilder::temp(std::string name, Shape shape, DType dt) {
  return p_.add_tensor(std::move(name), std::move(shape), dt, ir::TensorRole::Temp);
}

ir::Program ProgramBuilder::finish() {
  MP_INTERNAL_CHECK(!finished_, "ProgramBuilder::finish called twice");
  MP_USER_CHECK(scopes_.size() == 1, "program '", p_.name, "': finish() called inside a METAPIPE body");
  finished_ = true;
  return std::move(p_);
}

void ProgramBuilder::emit(ir::NodeRef n) { scopes_.back()->push_back(std::move(n)); }

std::vector<ir::Affine> ProgramBuilder::implicit_offsets(const Tensor& t, const Shape& tile,
                                                         const char* what) {
  std::vector<int> split;
  for (size_t a = 0; a < tile.size() && a < t->shape.size(); ++a)
    if (tile[a] < t->shape[a]) split.push_back(int(a));
  std::vector<ir::Affine> off(t->shape.size());
  MP_USER_CHECK(split.size() <= loops_.size(), what, " of '", t->name, "' ", ir::to_string(t->shape),
                " with tile ", ir::to_string(tile), " splits ", split.size(), " axes but only ",
                loops_.size(), " METAPIPE loops enclose it; add loops or give offsets with at(...)");
  size_t first = loops_.size() - split.size();
  for (size_t j = 0; j < split.size(); ++j) {
    int a = split[j];
    const auto& var = loops_[first + j];
    int64_t tiles_floor = t->shape[a] / tile[a], tiles_ceil = cdiv(t->shape[a], tile[a]);
    MP_USER_CHECK(var->trip == tiles_floor || var->trip == tiles_ceil, what, " of '", t->name, "' axis ", a,
                  " (extent ", t->shape[a], ", tile ", tile[a], ": ", tiles_ceil,
                  " tiles) is bound to METAPIPE ", var->name, " of ", var->trip,
                  " iterations; make them match or give offsets with at(...)");
    off[a] = ir::Affine::var(var, tile[a]);
  }
  return off;
}

void ProgramBuilder::metapipe(int64_t trip, const std::function<void(Idx)>& body) {
  MP_USER_CHECK(trip >= 1, "METAPIPE(", trip,
                ", ...): the trip count must be >= 1 (tile larger than the extent?)");
  auto m = p_.new_node<ir::MetaPipe>();
  m->var = p_.new_loop_var(trip);
  m->stages.push_back({"body", {}, {}});
  scopes_.push_back(&m->stages[0].ops);
  loops_.push_back(m->var);
  try {
    body(Idx{m->var});
  } catch (...) {
    scopes_.pop_back();
    loops_.pop_back();
    throw;
  }
  scopes_.pop_back();
  loops_.pop_back();
  emit(m);
}

std::vector<Value> ProgramBuilder::metapipe_fold(
    int64_t trip, const std::vector<Value>& init,
    const std::function<std::vector<Value>(Idx, const std::vector<Value>&)>& body) {
  MP_USER_CHECK(trip >= 1, "METAPIPE_FOLD(", trip, ", ...): the trip count must be >= 1");
  auto m = p_.new_node<ir::MetaPipe>();
  m->var = p_.new_loop_var(trip);
  m->stages.push_back({"body", {}, {}});
  std::vector<Value> args;
  for (auto& v : init) {
    ir::Carried c;
    c.init = v;
    c.arg = p_.new_value(v->shape, v->dtype, v->origin);
    args.push_back(c.arg);
    m->carried.push_back(c);
  }
  scopes_.push_back(&m->stages[0].ops);
  loops_.push_back(m->var);
  std::vector<Value> next;
  try {
    next = body(Idx{m->var}, args);
  } catch (...) {
    scopes_.pop_back();
    loops_.pop_back();
    throw;
  }
  scopes_.pop_back();
  loops_.pop_back();
  MP_USER_CHECK(next.size() == init.size(), m->where(), ": METAPIPE_FOLD body returns ", next.size(),
                " values for ", init.size(), " carried values");
  std::vector<Value> results;
  for (size_t i = 0; i < next.size(); ++i) {
    MP_USER_CHECK(next[i]->shape == init[i]->shape, m->where(), ": carried value ", i, " starts as ",
                  ir::to_string(init[i]->shape), " but the body returns ", ir::to_string(next[i]->shape),
                  "; return the same shape");
    m->carried[i].next = next[i];
    m->carried[i].result = p_.new_value(init[i]->shape, init[i]->dtype, init[i]->origin);
    results.push_back(m->carried[i].result);
  }
  emit(m);
  return results;
}

std::vector<Value> METAPIPE_FOLD(
    int64_t trip, const std::vector<Value>& init,
    const std::function<std::vector<Value>(Idx, const std::vector<Value>&)>& body) {
  return ProgramBuilder::current().metapipe_fold(trip, init, body);
}

static void set_name(const Value& v, const std::string& name) {
  // The value was created by this call and is not shared yet; naming it is printing-only.
  if (!name.empty()) const_cast<ir::ValueInfo&>(*v).name = name;
}

namespace detail {
Value load_tile(const Tensor& t, const Shape& tile, const TileOpts& o) {
  auto& b = ProgramBuilder::current();
  auto off = o.has_offset ? o.offset : b.implicit_offsets(t, tile, "LOAD_TILE");
  auto n = ir::make_load(b.program(), t, tile, off, o.masked, o.row_par);
  set_name(n->out, o.name);
  b.emit(n);
  return n->out;
}
void store_tile(const Tensor& t, const Value& v, const TileOpts& o) {
  auto& b = ProgramBuilder::current();
  auto off = o.has_offset ? o.offset : b.implicit_offsets(t, v->shape, "STORE_TILE");
  b.emit(ir::make_store(b.program(), t, v, off, o.masked));
}
Value buffer(const Value& v, const TileOpts& o) {
  auto& b = ProgramBuilder::current();
  auto n = ir::make_buffer(b.program(), v, o.depth);
  set_name(n->out, o.name);
  b.emit(n);
  return n->out;
}
}  // namespace detail

Value LOAD(const Tensor& t) {
  detail::TileOpts o;
  o.offset.assign(t->shape.size(), ir::Affine(0));
  o.has_offset = true;
  return detail::load_tile(t, t->shape, o);
}
void STORE(const Tensor& t, const Value& v) {
  MP_USER_CHECK(v->shape == t->shape, "STORE(", t->name, ", value): shape mismatch: the value is ",
                ir::to_string(v->shape), " but '", t->name, "' is ", ir::to_string(t->shape),
                "; store a value of the tensor's shape (or use STORE_TILE)");
  detail::TileOpts o;
  o.offset.assign(t->shape.size(), ir::Affine(0));
  o.has_offset = true;
  detail::store_tile(t, v, o);
}

template <class N>
static Value emit_out(std::shared_ptr<N> n) {
  ProgramBuilder::current().emit(n);
  return n->out;
}

Value MAT_MUL(const Value& a, const Value& b) {
  return emit_out(ir::make_matmul(ProgramBuilder::current().program(), a, b, false, false));
}
Value MAT_MUL(const Value& a, const Value& b, TransposeB) {
  return emit_out(ir::make_matmul(ProgramBuilder::current().program(), a, b, false, true));
}
Value MAT_MUL(const Value& a, const Value& b, TransposeA) {
  return emit_out(ir::make_matmul(ProgramBuilder::current().program(), a, b, true, false));
}

static DType result_dtype(const Value& v) { return v->dtype == DType::i32 ? DType::f32 : v->dtype; }

Value MAP(const Value& v, const std::function<Expr(Expr)>& f) {
  return emit_out(ir::make_map(ProgramBuilder::current().program(), v, f(Expr::arg(0)), result_dtype(v)));
}
Value ZIP(const Value& a, const Value& b, const std::function<Expr(Expr, Expr)>& f) {
  return emit_out(ir::make_zip(ProgramBuilder::current().program(), {a, b}, f(Expr::arg(0), Expr::arg(1)),
                               result_dtype(a)));
}
Value ZIP(const Value& a, const Value& b, const Value& c, const std::function<Expr(Expr, Expr, Expr)>& f) {
  return emit_out(ir::make_zip(ProgramBuilder::current().program(), {a, b, c},
                               f(Expr::arg(0), Expr::arg(1), Expr::arg(2)), result_dtype(a)));
}
Value ZIP(const std::vector<Value>& ins, const std::function<Expr(const std::vector<Expr>&)>& f) {
  std::vector<Expr> args;
  for (size_t i = 0; i < ins.size(); ++i) args.push_back(Expr::arg(int(i)));
  MP_USER_CHECK(!ins.empty(), "ZIP needs at least one operand");
  return emit_out(ir::make_zip(ProgramBuilder::current().program(), ins, f(args), result_dtype(ins[0])));
}
Value FILL(const Shape& shape, const Expr& f, DType dt) {
  return emit_out(ir::make_fill(ProgramBuilder::current().program(), shape, dt, f));
}
Value REDUCE(const Value& v, int axis, Combiner c) {
  return emit_out(ir::make_reduce(ProgramBuilder::current().program(), v, axis, c));
}
Value REDUCE(const Value& v, int axis, const std::function<Expr(Expr, Expr)>& combine, double identity) {
  return emit_out(ir::make_reduce(ProgramBuilder::current().program(), v, axis, Combiner::Custom,
                                  combine(Expr::arg(0), Expr::arg(1)), identity));
}
Value GATHER(const Tensor& table, const Value& index) {
  return emit_out(ir::make_gather(ProgramBuilder::current().program(), table, index));
}
void SCATTER(const Tensor& table, const Value& index, const Value& rows) {
  ProgramBuilder::current().emit(ir::make_scatter(ProgramBuilder::current().program(), table, index, rows));
}

}  // namespace mp::front
