// Fusion of element functions.
//
//   before                                          after
//   %8 = map(x = %7) (x * 2) : f32[64, 64]          %10 = zip(x = %7, y = %9) ((x * 2) + y) : f32[64, 64]
//   %10 = zip(x = %8, y = %9) (x + y) : f32[64, 64]
//
//   %8 = map(x = %7) exp(x) : f32[64, 64]           %9 = reduce add axis=1 %7 pre(x) = exp(x) : f32[64, 1]
//   %9 = reduce add axis=1 %8 : f32[64, 1]          (only when %8 has no other use)
//
// A producer is fused only when it has exactly one use, sits in the same stage list as its user, is not a
// loop-carried value, and its function does not read element indices or random numbers (those depend on
// which element the producer itself computes). Softmax's exp has two uses (the sum and the divide) and
// stays: fusion cannot overlap the row sum with the divide, metapipelining can.
#include "passes/fuse.h"

#include <map>
#include <set>

namespace mp::passes {
namespace {

using namespace ir;

bool index_free(const Expr& f) {
  bool ok = f.max_index_axis() < 0;
  std::vector<const ExprNode*> stack{&f.node()};
  while (!stack.empty()) {
    auto* n = stack.back();
    stack.pop_back();
    if (n->op == ExprOp::Random) ok = false;
    for (auto& k : n->kids) stack.push_back(k.get());
  }
  return ok;
}

struct Fuser {
  std::map<int, int> uses;  // value id -> number of uses (operands and carried / yielded values)
  int fused = 0;

  void count(const std::vector<NodeRef>& body) {
    walk(body, [&](const NodeRef& n, int) {
      for (auto& v : n->operands()) ++uses[v->id];
      if (auto* m = n->as<MetaPipe>())
        for (auto& c : m->carried) uses[c.next->id] += 2;  // never fuse away a yielded value
    });
  }

  void run(std::vector<NodeRef>& list) {
    for (auto& n : list)
      if (auto* m = n->as<MetaPipe>())
        for (auto& s : m->stages) run(s.ops);
    // Producer -> its single user in this list.
    for (size_t i = 0; i < list.size(); ++i) {
      auto& prod = list[i];
      if (!prod || !prod->out || uses[prod->out->id] != 1) continue;
      const Expr* pf = nullptr;
      std::vector<Value> pins;
      if (auto* m = prod->as<Map>()) pf = &m->f, pins = {m->in};
      if (auto* z = prod->as<Zip>()) pf = &z->f, pins = z->ins;
      if (!pf || !index_free(*pf)) continue;
      for (size_t j = i + 1; j < list.size(); ++j) {
        auto& user = list[j];
        if (!user) continue;
        auto ops = user->operands();
        bool uses_it = false;
        for (auto& v : ops) uses_it = uses_it || v->id == prod->out->id;
        if (!uses_it) continue;
        if (fuse_into(*user, *prod, *pf, pins)) {
          list[i] = nullptr;
          ++fused;
        }
        break;
      }
    }
    std::erase(list, nullptr);
  }

  // Rewrite user so that it computes from the producer's inputs; false when it cannot.
  bool fuse_into(Node& user, const Node& prod, const Expr& pf, const std::vector<Value>& pins) {
    if (auto* r = user.as<Reduce>()) {
      if (prod.kind != NodeKind::Map) return false;  // a Reduce has one input
      r->in = pins[0];
      r->pre = r->pre ? r->pre->substitute({pf}) : pf;
      return true;
    }
    std::vector<Value>* ins = nullptr;
    Expr* f = nullptr;
    std::vector<Value> single;
    if (auto* z = user.as<Zip>()) ins = &z->ins, f = &z->f;
    if (auto* m = user.as<Map>()) {
      single = {m->in};
      ins = &single, f = &m->f;
    }
    if (!ins) return false;
    if (prod.out->shape != user.out->shape) return false;  // keep broadcasting where it was
    for (auto& v : pins)
      if (v->shape.size() != user.out->shape.size()) return false;
    // New operand list: the user's, with the producer replaced by the producer's inputs.
    std::vector<Value> nins;
    std::vector<Expr> subs;
    for (auto& v : *ins) {
      if (v->id == prod.out->id) {
        std::vector<Expr> psubs;
        for (auto& pv : pins) {
          psubs.push_back(Expr::arg(int(nins.size())));
          nins.push_back(pv);
        }
        subs.push_back(pf.substitute(psubs));
      } else {
        subs.push_back(Expr::arg(int(nins.size())));
        nins.push_back(v);
      }
    }
    Expr nf = f->substitute(subs);
    if (auto* m = user.as<Map>()) {
      if (nins.size() != 1) return false;  // a Map stays a Map only with one input
      m->in = nins[0];
      m->f = nf;
      return true;
    }
    auto& z = user.cast<Zip>();
    z.ins = nins;
    z.f = nf;
    return true;
  }
};

}  // namespace

ir::Program fuse(const ir::Program& p, const FuseOptions& opt) {
  Program q = p.clone();
  if (!opt.enabled) return q;
  Fuser f;
  f.count(q.body);
  f.run(q.body);
  q.fused = true;
  return q;
}

}  // namespace mp::passes
