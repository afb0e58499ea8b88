// Tiling.
//
// A whole-tensor program (patterns on LOAD(T) values, no METAPIPE) is split along axis 0 ("rows"):
// values that carry rows to a stored output are rebuilt with T rows inside a METAPIPE over row tiles;
// values that do not (weights, tables) stay outside, loaded once. Softmax, R=256, C=64, row tile 64:
//
//   before                                          after
//   %1 = load_tile X[0, 0] : f32[256, 64]           metapipe i6 < 4 {
//   %2 = map(x = %1) exp(x) : f32[256, 64]            %7 = load_tile X[64*i6, 0] : f32[64, 64]
//   %3 = reduce add axis=1 %2 : f32[256, 1]           %8 = map(x = %7) exp(x) : f32[64, 64]
//   %4 = zip(x = %2, y = %3) (x / y) : f32[256, 64]   %9 = reduce add axis=1 %8 : f32[64, 1]
//   store_tile Y[0, 0], %4                            %10 = zip(x = %8, y = %9) (x / y) : f32[64, 64]
//                                                     store_tile Y[64*i6, 0], %10
//                                                   }
//
// Explicitly tiled programs keep their tiles: with masking, every tile that does not divide its
// dimension is marked masked (and its loop too); without, the verifier rejects it naming the node.
#include "passes/tile.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "ir/verify.h"

namespace mp::passes {
namespace {

using namespace ir;

// Mark non-dividing tile accesses masked (with masking on), and the loops that produce partial tiles.
void apply_masking(std::vector<NodeRef>& nodes) {
  for (auto& n : nodes) {
    auto mark = [&](const Tensor& t, const Shape& tile, const std::vector<Affine>& off, bool& masked) {
      for (size_t a = 0; a < tile.size(); ++a)
        if (!off[a].is_const() && t->shape[a] % tile[a] != 0) masked = true;
    };
    if (auto* l = n->as<LoadTile>()) mark(l->src, l->out->shape, l->offset, l->masked);
    if (auto* s = n->as<StoreTile>()) mark(s->dst, s->in->shape, s->offset, s->masked);
    if (auto* m = n->as<MetaPipe>()) {
      for (auto& st : m->stages) apply_masking(st.ops);
      for (auto& op : m->body()) {
        bool partial = false;
        if (auto* l = op->as<LoadTile>()) partial = l->masked && l->offset[0].coef_of(m->var) != 0;
        if (auto* s = op->as<StoreTile>()) partial = s->masked && s->offset[0].coef_of(m->var) != 0;
        m->masked = m->masked || partial;
      }
    }
  }
}

int64_t choose_row_tile(int64_t R, int64_t row_bytes_total, int64_t fixed_bytes, const TileOptions& opt,
                        int64_t budget, bool masking) {
  // Aim for at least 4 iterations (so stages can overlap) and tiles of at most 256 rows that fit.
  auto fits = [&](int64_t T) { return fixed_bytes + T * row_bytes_total * opt.depth <= budget; };
  int64_t cap = std::max<int64_t>(1, std::min<int64_t>(256, R >= 4 ? R / 4 : R));
  for (int64_t T = cap; T >= 1; --T) {
    if (!fits(T)) continue;
    if (R % T == 0) return T;
    if (masking && (T & (T - 1)) == 0) return T;
  }
  return 1;
}

struct RowTiler {
  const Program& in;
  Program& q;
  const TileOptions& opt;
  std::set<int> row;  // value ids whose axis 0 is the row axis
  int64_t R = 0;
  const Node* first_row_node = nullptr;

  void mark(const Value& v, const Node& why) {
    MP_USER_CHECK(v->shape.size() >= 1, why.where(), ": a scalar cannot be split into row tiles");
    if (R == 0) R = v->shape[0];
    MP_USER_CHECK(v->shape[0] == R, "tile: ", why.where(), " mixes row extents ", R, " and ", v->shape[0],
                  " along axis 0; whole-tensor programs are split along one row axis (tile it explicitly "
                  "with METAPIPE)");
    row.insert(v->id);
  }

  // Propagate "row" from outputs back to inputs, last node first.
  void analyze() {
    for (auto it = in.body.rbegin(); it != in.body.rend(); ++it) {
      const Node& n = **it;
      if (auto* s = n.as<StoreTile>()) {
        mark(s->in, n);
        continue;
      }
      if (auto* sc = n.as<Scatter>()) {
        mark(sc->index, n), mark(sc->rows, n);
        continue;
      }
      if (!n.out || !row.count(n.out->id)) continue;
      switch (n.kind) {
        case NodeKind::Map:
          mark(n.cast<Map>().in, n);
          break;
        case NodeKind::Buffer:
          mark(n.cast<Buffer>().in, n);
          break;
        case NodeKind::Zip:
          for (auto& v : n.cast<Zip>().ins)
            if (v->shape[0] == n.out->shape[0] && n.out->shape[0] > 1) mark(v, n);
          break;
        case NodeKind::Reduce:
          if (n.cast<Reduce>().axis == 0)
            throw not_supported(
                "tiling " + n.where() +
                ": a Reduce over the row axis 0 of a whole-tensor program; write the accumulation "
                "with METAPIPE_FOLD over row tiles");
          mark(n.cast<Reduce>().in, n);
          break;
        case NodeKind::MatMul: {
          auto& m = n.cast<MatMul>();
          if (m.transpose_a) throw not_supported("tiling " + n.where() + " with a transposed first operand");
          mark(m.a, n);
          break;
        }
        case NodeKind::Gather:
          mark(n.cast<Gather>().index, n);
          break;
        case NodeKind::LoadTile:
        case NodeKind::Fill:
          break;
        default:
          throw not_supported("tiling a whole-tensor " + n.where());
      }
    }
    // A row value may only feed nodes that keep rows (not, say, the right operand of a MatMul).
    for (auto& n : in.body) {
      if (auto* m = n->as<MatMul>()) {
        if (row.count(m->b->id))
          fail_user("tile: ", n->where(),
                    " multiplies by a value split into row tiles as its right operand; ",
                    "tile this program explicitly with METAPIPE");
      }
    }
  }

  std::vector<NodeRef> rebuild() {
    int64_t row_bytes = 0, fixed = 0;
    for (auto& n : in.body)
      if (n->out) {
        if (row.count(n->out->id))
          row_bytes += n->out->bytes() / std::max<int64_t>(1, n->out->shape[0]);
        else
          fixed += n->out->bytes();
      }
    int64_t T = opt.row_tile;
    if (T == 0) {
      T = choose_row_tile(R, row_bytes, fixed, opt, q.onchip_budget, q.masking);
    } else {
      MP_USER_CHECK(T >= 1 && T <= R, "tile: row_tile=", T, " must be in [1, ", R, "] (the rows of ",
                    first_row_node->where(), ")");
      MP_USER_CHECK(R % T == 0 || q.masking, "tile: row tile ", T, " does not divide the ", R, " rows of ",
                    first_row_node->where(), "; choose a divisor of ", R,
                    " or enable masking (--set mask=1)");
    }
    auto loop = q.new_node<MetaPipe>();
    loop->var = q.new_loop_var((R + T - 1) / T);
    loop->masked = R % T != 0;
    loop->stages.push_back({"body", {}, {}});
    auto& inner = loop->stages[0].ops;
    std::vector<NodeRef> out;
    std::map<int, Value> vmap;
    auto V = [&](const Value& v) {
      auto it = vmap.find(v->id);
      return it == vmap.end() ? v : it->second;
    };
    Affine row_off = Affine::var(loop->var, T);
    // Nodes without rows depend only on nodes without rows: they run once, before the loop.
    for (auto& n : in.body) {
      bool is_row =
          (n->out && row.count(n->out->id)) || n->kind == NodeKind::StoreTile || n->kind == NodeKind::Scatter;
      if (!is_row) out.push_back(n->clone());
    }
    out.push_back(loop);
    for (auto& n : in.body) {
      bool is_row =
          (n->out && row.count(n->out->id)) || n->kind == NodeKind::StoreTile || n->kind == NodeKind::Scatter;
      if (!is_row) continue;
      NodeRef nn;
      switch (n->kind) {
        case NodeKind::LoadTile: {
          auto& l = n->cast<LoadTile>();
          Shape s = l.out->shape;
          s[0] = T;
          auto off = l.offset;
          off[0] = row_off;
          nn = make_load(q, l.src, s, off, loop->masked, std::min<int>(l.row_par, int(T)));
          break;
        }
        case NodeKind::StoreTile: {
          auto& s = n->cast<StoreTile>();
          auto off = s.offset;
          off[0] = row_off;
          nn = make_store(q, s.dst, V(s.in), off, loop->masked);
          break;
        }
        case NodeKind::Fill: {
          auto& f = n->cast<Fill>();
          Shape s = f.out->shape;
          s[0] = T;
          auto origin = f.out->origin;
          origin[0] = row_off;
          nn = make_fill(q, s, f.out->dtype, f.f, origin);
          break;
        }
        case NodeKind::Map: {
          auto& m = n->cast<Map>();
          nn = make_map(q, V(m.in), m.f, m.out->dtype);
          break;
        }
        case NodeKind::Zip: {
          auto& z = n->cast<Zip>();
          std::vector<Value> ins;
          for (auto& v : z.ins) ins.push_back(V(v));
          nn = make_zip(q, ins, z.f, z.out->dtype);
          break;
        }
        case NodeKind::Reduce: {
          auto& r = n->cast<Reduce>();
          auto nr = make_reduce(q, V(r.in), r.axis, r.combiner, r.custom, r.identity);
          nr->pre = r.pre;
          nn = nr;
          break;
        }
        case NodeKind::MatMul: {
          auto& m = n->cast<MatMul>();
          nn = make_matmul(q, V(m.a), V(m.b), m.transpose_a, m.transpose_b);
          break;
        }
        case NodeKind::Gather: {
          auto& g = n->cast<Gather>();
          nn = make_gather(q, g.table, V(g.index));
          break;
        }
        case NodeKind::Scatter: {
          auto& s = n->cast<Scatter>();
          nn = make_scatter(q, s.table, V(s.index), V(s.rows));
          break;
        }
        case NodeKind::Buffer: {
          auto& b = n->cast<Buffer>();
          nn = make_buffer(q, V(b.in), b.depth);
          break;
        }
        default:
          throw not_supported("tiling a whole-tensor " + n->where());
      }
      nn->id = n->id;  // the same node, tiled: keep its number for messages and dumps
      nn->par = n->par, nn->lanes = n->lanes;
      if (n->out) vmap[n->out->id] = nn->out;
      inner.push_back(nn);
    }
    return out;
  }
};

}  // namespace

ir::Program tile(const ir::Program& p, const TileOptions& opt) {
  Program q = p.clone();
  if (opt.onchip_budget > 0) q.onchip_budget = opt.onchip_budget;
  q.masking = q.masking || opt.masking;

  bool whole = !q.body.empty();
  for (auto& n : q.body) whole = whole && n->kind != NodeKind::MetaPipe;
  bool has_store = false;
  for (auto& n : q.body)
    has_store = has_store || n->kind == NodeKind::StoreTile || n->kind == NodeKind::Scatter;
  if (whole && has_store) {
    RowTiler rt{p, q, opt, {}, 0, nullptr};
    rt.analyze();
    for (auto& n : p.body)
      if ((n->out && rt.row.count(n->out->id)) || n->kind == NodeKind::StoreTile) {
        rt.first_row_node = n.get();
        break;
      }
    if (rt.R > 0) q.body = rt.rebuild();
  } else if (opt.row_tile != 0) {
    fail_user("tile: row_tile=", opt.row_tile, " applies to whole-tensor programs; '", p.name,
              "' is tiled explicitly (change its tile parameters instead)");
  }
  if (q.masking) apply_masking(q.body);
  q.tiled = true;
  return q;
}

}  // namespace mp::passes
