// IR basics: types, affine offsets, the checking factories of each node, Program copies.
#include "ir/ir.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace mp::ir {

const char* to_string(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
  }
  return "?";
}
int64_t bytes_of(DType t) { return t == DType::bf16 || t == DType::f16 ? 2 : 4; }
DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::f32;
  if (s == "bf16") return DType::bf16;
  if (s == "f16") return DType::f16;
  if (s == "i32") return DType::i32;
  fail_user("unknown dtype '", s, "' (expected f32, bf16, f16 or i32)");
}
const char* to_string(TensorRole r) {
  switch (r) {
    case TensorRole::Input:
      return "input";
    case TensorRole::Output:
      return "output";
    case TensorRole::InOut:
      return "inout";
    case TensorRole::Temp:
      return "temp";
  }
  return "?";
}
std::string to_string(const Shape& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}
int64_t num_elements(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}
const char* to_string(NodeKind k) {
  switch (k) {
#define MP_NODE_NAME(n) \
  case NodeKind::n:     \
    return #n;
    MP_FOR_EACH_NODE(MP_NODE_NAME)
#undef MP_NODE_NAME
  }
  return "?";
}
const char* to_string(Combiner c) {
  switch (c) {
    case Combiner::Add:
      return "add";
    case Combiner::Max:
      return "max";
    case Combiner::Min:
      return "min";
    case Combiner::Mul:
      return "mul";
    case Combiner::Custom:
      return "custom";
  }
  return "?";
}

std::string Node::where() const { return std::string(to_string(kind)) + " #" + std::to_string(id); }

// ---------------------------------------------------------------------------------------------------
// Affine

Affine Affine::var(const LoopVar& v, int64_t coef) {
  Affine a;
  if (coef != 0) a.terms.push_back({v, coef});
  return a;
}
int64_t Affine::max_value() const {
  int64_t m = constant;
  for (auto& [v, c] : terms) m += c > 0 ? c * (v->trip - 1) : 0;
  return m;
}
int64_t Affine::min_value() const {
  int64_t m = constant;
  for (auto& [v, c] : terms) m += c < 0 ? c * (v->trip - 1) : 0;
  return m;
}
int64_t Affine::coef_of(const LoopVar& v) const {
  for (auto& [w, c] : terms)
    if (w->id == v->id) return c;
  return 0;
}
std::string Affine::str() const {
  std::string o;
  for (auto& [v, c] : terms) {
    if (!o.empty()) o += " + ";
    o += (c == 1 ? "" : std::to_string(c) + "*") + v->name;
  }
  if (o.empty()) return std::to_string(constant);
  if (constant) o += " + " + std::to_string(constant);
  return o;
}
Affine operator+(const Affine& a, const Affine& b) {
  Affine r = a;
  r.constant += b.constant;
  for (auto& [v, c] : b.terms) {
    bool found = false;
    for (auto& t : r.terms)
      if (t.first->id == v->id) t.second += c, found = true;
    if (!found) r.terms.push_back({v, c});
  }
  std::erase_if(r.terms, [](auto& t) { return t.second == 0; });
  return r;
}
Affine operator*(const Affine& a, int64_t k) {
  Affine r = a;
  r.constant *= k;
  for (auto& t : r.terms) t.second *= k;
  std::erase_if(r.terms, [](auto& t) { return t.second == 0; });
  return r;
}

// ---------------------------------------------------------------------------------------------------
// Work

Work& Work::operator+=(const Work& o) {
  flops += o.flops;
  elem_ops += o.elem_ops;
  load_bytes += o.load_bytes;
  store_bytes += o.store_bytes;
  accesses.insert(accesses.end(), o.accesses.begin(), o.accesses.end());
  return *this;
}
Work Work::scaled(int64_t k) const {
  Work w = *this;
  w.flops *= double(k);
  w.elem_ops *= k;
  w.load_bytes *= k;
  w.store_bytes *= k;
  for (auto& a : w.accesses) a.bytes *= k, a.runs *= k;
  return w;
}

// ---------------------------------------------------------------------------------------------------
// MetaPipe

MetaPipe::MetaPipe(const MetaPipe& o)
    : Node(o),
      var(o.var),
      masked(o.masked),
      carried(o.carried),
      stages(o.stages),
      buffers(o.buffers),
      scheduled(o.scheduled) {
  for (auto& s : stages)
    for (auto& n : s.ops) n = n->clone();
}
std::vector<Value> MetaPipe::operands() const {
  std::vector<Value> v;
  for (auto& c : carried) v.push_back(c.init);
  return v;
}
std::vector<NodeRef> MetaPipe::body() const {
  std::vector<NodeRef> v;
  for (auto& s : stages) v.insert(v.end(), s.ops.begin(), s.ops.end());
  return v;
}
std::vector<std::pair<int, int>> MetaPipe::edges() const {
  std::set<std::pair<int, int>> e;
  for (auto& b : buffers)
    if (b.kind == BufferInfo::Kind::Stream)
      for (int c : b.consumers) e.insert({b.producer, c});
  return {e.begin(), e.end()};
}

// ---------------------------------------------------------------------------------------------------
// Program

Program Program::clone() const {
  Program p = *this;
  for (auto& n : p.body) n = n->clone();
  return p;
}
Tensor Program::tensor(const std::string& n) const {
  std::string names;
  for (auto& t : tensors) {
    if (t->name == n) return t;
    names += (names.empty() ? "" : ", ") + t->name;
  }
  fail_user("program '", name, "' has no tensor '", n, "' (its tensors: ", names, ")");
}
Value Program::new_value(Shape shape, DType dt, std::vector<Affine> origin, std::string nm) {
  auto v = std::make_shared<ValueInfo>();
  v->id = next_id++;
  v->name = std::move(nm);
  origin.resize(shape.size());
  v->shape = std::move(shape);
  v->dtype = dt;
  v->origin = std::move(origin);
  return v;
}
LoopVar Program::new_loop_var(int64_t trip, std::string nm) {
  auto v = std::make_shared<LoopVarInfo>();
  v->id = next_id++;
  v->name = nm.empty() ? "i" + std::to_string(v->id) : std::move(nm);
  v->trip = trip;
  return v;
}
Tensor Program::add_tensor(std::string nm, Shape shape, DType dt, TensorRole role) {
  for (auto& t : tensors)
    MP_USER_CHECK(t->name != nm, "program '", name, "': tensor '", nm, "' declared twice");
  for (auto d : shape)
    MP_USER_CHECK(d > 0, "tensor '", nm, "' has shape ", to_string(shape), ": every extent must be > 0");
  auto t = std::make_shared<TensorInfo>();
  t->id = next_id++;
  t->name = std::move(nm);
  t->shape = std::move(shape);
  t->dtype = dt;
  t->role = role;
  tensors.push_back(t);
  return t;
}

// ---------------------------------------------------------------------------------------------------
// Checking factories

std::shared_ptr<Fill> make_fill(Program& p, Shape shape, DType dt, Expr f, std::vector<Affine> origin) {
  auto n = p.new_node<Fill>();
  MP_USER_CHECK(f.max_arg() < 0, n->where(),
                ": a Fill's function may use only index(axis) and constants, not ", f.str());
  MP_USER_CHECK(f.max_index_axis() < int(shape.size()), n->where(), ": function ", f.str(),
                " uses an axis beyond rank ", shape.size());
  n->f = std::move(f);
  n->out = p.new_value(std::move(shape), dt, std::move(origin));
  return n;
}

static void check_tile(const Node& n, const Tensor& t, const Shape& tile, const std::vector<Affine>& offset,
                       const char* what) {
  MP_USER_CHECK(tile.size() == t->shape.size(), n.where(), ": ", what, " of tensor '", t->name, "' ",
                to_string(t->shape), " has tile shape ", to_string(tile), " of rank ", tile.size(),
                "; give one extent per axis (rank ", t->shape.size(), ")");
  MP_USER_CHECK(offset.size() == t->shape.size(), n.where(), ": ", what, " of '", t->name, "' needs ",
                t->shape.size(), " offsets, got ", offset.size());
  for (size_t a = 0; a < tile.size(); ++a) {
    MP_USER_CHECK(tile[a] > 0 && tile[a] <= t->shape[a], n.where(), ": ", what, " of '", t->name, "' ",
                  to_string(t->shape), ": tile ", to_string(tile), " axis ", a, " extent ", tile[a],
                  " must be in [1, ", t->shape[a], "]");
    MP_USER_CHECK(offset[a].min_value() >= 0, n.where(), ": ", what, " of '", t->name, "' axis ", a,
                  " offset ", offset[a].str(), " can be negative");
  }
}

std::shared_ptr<LoadTile> make_load(Program& p, const Tensor& src, Shape tile, std::vector<Affine> offset,
                                    bool masked, int row_par) {
  auto n = p.new_node<LoadTile>();
  check_tile(*n, src, tile, offset, "LOAD_TILE");
  MP_USER_CHECK(row_par >= 1, n->where(), ": row_par=", row_par, " must be >= 1");
  row_par = int(std::min<int64_t>(row_par, tile[0]));  // a hint: at most one stream per row
  n->src = src;
  n->offset = offset;
  n->masked = masked;
  n->row_par = row_par;
  n->out = p.new_value(std::move(tile), src->dtype, std::move(offset));
  return n;
}

std::shared_ptr<StoreTile> make_store(Program& p, const Tensor& dst, const Value& in,
                                      std::vector<Affine> offset, bool masked) {
  auto n = p.new_node<StoreTile>();
  MP_USER_CHECK(dst->role != TensorRole::Input, n->where(), ": STORE_TILE into '", dst->name,
                "', an input tensor; declare it as an output (or inout)");
  check_tile(*n, dst, in->shape, offset, "STORE_TILE");
  n->dst = dst;
  n->in = in;
  n->offset = std::move(offset);
  n->masked = masked;
  return n;
}

std::shared_ptr<Map> make_map(Program& p, const Value& in, Expr f, DType dt) {
  auto n = p.new_node<Map>();
  MP_USER_CHECK(f.max_arg() <= 0, n->where(), ": a Map's function takes one argument, ", f.str(),
                " uses more");
  MP_USER_CHECK(f.max_index_axis() < int(in->shape.size()), n->where(), ": function ", f.str(),
                " uses an axis beyond rank ", in->shape.size());
  n->in = in;
  n->f = std::move(f);
  n->out = p.new_value(in->shape, dt, in->origin);
  return n;
}

Shape broadcast_shapes(const std::vector<Value>& ins, const std::string& where) {
  MP_USER_CHECK(!ins.empty(), where, ": a Zip needs at least one operand");
  size_t rank = ins[0]->shape.size();
  Shape out(rank, 1);
  for (size_t i = 0; i < ins.size(); ++i) {
    MP_USER_CHECK(ins[i]->shape.size() == rank, where, ": operand ", i, " has shape ",
                  to_string(ins[i]->shape), " but operand 0 has ", to_string(ins[0]->shape),
                  "; give them the same rank (Reduce keeps the reduced axis with extent 1)");
    for (size_t a = 0; a < rank; ++a) {
      int64_t d = ins[i]->shape[a];
      if (d == 1 || d == out[a]) continue;
      MP_USER_CHECK(out[a] == 1, where, ": shape mismatch on axis ", a, ": operand ", i, " is ",
                    to_string(ins[i]->shape), " but an earlier operand has extent ", out[a],
                    "; extents must be equal or 1 (broadcast)");
      out[a] = d;
    }
  }
  return out;
}

std::shared_ptr<Zip> make_zip(Program& p, std::vector<Value> ins, Expr f, DType dt) {
  auto n = p.new_node<Zip>();
  Shape out = broadcast_shapes(ins, n->where());
  MP_USER_CHECK(f.max_arg() < int(ins.size()), n->where(), ": function ", f.str(), " uses argument ",
                f.max_arg(), " but the Zip has ", ins.size(), " operands");
  MP_USER_CHECK(f.max_index_axis() < int(out.size()), n->where(), ": function ", f.str(),
                " uses an axis beyond rank ", out.size());
  std::vector<Affine> origin(out.size());
  for (size_t a = 0; a < out.size(); ++a)
    for (auto& v : ins)
      if (v->shape[a] == out[a]) {
        origin[a] = v->origin[a];
        break;
      }
  n->ins = std::move(ins);
  n->f = std::move(f);
  n->out = p.new_value(std::move(out), dt, std::move(origin));
  return n;
}

std::shared_ptr<Reduce> make_reduce(Program& p, const Value& in, int axis, Combiner c,
                                    std::optional<Expr> custom, double identity) {
  auto n = p.new_node<Reduce>();
  int rank = int(in->shape.size());
  MP_USER_CHECK(axis >= 0 && axis < rank, n->where(), ": Reduce over axis ", axis, " of a value of shape ",
                to_string(in->shape), ", which has only axes 0..", rank - 1, "; pick an existing axis");
  MP_USER_CHECK(c != Combiner::Custom || custom, n->where(), ": a custom combiner needs its function");
  n->in = in;
  n->axis = axis;
  n->combiner = c;
  n->custom = std::move(custom);
  switch (c) {
    case Combiner::Add:
      identity = 0;
      break;
    case Combiner::Mul:
      identity = 1;
      break;
    case Combiner::Max:
      identity = -INFINITY;
      break;
    case Combiner::Min:
      identity = INFINITY;
      break;
    case Combiner::Custom:
      break;
  }
  n->identity = identity;
  Shape s = in->shape;
  s[axis] = 1;
  auto origin = in->origin;
  origin[axis] = 0;
  n->out = p.new_value(std::move(s), in->dtype == DType::i32 ? DType::i32 : DType::f32, std::move(origin));
  return n;
}

std::shared_ptr<MatMul> make_matmul(Program& p, const Value& a, const Value& b, bool ta, bool tb) {
  auto n = p.new_node<MatMul>();
  MP_USER_CHECK(a->shape.size() == 2 && b->shape.size() == 2, n->where(), ": MatMul needs 2-D operands, got ",
                to_string(a->shape), " and ", to_string(b->shape));
  int64_t M = a->shape[ta ? 1 : 0], K = a->shape[ta ? 0 : 1];
  int64_t Kb = b->shape[tb ? 1 : 0], N = b->shape[tb ? 0 : 1];
  MP_USER_CHECK(K == Kb, n->where(), ": shape mismatch: a", ta ? "^T" : "", " is ", to_string(a->shape),
                " (K=", K, ") but b", tb ? "^T" : "", " is ", to_string(b->shape), " (K=", Kb,
                "); make the inner dimensions equal (load b with ", K, tb ? " columns" : " rows",
                " or transpose an operand)");
  n->a = a;
  n->b = b;
  n->transpose_a = ta;
  n->transpose_b = tb;
  n->out = p.new_value({M, N}, DType::f32, {a->origin[ta ? 1 : 0], b->origin[tb ? 0 : 1]});
  return n;
}

std::shared_ptr<Gather> make_gather(Program& p, const Tensor& table, const Value& index) {
  auto n = p.new_node<Gather>();
  MP_USER_CHECK(index->dtype == DType::i32, n->where(), ": the index of a Gather must be i32, got ",
                to_string(index->dtype));
  MP_USER_CHECK(index->shape.size() == 1 || (index->shape.size() == 2 && index->shape[1] == 1), n->where(),
                ": the index must be [n] or [n, 1], got ", to_string(index->shape));
  MP_USER_CHECK(table->shape.size() == 2, n->where(), ": the table '", table->name, "' must be 2-D, got ",
                to_string(table->shape));
  n->table = table;
  n->index = index;
  n->out = p.new_value({index->shape[0], table->shape[1]}, table->dtype, {index->origin[0], Affine(0)});
  return n;
}

std::shared_ptr<Scatter> make_scatter(Program& p, const Tensor& table, const Value& index,
                                      const Value& rows) {
  auto n = p.new_node<Scatter>();
  MP_USER_CHECK(table->role != TensorRole::Input, n->where(), ": SCATTER into '", table->name,
                "', an input tensor; declare it as an output (or inout)");
  MP_USER_CHECK(index->dtype == DType::i32, n->where(), ": the index of a Scatter must be i32");
  MP_USER_CHECK(index->shape.size() == 1 || (index->shape.size() == 2 && index->shape[1] == 1), n->where(),
                ": the index must be [n] or [n, 1], got ", to_string(index->shape));
  MP_USER_CHECK(table->shape.size() == 2 && rows->shape.size() == 2 && rows->shape[1] == table->shape[1] &&
                    rows->shape[0] == index->shape[0],
                n->where(), ": shape mismatch: rows ", to_string(rows->shape), " with index ",
                to_string(index->shape), " into table '", table->name, "' ", to_string(table->shape),
                "; rows must be [n, ", table->shape.size() == 2 ? table->shape[1] : 0,
                "] with n index entries");
  n->table = table;
  n->index = index;
  n->rows = rows;
  return n;
}

std::shared_ptr<Buffer> make_buffer(Program& p, const Value& in, int depth) {
  auto n = p.new_node<Buffer>();
  MP_USER_CHECK(depth >= 1, n->where(), ": BUFFER depth must be >= 1, got ", depth);
  n->in = in;
  n->depth = depth;
  n->out = p.new_value(in->shape, in->dtype, in->origin);
  return n;
}

}  // namespace mp::ir
