// The verifier: scoping (every operand defined before use, in an enclosing scope), tile bounds and
// masking, and the invariants each pass promises (tiled: every on-chip value and BUFFER fits the budget;
// metapipelined: every loop scheduled, every cross-stage value buffered, buffers fit the budget).
#include "ir/verify.h"

#include <set>

#include "ir/analysis.h"

namespace mp::ir {
namespace {

std::string kib(int64_t b) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  return buf;
}

struct Verifier {
  const Program& p;
  std::vector<std::set<int>> scopes;   // value ids visible
  std::vector<const MetaPipe*> loops;  // enclosing loops

  bool defined(const Value& v) const {
    for (auto& s : scopes)
      if (s.count(v->id)) return true;
    return false;
  }
  void define(const Value& v) { scopes.back().insert(v->id); }

  void check_offsets(const Node& n, const std::vector<Affine>& off) {
    for (auto& a : off)
      for (auto& [var, c] : a.terms) {
        bool ok = false;
        for (auto* l : loops) ok = ok || l->var->id == var->id;
        MP_INTERNAL_CHECK(ok, n.where(), " uses loop variable ", var->name, " outside its METAPIPE");
      }
  }

  // Bounds of a tile access: every tile must start inside the tensor; a tile that runs past the end is
  // allowed only when masked, and only as the last tile of a non-dividing loop.
  void check_bounds(const Node& n, const Tensor& t, const Shape& tile, const std::vector<Affine>& off,
                    bool masked, const char* what) {
    for (size_t a = 0; a < tile.size(); ++a) {
      int64_t start = off[a].max_value(), end = start + tile[a], dim = t->shape[a];
      if (!masked && dim % tile[a] != 0 && !off[a].is_const())
        fail_user(n.where(), " (", what, " of ", t->name, "): tile ", tile[a], " does not divide dimension ",
                  dim, " of ", t->name, " (axis ", a, "); choose a tile size that divides ", dim,
                  " or enable masking (--set mask=1, TileOptions::masking) so the last tile is cut short");
      if (end <= dim) continue;
      MP_USER_CHECK(start < dim, n.where(), " (", what, " of ", t->name, ") reaches ", t->name, " axis ", a,
                    " offset ", off[a].str(), " up to ", start, " (tile ", tile[a], "), out of bounds of ",
                    t->name, to_string(t->shape), "; reduce the loop trip count to ",
                    (dim + tile[a] - 1) / tile[a], " or fix the offset");
      if (!masked) {
        MP_USER_CHECK(
            dim % tile[a] == 0, n.where(), " (", what, " of ", t->name, "): tile ", tile[a],
            " does not divide dimension ", dim, " of ", t->name, " (axis ", a,
            "); choose a tile size that divides ", dim,
            " or enable masking (--set mask=1, TileOptions::masking) so the last tile is cut short");
        fail_user(n.where(), " (", what, "): out of bounds: it writes past the end of ", t->name,
                  to_string(t->shape), " on axis ", a, " (up to ", end, " > ", dim, "); fix the offset ",
                  off[a].str(), " or the tile");
      }
    }
  }

  void node(const Node& n) {
    for (auto& v : n.operands()) {
      MP_INTERNAL_CHECK(v, n.where(), " has a null operand");
      MP_USER_CHECK(defined(v), n.where(), " uses ", v->id, " before it is defined (or outside its scope)");
    }
    if (p.tiled && n.out && n.kind != NodeKind::MetaPipe)
      MP_USER_CHECK(n.out->bytes() <= p.onchip_budget, n.where(), " produces ", to_string(n.out->dtype),
                    to_string(n.out->shape), " = ", kib(n.out->bytes()), ", more than the on-chip budget of ",
                    kib(p.onchip_budget),
                    "; tile it smaller (or raise the budget with --set budget_kib=...)");
    switch (n.kind) {
      case NodeKind::LoadTile: {
        auto& l = n.cast<LoadTile>();
        check_offsets(n, l.offset);
        if (p.tiled) check_bounds(n, l.src, l.out->shape, l.offset, l.masked, "LOAD_TILE");
        break;
      }
      case NodeKind::StoreTile: {
        auto& s = n.cast<StoreTile>();
        check_offsets(n, s.offset);
        if (p.tiled) check_bounds(n, s.dst, s.in->shape, s.offset, s.masked, "STORE_TILE");
        break;
      }
      case NodeKind::Buffer: {
        auto& b = n.cast<Buffer>();
        int64_t bytes = b.in->bytes() * b.depth;
        MP_USER_CHECK(bytes <= p.onchip_budget, "BUFFER ", n.where(), " holds ", b.depth, " x ",
                      kib(b.in->bytes()), " = ", kib(bytes), ", more than the on-chip budget of ",
                      kib(p.onchip_budget),
                      "; use smaller tiles, a smaller depth, or raise the budget (--set budget_kib=...)");
        break;
      }
      case NodeKind::MetaPipe:
        metapipe(n.cast<MetaPipe>());
        break;
      default:
        break;
    }
    if (n.out) define(n.out);
  }

  void metapipe(const MetaPipe& m) {
    MP_USER_CHECK(m.trip() >= 1, m.where(), ": METAPIPE trip count must be >= 1, got ", m.trip());
    MP_INTERNAL_CHECK(!m.stages.empty(), m.where(), " has no stages");
    MP_INTERNAL_CHECK(!p.metapipelined || m.scheduled, m.where(),
                      " is not scheduled after the metapipeline pass");
    loops.push_back(&m);
    scopes.emplace_back();
    for (auto& c : m.carried) {
      MP_INTERNAL_CHECK(c.init && c.arg && c.next && c.result, m.where(), ": incomplete loop-carried value");
      MP_USER_CHECK(c.init->shape == c.arg->shape && c.next->shape == c.arg->shape, m.where(),
                    ": loop-carried value ", c.arg->id, " changes shape from ", to_string(c.init->shape),
                    " to ", to_string(c.next->shape), "; the body must yield the same shape it receives");
      define(c.arg);
    }
    std::map<int, int> stage_of;  // value id -> defining stage
    for (size_t s = 0; s < m.stages.size(); ++s)
      for (auto& op : m.stages[s].ops) {
        node(*op);
        if (op->out) stage_of[op->out->id] = int(s);
        if (auto* inner = op->as<MetaPipe>())
          for (auto& c : inner->carried) stage_of[c.result->id] = int(s);
      }
    for (auto& c : m.carried)
      MP_USER_CHECK(defined(c.next), m.where(), ": yielded value ", c.next->id,
                    " is not defined in the body");
    if (m.scheduled) {
      // Every value used in a later stage than its producer must travel through a Stream buffer.
      std::set<std::pair<int, int>> buffered;
      for (auto& b : m.buffers) {
        MP_INTERNAL_CHECK(b.producer >= 0 && b.producer < int(m.stages.size()), m.where(), ": buffer ",
                          b.name, " has a bad producer stage");
        for (int c : b.consumers) {
          MP_INTERNAL_CHECK(b.kind == BufferInfo::Kind::State || c > b.producer, m.where(), ": buffer ",
                            b.name, " flows backwards (", b.producer, " -> ", c, ")");
          buffered.insert({b.value->id, c});
        }
      }
      for (size_t s = 0; s < m.stages.size(); ++s)
        for (auto& op : m.stages[s].ops)
          for (auto& v : reads_of(*op)) {
            auto it = stage_of.find(v->id);
            if (it == stage_of.end() || it->second == int(s)) continue;
            MP_INTERNAL_CHECK(it->second < int(s), m.where(), ": ", op->where(), " in stage ", s,
                              " reads a value of the later stage ", it->second);
            MP_INTERNAL_CHECK(buffered.count({v->id, int(s)}), m.where(), ": ", op->where(), " in stage ",
                              m.stages[s].name, " reads %", v->id, " of stage ", m.stages[it->second].name,
                              " without a buffer");
          }
    }
    scopes.pop_back();
    loops.pop_back();
    for (auto& c : m.carried) define(c.result);
  }
};

}  // namespace

void verify(const Program& p) {
  Verifier v{p, {{}}, {}};
  std::set<int> ids;
  walk(p.body, [&](const NodeRef& n, int) {
    MP_INTERNAL_CHECK(ids.insert(n->id).second, "node id ", n->id, " appears twice");
  });
  for (auto& n : p.body) v.node(*n);
  if (p.metapipelined) {
    int64_t total = 0;
    for (auto& b : all_buffers(p)) total += b.buffer->bytes();
    // Loops run one after another at the top level, so the largest one must fit.
    for (auto& n : p.body)
      if (auto* m = n->as<MetaPipe>()) {
        int64_t bytes = buffer_bytes(*m);
        MP_USER_CHECK(bytes <= p.onchip_budget, "the buffers of ", m->where(), " need ", kib(bytes),
                      ", more than the on-chip budget of ", kib(p.onchip_budget),
                      "; use smaller tiles or buffer depth (--set depth=1), or raise the budget (--set "
                      "budget_kib=...)");
      }
    (void)total;
  }
}

}  // namespace mp::ir
