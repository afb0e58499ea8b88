// Parallelization: par and lanes on every node.
//
//   before                                          after (lanes=16, max_par=4)
//   %6 = load_tile B[0, 64*i2] : f32[128, 64] row_par=4   ... row_par=4 par=4
//   %7 = matmul %4, %6 : f32[64, 64]                 %7 = matmul %4, %6 : f32[64, 64] par=4 lanes=16
//   %8 = map(x = %7) exp(x) : f32[64, 64]           %8 = map(...) ... lanes=16
//
// lanes: SIMD width over the innermost axis (at most its extent). par: for a MatMul, the row_par the
// user asked of an operand's LOAD_TILE, else as many units as columns allow (N / lanes, at most max_par);
// for loads, the row_par streams; element-wise nodes use one unit.
#include "passes/parallelize.h"

#include <algorithm>
#include <map>

namespace mp::passes {
namespace {

using namespace ir;

void run(std::vector<NodeRef>& list, const ParallelizeOptions& o, std::map<int, int>& row_par_of) {
  for (auto& n : list) {
    if (auto* m = n->as<MetaPipe>()) {
      for (auto& s : m->stages) run(s.ops, o, row_par_of);
      continue;
    }
    int64_t inner = n->out ? n->out->shape.back() : 1;
    if (auto* s = n->as<StoreTile>()) inner = s->in->shape.back();
    if (auto* s = n->as<Scatter>()) inner = s->rows->shape.back();
    n->lanes = int(std::max<int64_t>(1, std::min<int64_t>(o.lanes, inner)));
    if (auto* l = n->as<LoadTile>()) {
      n->par = l->row_par;
      row_par_of[l->out->id] = l->row_par;
    } else if (auto* mm = n->as<MatMul>()) {
      int hint = std::max(row_par_of.count(mm->a->id) ? row_par_of[mm->a->id] : 1,
                          row_par_of.count(mm->b->id) ? row_par_of[mm->b->id] : 1);
      int64_t N = mm->out->shape[1];
      n->par = hint > 1 ? hint : int(std::clamp<int64_t>(N / std::max(1, o.lanes), 1, o.max_par));
    } else {
      n->par = 1;
    }
  }
}

}  // namespace

ir::Program parallelize(const ir::Program& p, const ParallelizeOptions& opt) {
  MP_USER_CHECK(opt.lanes >= 1 && opt.max_par >= 1, "parallelize: lanes and max_par must be >= 1");
  Program q = p.clone();
  std::map<int, int> row_par_of;
  run(q.body, opt, row_par_of);
  q.parallelized = true;
  return q;
}

}  // namespace mp::passes
