// Metapipelining: stages, N-buffers, the stage graph and per-stage work for every METAPIPE.
//
//   before (slide 51, inner loop)                   after
//   metapipe i2 < 4 {                               metapipe i2 < 4 {
//     %6 = load_tile B[0, 64*i2] : f32[128, 64]       stage s0: load=32.0 KiB
//     %7 = matmul %4, %6 : f32[64, 64]                  %6 = load_tile B[0, 64*i2] : f32[128, 64]
//     %8 = buffer %7 depth=2 : f32[64, 64]            stage s1: flops=1048576
//     store_tile C[64*i1, 64*i2], %8                    %7 = matmul %4, %6 : f32[64, 64]
//   }                                                   %8 = buffer %7 depth=2 : f32[64, 64]
//                                                     stage s2: store=16.0 KiB
//                                                       store_tile C[64*i1, 64*i2], %8
//                                                     buffer b0 %6 : f32[128, 64] s0 -> s1 depth=2 (64.0 KiB)
//                                                     buffer b1 %8 : f32[64, 64] s1 -> s2 depth=2 (32.0 KiB)
//                                                     graph s0->s1 s1->s2
//                                                   }
//
// Stage rule, in program order: loads (LoadTile, Gather and what only indexes them) form a stage; a
// MatMul starts a stage (element-wise work after it joins it); element work after loads starts a stage;
// the update of a loop-carried value after a MatMul starts a stage; stores start a stage; a nested
// METAPIPE is a stage of its own; a BUFFER ends its stage. Then every node that reads or produces a
// loop-carried value is merged into one stage (the recurrence cannot be split across stages).
#include "passes/metapipeline.h"

#include <algorithm>
#include <map>
#include <set>

#include "ir/analysis.h"

namespace mp::passes {
namespace {

using namespace ir;

enum class Cls { Load, MatMul, Elem, Store, Loop, Buffer };

Cls classify(const Node& n) {
  switch (n.kind) {
    case NodeKind::LoadTile:
    case NodeKind::Gather:
      return Cls::Load;
    case NodeKind::MatMul:
      return Cls::MatMul;
    case NodeKind::StoreTile:
    case NodeKind::Scatter:
      return Cls::Store;
    case NodeKind::MetaPipe:
      return Cls::Loop;
    case NodeKind::Buffer:
      return Cls::Buffer;
    default:
      return Cls::Elem;
  }
}

void schedule(MetaPipe& m, const MetapipelineOptions& opt);

void schedule_list(std::vector<NodeRef>& list, const MetapipelineOptions& opt) {
  for (auto& n : list)
    if (auto* m = n->as<MetaPipe>()) schedule(*m, opt);
}

void schedule(MetaPipe& m, const MetapipelineOptions& opt) {
  std::vector<NodeRef> ops = m.body();
  schedule_list(ops, opt);  // nested loops first (they are nodes of this body)

  std::set<int> carried_args, carried_next;
  for (auto& c : m.carried) carried_args.insert(c.arg->id), carried_next.insert(c.next->id);
  // Values that depend on a carried value (transitively, within this body).
  std::set<int> state_dep = carried_args;
  std::vector<bool> touches_state(ops.size(), false);
  for (size_t i = 0; i < ops.size(); ++i) {
    bool dep = false;
    auto reads_i = reads_of(*ops[i]);
    for (auto& v : reads_i) dep = dep || state_dep.count(v->id);
    if (dep && ops[i]->out) state_dep.insert(ops[i]->out->id);
    if (auto* inner = ops[i]->as<MetaPipe>(); inner && dep)
      for (auto& c : inner->carried) state_dep.insert(c.result->id);
    bool reads = false;
    for (auto& v : reads_i) reads = reads || carried_args.count(v->id);
    bool defines = ops[i]->out && carried_next.count(ops[i]->out->id);
    if (auto* inner = ops[i]->as<MetaPipe>())
      for (auto& c : inner->carried) defines = defines || carried_next.count(c.result->id);
    touches_state[i] = reads || defines;
  }

  // 1. Greedy stage assignment.
  std::vector<int> stage_of_op(ops.size(), 0);
  int cur = 0;
  bool cur_empty = true, cur_has_load = false, cur_has_compute = false, cur_has_mm = false,
       cur_has_store = false, cur_closed = false;
  auto open_new = [&] {
    if (!cur_empty) ++cur;
    cur_empty = true;
    cur_has_load = cur_has_compute = cur_has_mm = cur_has_store = cur_closed = false;
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const Node& n = *ops[i];
    Cls c = classify(n);
    bool state_update = n.out && state_dep.count(n.out->id);
    if (cur_closed) open_new();
    switch (c) {
      case Cls::Load:
        if (cur_has_compute || cur_has_mm || cur_has_store) open_new();
        cur_has_load = true;
        break;
      case Cls::MatMul:
        if (!cur_empty) open_new();
        cur_has_mm = true;
        break;
      case Cls::Elem: {
        if (n.kind == NodeKind::Fill && cur_empty) break;
        // The accumulate step after an outer product / matmul (slide 50's fourth stage) gets its own stage
        // unless the matmul is itself part of the recurrence.
        bool mm_is_state = false;
        for (size_t k = 0; k < i; ++k)
          if (stage_of_op[k] == cur && ops[k]->kind == NodeKind::MatMul && state_dep.count(ops[k]->out->id))
            mm_is_state = true;
        if (cur_has_load || cur_has_store || (cur_has_mm && state_update && !mm_is_state)) open_new();
        cur_has_compute = true;
        break;
      }
      case Cls::Store:
        if (!cur_empty && !(cur_has_store && !cur_has_compute && !cur_has_mm && !cur_has_load)) open_new();
        cur_has_store = true;
        break;
      case Cls::Loop:
        if (!cur_empty) open_new();
        cur_closed = true;
        break;
      case Cls::Buffer:
        cur_closed = true;  // the buffer is the producer stage's output
        break;
    }
    stage_of_op[i] = cur;
    cur_empty = false;
  }

  // 2. The recurrence stays in one stage: merge the stages from the first to the last node that reads
  // or produces a loop-carried value.
  int lo = -1, hi = -1;
  for (size_t i = 0; i < ops.size(); ++i)
    if (touches_state[i]) {
      if (lo < 0) lo = stage_of_op[i];
      hi = stage_of_op[i];
    }
  if (lo >= 0)
    for (auto& s : stage_of_op)
      if (s > lo) s = s <= hi ? lo : s - (hi - lo);

  // 3. Stages in order, empty ones dropped.
  int nstages = ops.empty() ? 1 : stage_of_op.back() + 1;
  std::vector<Stage> stages(static_cast<size_t>(nstages));
  for (size_t i = 0; i < ops.size(); ++i) stages[size_t(stage_of_op[i])].ops.push_back(ops[i]);
  // A Fill (a constant tile) moves to the stage of its first reader: constants are generated where they
  // are used instead of streaming through a buffer.
  std::vector<long> moved_in(stages.size(), 0);
  for (size_t st = 0; st < stages.size(); ++st)
    for (size_t k = 0; k < stages[st].ops.size();) {
      NodeRef n = stages[st].ops[k];
      size_t first = stages.size();
      if (n->kind == NodeKind::Fill)
        for (size_t t = st; t < stages.size() && first == stages.size(); ++t)
          for (auto& user : stages[t].ops)
            for (auto& v : reads_of(*user))
              if (v->id == n->out->id) first = t;
      if (first == stages.size() || first == st) {
        ++k;
        continue;
      }
      stages[st].ops.erase(stages[st].ops.begin() + long(k));
      stages[first].ops.insert(stages[first].ops.begin() + moved_in[first]++, n);
    }
  std::erase_if(stages, [](const Stage& s) { return s.ops.empty(); });
  if (stages.empty()) stages.push_back({});
  for (size_t s = 0; s < stages.size(); ++s) {
    stages[s].name = "s" + std::to_string(s);
    stages[s].work = work_of(stages[s].ops);
  }

  // 4. Buffers: one per value read in a later stage than its producer; one state buffer per carried value.
  std::map<int, int> def_stage;
  std::map<int, Value> def_value;
  std::map<int, int> explicit_depth;
  for (size_t s = 0; s < stages.size(); ++s)
    for (auto& n : stages[s].ops) {
      if (n->out) def_stage[n->out->id] = int(s), def_value[n->out->id] = n->out;
      if (auto* b = n->as<Buffer>()) explicit_depth[b->out->id] = b->depth;
      if (auto* inner = n->as<MetaPipe>())
        for (auto& c : inner->carried) def_stage[c.result->id] = int(s), def_value[c.result->id] = c.result;
    }
  std::map<int, std::set<int>> consumers;
  for (size_t s = 0; s < stages.size(); ++s)
    for (auto& n : stages[s].ops)
      for (auto& v : reads_of(*n)) {
        auto it = def_stage.find(v->id);
        if (it != def_stage.end() && it->second != int(s)) consumers[v->id].insert(int(s));
      }
  std::vector<BufferInfo> buffers;
  int state_stage = lo >= 0 ? lo : int(stages.size()) - 1;
  // After dropping empty stages, find the stage holding the recurrence by its nodes.
  for (size_t s = 0; s < stages.size(); ++s)
    for (auto& n : stages[s].ops) {
      for (auto& v : reads_of(*n))
        if (carried_args.count(v->id)) state_stage = int(s);
      if (n->out && carried_next.count(n->out->id)) state_stage = int(s);
    }
  for (auto& [vid, cons] : consumers) {
    BufferInfo b;
    b.kind = BufferInfo::Kind::Stream;
    b.value = def_value[vid];
    b.producer = def_stage[vid];
    b.consumers.assign(cons.begin(), cons.end());
    b.depth = explicit_depth.count(vid) ? explicit_depth[vid] : opt.depth;
    b.slot_bytes = b.value->bytes();
    buffers.push_back(b);
  }
  std::sort(buffers.begin(), buffers.end(), [](const BufferInfo& a, const BufferInfo& b) {
    return a.producer != b.producer ? a.producer < b.producer : a.value->id < b.value->id;
  });
  for (auto& c : m.carried) {
    BufferInfo b;
    b.kind = BufferInfo::Kind::State;
    b.value = c.arg;
    b.producer = state_stage;
    b.consumers = {state_stage};
    b.depth = 1;
    b.slot_bytes = c.arg->bytes();
    buffers.push_back(b);
  }
  for (size_t i = 0; i < buffers.size(); ++i) buffers[i].name = "b" + std::to_string(i);

  m.stages = std::move(stages);
  m.buffers = std::move(buffers);
  m.scheduled = true;
}

}  // namespace

ir::Program metapipeline(const ir::Program& p, const MetapipelineOptions& opt) {
  MP_USER_CHECK(opt.depth >= 1, "metapipeline: buffer depth must be >= 1, got ", opt.depth);
  MP_USER_CHECK(p.tiled, "metapipeline: program '", p.name, "' must be tiled first (run the tile pass)");
  Program q = p.clone();
  schedule_list(q.body, opt);
  q.metapipelined = true;
  return q;
}

}  // namespace mp::passes
