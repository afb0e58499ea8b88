// Work, off-chip access patterns and on-chip footprint computed from the IR.
#include "ir/analysis.h"

#include <set>

namespace mp::ir {

std::optional<OffChipAccess> access_of(const Node& n) {
  auto tile_access = [](const Tensor& t, const Shape& tile, bool store) {
    OffChipAccess a;
    a.tensor = t;
    a.store = store;
    int64_t eb = bytes_of(t->dtype);
    a.bytes = num_elements(tile) * eb;
    // Trailing axes that the tile covers fully merge with the first partial axis into one contiguous run.
    size_t r = tile.size() - 1;
    while (r > 0 && tile[r] == t->shape[r]) --r;
    int64_t run = 1, stride = 1;
    for (size_t k = r; k < tile.size(); ++k) run *= tile[k], stride *= t->shape[k];
    a.run_bytes = run * eb;
    a.runs = std::max<int64_t>(1, num_elements(tile) / run);
    a.stride_bytes = stride * eb;
    a.pattern = a.runs == 1 ? OffChipAccess::Pattern::Contiguous : OffChipAccess::Pattern::Strided;
    return a;
  };
  switch (n.kind) {
    case NodeKind::LoadTile: {
      auto& l = n.cast<LoadTile>();
      auto a = tile_access(l.src, l.out->shape, false);
      a.row_par = l.row_par;
      return a;
    }
    case NodeKind::StoreTile: {
      auto& s = n.cast<StoreTile>();
      return tile_access(s.dst, s.in->shape, true);
    }
    case NodeKind::Gather:
    case NodeKind::Scatter: {
      bool store = n.kind == NodeKind::Scatter;
      const Tensor& t = store ? n.cast<Scatter>().table : n.cast<Gather>().table;
      const Value& idx = store ? n.cast<Scatter>().index : n.cast<Gather>().index;
      OffChipAccess a;
      a.tensor = t;
      a.store = store;
      a.pattern = OffChipAccess::Pattern::Random;
      a.run_bytes = t->shape[1] * bytes_of(t->dtype);
      a.runs = idx->shape[0];
      a.bytes = a.run_bytes * a.runs;
      return a;
    }
    default:
      return std::nullopt;
  }
}

Work work_of(const Node& n) {
  Work w;
  if (auto a = access_of(n)) {
    (a->store ? w.store_bytes : w.load_bytes) += a->bytes;
    w.accesses.push_back(*a);
    return w;
  }
  switch (n.kind) {
    case NodeKind::Fill:
      w.elem_ops = num_elements(n.out->shape) * n.cast<Fill>().f.op_count();
      break;
    case NodeKind::Map:
      w.elem_ops = num_elements(n.out->shape) * n.cast<Map>().f.op_count();
      break;
    case NodeKind::Zip:
      w.elem_ops = num_elements(n.out->shape) * n.cast<Zip>().f.op_count();
      break;
    case NodeKind::Reduce: {
      auto& r = n.cast<Reduce>();
      w.elem_ops = num_elements(r.in->shape) * (1 + (r.pre ? r.pre->op_count() : 0));
      break;
    }
    case NodeKind::MatMul: {
      auto& m = n.cast<MatMul>();
      int64_t K = m.a->shape[m.transpose_a ? 0 : 1];
      w.flops = 2.0 * double(num_elements(m.out->shape)) * double(K);
      break;
    }
    case NodeKind::MetaPipe: {
      auto& m = n.cast<MetaPipe>();
      w = work_of(m.body()).scaled(m.trip());
      break;
    }
    default:
      break;  // Buffer: no work of its own
  }
  return w;
}

Work work_of(const std::vector<NodeRef>& nodes) {
  Work w;
  for (auto& n : nodes) w += work_of(*n);
  return w;
}

std::vector<Value> reads_of(const Node& n) {
  std::vector<Value> out = n.operands();
  auto* m = n.as<MetaPipe>();
  if (!m) return out;
  std::set<int> inside, seen;
  for (auto& v : out) seen.insert(v->id);
  for (auto& c : m->carried) inside.insert(c.arg->id);
  walk(m->body(), [&](const NodeRef& x, int) {
    if (x->out) inside.insert(x->out->id);
    if (auto* mm = x->as<MetaPipe>())
      for (auto& c : mm->carried) inside.insert(c.arg->id), inside.insert(c.result->id);
  });
  walk(m->body(), [&](const NodeRef& x, int) {
    for (auto& v : x->operands())
      if (!inside.count(v->id) && seen.insert(v->id).second) out.push_back(v);
    if (auto* mm = x->as<MetaPipe>())
      for (auto& c : mm->carried)
        if (!inside.count(c.next->id) && seen.insert(c.next->id).second) out.push_back(c.next);
  });
  for (auto& c : m->carried)
    if (!inside.count(c.next->id) && seen.insert(c.next->id).second) out.push_back(c.next);
  return out;
}

Work program_work(const Program& p) { return work_of(p.body); }

int64_t buffer_bytes(const MetaPipe& m) {
  int64_t b = 0;
  for (auto& buf : m.buffers) b += buf.bytes();
  for (auto& n : m.body())
    if (auto* inner = n->as<MetaPipe>()) b += buffer_bytes(*inner);
  return b;
}

static void collect(const MetaPipe& m, const std::string& path, std::vector<BufferRef>& out) {
  std::string here = (path.empty() ? "" : path + "/") + "L" + std::to_string(m.id);
  for (auto& b : m.buffers) out.push_back({here, &m, &b});
  for (auto& n : m.body())
    if (auto* inner = n->as<MetaPipe>()) collect(*inner, here, out);
}

static void collect_stages(const MetaPipe& m, const std::string& prefix, int64_t outer, int depth,
                           std::vector<StageRef>& out) {
  std::string loop = prefix + "L" + std::to_string(m.id);
  int64_t iters = outer * m.trip();
  for (size_t s = 0; s < m.stages.size(); ++s) {
    StageRef r;
    r.path = loop + "." + m.stages[s].name;
    r.pipe = &m;
    r.index = int(s);
    r.iterations = iters;
    r.depth = depth;
    for (auto& n : m.stages[s].ops) r.holds_loop = r.holds_loop || n->kind == NodeKind::MetaPipe;
    out.push_back(r);
    for (auto& n : m.stages[s].ops)
      if (auto* inner = n->as<MetaPipe>()) collect_stages(*inner, r.path + "/", iters, depth + 1, out);
  }
}

std::vector<StageRef> all_stages(const Program& p) {
  std::vector<StageRef> out;
  for (auto& n : p.body)
    if (auto* m = n->as<MetaPipe>()) collect_stages(*m, "", 1, 0, out);
  return out;
}

std::vector<BufferRef> all_buffers(const Program& p) {
  std::vector<BufferRef> out;
  for (auto& n : p.body)
    if (auto* m = n->as<MetaPipe>()) collect(*m, "", out);
  return out;
}

}  // namespace mp::ir
