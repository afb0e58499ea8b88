// The IR printer: one line per node, MetaPipe bodies indented by stage, buffers listed after each loop.
#include "ir/printer.h"

#include <sstream>

namespace mp::ir {

std::string value_name(const Value& v) {
  if (!v) return "<null>";
  return "%" + std::to_string(v->id) + (v->name.empty() ? "" : ":" + v->name);
}

static std::string type_of(const Value& v) { return std::string(to_string(v->dtype)) + to_string(v->shape); }

static std::string offsets(const std::vector<Affine>& off) {
  std::string o = "[";
  for (size_t i = 0; i < off.size(); ++i) o += (i ? ", " : "") + off[i].str();
  return o + "]";
}

static std::string human_bytes(int64_t b) {
  char buf[48];
  if (b >= (1ll << 20) && b % (1ll << 10) == 0)
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / 1048576.0);
  else if (b >= 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%lld B", (long long)b);
  return buf;
}

static std::string par_attrs(const Node& n) {
  std::string o;
  if (n.par != 1) o += " par=" + std::to_string(n.par);
  if (n.lanes != 1) o += " lanes=" + std::to_string(n.lanes);
  return o;
}

static void print_node(const Node& n, std::ostream& os, int ind);

static void print_list(const std::vector<NodeRef>& nodes, std::ostream& os, int ind) {
  for (auto& n : nodes) print_node(*n, os, ind);
}

static void print_node(const Node& n, std::ostream& os, int ind) {
  std::string pad(ind * 2, ' ');
  std::string res = n.out ? value_name(n.out) + " = " : "";
  std::string ty = n.out ? " : " + type_of(n.out) : "";
  std::string tag = "  #" + std::to_string(n.id);
  switch (n.kind) {
    case NodeKind::Fill: {
      auto& f = n.cast<Fill>();
      os << pad << res << "fill " << f.f.str() << ty << tag << "\n";
      break;
    }
    case NodeKind::LoadTile: {
      auto& l = n.cast<LoadTile>();
      os << pad << res << "load_tile " << l.src->name << offsets(l.offset) << ty
         << (l.row_par != 1 ? " row_par=" + std::to_string(l.row_par) : "") << (l.masked ? " masked" : "")
         << par_attrs(n) << tag << "\n";
      break;
    }
    case NodeKind::StoreTile: {
      auto& s = n.cast<StoreTile>();
      os << pad << "store_tile " << s.dst->name << offsets(s.offset) << ", " << value_name(s.in) << " : "
         << type_of(s.in) << (s.masked ? " masked" : "") << par_attrs(n) << tag << "\n";
      break;
    }
    case NodeKind::Map: {
      auto& m = n.cast<Map>();
      os << pad << res << "map(x = " << value_name(m.in) << ") " << m.f.str() << ty << par_attrs(n) << tag
         << "\n";
      break;
    }
    case NodeKind::Zip: {
      auto& z = n.cast<Zip>();
      os << pad << res << "zip(";
      for (size_t i = 0; i < z.ins.size(); ++i)
        os << (i ? ", " : "") << (i < 4 ? std::string(1, "xyzw"[i]) : "a" + std::to_string(i)) << " = "
           << value_name(z.ins[i]);
      os << ") " << z.f.str() << ty << par_attrs(n) << tag << "\n";
      break;
    }
    case NodeKind::Reduce: {
      auto& r = n.cast<Reduce>();
      os << pad << res << "reduce " << to_string(r.combiner);
      if (r.combiner == Combiner::Custom) os << "(" << r.custom->str() << ", init " << r.identity << ")";
      os << " axis=" << r.axis << " " << value_name(r.in);
      if (r.pre) os << " pre(x) = " << r.pre->str();
      os << ty << par_attrs(n) << tag << "\n";
      break;
    }
    case NodeKind::MatMul: {
      auto& m = n.cast<MatMul>();
      os << pad << res << "matmul " << value_name(m.a) << (m.transpose_a ? "^T" : "") << ", "
         << value_name(m.b) << (m.transpose_b ? "^T" : "") << ty << par_attrs(n) << tag << "\n";
      break;
    }
    case NodeKind::Gather: {
      auto& g = n.cast<Gather>();
      os << pad << res << "gather " << g.table->name << "[" << value_name(g.index) << "]" << ty
         << par_attrs(n) << tag << "\n";
      break;
    }
    case NodeKind::Scatter: {
      auto& s = n.cast<Scatter>();
      os << pad << "scatter " << s.table->name << "[" << value_name(s.index) << "], " << value_name(s.rows)
         << " : " << type_of(s.rows) << par_attrs(n) << tag << "\n";
      break;
    }
    case NodeKind::Buffer: {
      auto& b = n.cast<Buffer>();
      os << pad << res << "buffer " << value_name(b.in) << " depth=" << b.depth << ty << tag << "\n";
      break;
    }
    case NodeKind::MetaPipe: {
      auto& m = n.cast<MetaPipe>();
      os << pad;
      for (size_t i = 0; i < m.carried.size(); ++i) os << (i ? ", " : "") << value_name(m.carried[i].result);
      if (!m.carried.empty()) os << " = ";
      os << "metapipe " << m.var->name << " < " << m.trip() << (m.masked ? " masked" : "");
      if (!m.carried.empty()) {
        os << " carry(";
        for (size_t i = 0; i < m.carried.size(); ++i)
          os << (i ? ", " : "") << value_name(m.carried[i].arg) << " = " << value_name(m.carried[i].init);
        os << ")";
      }
      os << " {" << tag << "\n";
      for (size_t s = 0; s < m.stages.size(); ++s) {
        auto& st = m.stages[s];
        if (m.scheduled) {
          os << pad << "  stage " << st.name << ":";
          if (st.work.flops) os << " flops=" << (long long)st.work.flops;
          if (st.work.elem_ops) os << " elem_ops=" << st.work.elem_ops;
          if (st.work.load_bytes) os << " load=" << human_bytes(st.work.load_bytes);
          if (st.work.store_bytes) os << " store=" << human_bytes(st.work.store_bytes);
          os << "\n";
          print_list(st.ops, os, ind + 2);
        } else {
          print_list(st.ops, os, ind + 1);
        }
      }
      if (!m.carried.empty()) {
        os << pad << "  yield ";
        for (size_t i = 0; i < m.carried.size(); ++i) os << (i ? ", " : "") << value_name(m.carried[i].next);
        os << "\n";
      }
      for (auto& b : m.buffers) {
        os << pad << "  buffer " << b.name << " " << value_name(b.value) << " : " << type_of(b.value) << " ";
        if (b.kind == BufferInfo::Kind::State) {
          os << "state in " << m.stages[b.producer].name;
        } else {
          os << m.stages[b.producer].name << " ->";
          for (int c : b.consumers) os << " " << m.stages[c].name;
        }
        os << " depth=" << b.depth << " (" << human_bytes(b.bytes()) << ")\n";
      }
      if (m.scheduled && m.stages.size() > 1) {
        os << pad << "  graph";
        for (auto [a, b] : m.edges()) os << " " << m.stages[a].name << "->" << m.stages[b].name;
        os << "\n";
      }
      os << pad << "}\n";
      break;
    }
  }
}

std::string print(const Node& n) {
  std::ostringstream os;
  print_node(n, os, 0);
  return os.str();
}

std::string print(const Program& p) {
  std::ostringstream os;
  os << "program " << p.name;
  if (!p.params.empty()) {
    os << " (";
    bool first = true;
    for (auto& [k, v] : p.params) os << (first ? "" : ", ") << k << "=" << v, first = false;
    os << ")";
  }
  std::string done;
  if (p.tiled) done += " tiled";
  if (p.fused) done += " fused";
  if (p.parallelized) done += " parallelized";
  if (p.metapipelined) done += " metapipelined";
  os << (done.empty() ? "" : " [" + done.substr(1) + "]") << " on-chip budget "
     << human_bytes(p.onchip_budget) << (p.masking ? ", masking" : "") << "\n";
  for (auto& t : p.tensors)
    os << "  tensor " << t->name << " : " << to_string(t->dtype) << to_string(t->shape) << " "
       << to_string(t->role) << "\n";
  print_list(p.body, os, 1);
  return os.str();
}

}  // namespace mp::ir
