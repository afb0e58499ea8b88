// IR -> stage graph. Before (after the metapipeline pass, gda):
//   %6 = fill 0
//   %22 = metapipe i8 < 8 carry(%9 = %6) {
//     stage s0: %11 = load_tile X[128*i8, 0]; %13 = load_tile y[..]; %15 = gather mu[%13]
//     stage s1: %17 = zip(%11, %15)          stage s2: %19 = matmul %17^T, %17
//     stage s3: %21 = zip(%9, %19); yield %21 }
//   store_tile Sigma[0, 0], %22
// After: fill (1 iteration) -> [s3 reads it once per loop run]; load X, load y (8 iterations each) ->
// gather mu (reads y's tile) -> s1 -> s2 -> s3 (carries %9 itself) -> yield %22 (8 iterations, one token)
// -> store Sigma (1 iteration).
#include "backends/rdu/lower.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"
#include "ir/analysis.h"

namespace mp::rdu {
namespace {

struct Loop {
  ir::LoopVar var;
  int64_t trip;
};

// What a graph stage's kernel needs, aligned with Stage::inputs and Stage::outputs (null: control token).
struct SegInfo {
  std::vector<ir::Value> ins, outs;
};

// A value produced by a graph stage: its buffer (created on first use by another stage) and token count.
struct Src {
  int stage = -1;
  int buffer = -1;
  int64_t tokens = 0;
  int depth = 2;
  int64_t bytes = 0;
};

std::map<int, int64_t> decompose(const std::vector<Loop>& ls, int64_t it) {
  std::map<int, int64_t> idx;
  for (int k = int(ls.size()) - 1; k >= 0; --k) {
    idx[ls[size_t(k)].var->id] = it % ls[size_t(k)].trip;
    it /= ls[size_t(k)].trip;
  }
  return idx;
}

// ALU ops per element of an element function as the PCU pipeline computes it: a shared subexpression
// (the same node reached twice, e.g. d1 in BlackScholes' two CNDF calls) is computed once.
int64_t dag_ops(const ir::Expr& e) {
  std::set<const ir::ExprNode*> seen;
  int64_t n = 0;
  std::vector<const ir::ExprNode*> todo = {&e.node()};
  while (!todo.empty()) {
    const ir::ExprNode* x = todo.back();
    todo.pop_back();
    if (!seen.insert(x).second) continue;
    n += !x->kids.empty() || x->op == ir::ExprOp::Random;
    for (auto& k : x->kids) todo.push_back(k.get());
  }
  return std::max<int64_t>(n, 1);
}

int64_t elem_ops_of(const ir::Node& op) {
  auto els = [](const ir::Value& v) { return ir::num_elements(v->shape); };
  if (auto* m = op.as<ir::Map>()) return els(m->out) * dag_ops(m->f);
  if (auto* z = op.as<ir::Zip>()) return els(z->out) * dag_ops(z->f);
  if (auto* f = op.as<ir::Fill>()) return els(f->out) * dag_ops(f->f);
  if (auto* r = op.as<ir::Reduce>()) return els(r->in) * (1 + (r->pre ? dag_ops(*r->pre) : 0));
  return ir::work_of(op).elem_ops;
}

ir::TileRef tile_of(const std::shared_ptr<void>& p) { return std::static_pointer_cast<const ir::Tile>(p); }

class Lowerer {
 public:
  Lowerer(const ir::Program& p, ir::Memory* mem) : p_(p), mem_(mem) {
    g_.name = p.name;
    for (auto& t : p.tensors) tensor_id_[t->id] = g_.add_tensor(t->name, t->bytes());
  }

  Graph run() {
    MP_USER_CHECK(p_.metapipelined, "program '", p_.name,
                  "' is not metapipelined: run the passes (tile, parallelize, ",
                  "metapipeline) before simulating it");
    for (auto& n : p_.body) {
      ++statement_;
      std::set<int> reads, writes;
      ir::walk({n}, [&](const ir::NodeRef& x, int) {
        if (auto a = ir::access_of(*x)) (a->store ? writes : reads).insert(a->tensor->id);
      });
      // RAW through off-chip memory between top-level statements: wait for the writer's last token.
      waits_.clear();
      for (int t : reads)
        for (auto& [tensor, stage] : last_writer_)
          if (tensor == t && std::find(waits_.begin(), waits_.end(), stage) == waits_.end())
            waits_.push_back(stage);
      // Phase: 1 + the deepest earlier statement this one waits for, through memory or through a value.
      phase_ = 0;
      for (int w : waits_) phase_ = std::max(phase_, g_.stages[size_t(w)].phase + 1);
      ir::walk({n}, [&](const ir::NodeRef& x, int) {
        for (auto& v : ir::reads_of(*x))
          if (auto it = phase_of_value_.find(v->id); it != phase_of_value_.end())
            phase_ = std::max(phase_, it->second + 1);
      });
      if (auto* m = n->as<ir::MetaPipe>()) {
        lower_loop(*m, {}, "");
        for (auto& c : m->carried) phase_of_value_[c.result->id] = phase_;
      } else {
        lower_segment({n}, {}, "");
      }
      if (n->out) phase_of_value_[n->out->id] = phase_;
      for (int t : writes)
        for (size_t s = 0; s < g_.stages.size(); ++s)
          if (g_.stages[s].kind == StageKind::Store && g_.stages[s].tensor == tensor_id_.at(t))
            last_writer_.push_back({t, int(s)});
    }
    g_.layout();
    return std::move(g_);
  }

 private:
  static int64_t iters(const std::vector<Loop>& loops) {
    int64_t n = 1;
    for (auto& l : loops) n *= l.trip;
    return n;
  }

  // A value `v` read by graph stage `consumer`: add the input edge (and the producer's output buffer).
  void connect(const ir::Value& v, int consumer) {
    auto it = src_.find(v->id);
    if (it == src_.end()) fail_internal("value %", v->id, " is read before the lowering saw its producer");
    Src& s = it->second;
    if (s.stage == consumer) return;
    if (s.buffer < 0) {
      s.buffer = g_.add_buffer("%" + std::to_string(v->id) + (v->name.empty() ? "" : " " + v->name),
                               std::max<int64_t>(4, s.bytes), s.depth);
      g_.stages[size_t(s.stage)].outputs.push_back(s.buffer);
      seg_[size_t(s.stage)]->outs.push_back(v);
    }
    for (auto& in : g_.stages[size_t(consumer)].inputs)
      if (in.buffer == s.buffer) return;
    const int64_t n = g_.stages[size_t(consumer)].iterations;
    MP_USER_CHECK(n % s.tokens == 0 && n >= s.tokens, "value %", v->id, " is produced ", s.tokens,
                  " times but read by stage '", g_.stages[size_t(consumer)].name, "' ", n, " times");
    g_.stages[size_t(consumer)].inputs.push_back({s.buffer, n / s.tokens});
    seg_[size_t(consumer)]->ins.push_back(v);
  }

  int new_stage(Stage s, const std::vector<Loop>& loops) {
    s.iterations = iters(loops);
    s.phase = phase_;
    s.statement = statement_;
    // Only the loads of a tensor an earlier statement wrote wait for it (and stores, which keep the
    // statement's writes after its reads); the statement's other loads, its weights, stream ahead as far
    // as their buffers allow, and its compute waits for its inputs anyway.
    const StageKind kind = s.kind;
    const int tensor = s.tensor;
    int id = g_.add_stage(std::move(s));
    seg_.push_back(std::make_shared<SegInfo>());
    // control tokens from earlier top-level statements that wrote what this statement reads: the writer
    // sends one token per iteration to a control stage that turns them into one "done" token
    for (int w : waits_) {
      if (kind == StageKind::Compute || (kind == StageKind::Load && g_.stages[size_t(w)].tensor != tensor))
        continue;
      auto it = done_.find(w);
      if (it == done_.end()) {
        int b = g_.add_buffer("written by " + g_.stages[size_t(w)].name, 4, 2);
        g_.buffers[size_t(b)].control = true;
        g_.stages[size_t(w)].outputs.push_back(b);
        seg_[size_t(w)]->outs.push_back(nullptr);
        Stage c;
        c.name = "done " + g_.stages[size_t(w)].name;
        c.ops = 0;
        c.iterations = g_.stages[size_t(w)].iterations;
        c.accumulate = c.iterations;
        c.inputs = {{b, 1}};
        c.phase = g_.stages[size_t(w)].phase;
        c.statement = g_.stages[size_t(w)].statement;
        int cb = g_.add_buffer("done " + g_.stages[size_t(w)].name, 4, 1);
        g_.buffers[size_t(cb)].control = true;
        c.outputs = {cb};
        if (mem_) c.kernel = [](StageIO& io) { *io.out_obj[0] = std::make_shared<int>(0); };
        g_.stages.push_back(c);
        seg_.push_back(std::make_shared<SegInfo>(SegInfo{{nullptr}, {nullptr}}));
        it = done_.emplace(w, cb).first;
      }
      g_.stages[size_t(id)].inputs.push_back({it->second, g_.stages[size_t(id)].iterations});
      seg_[size_t(id)]->ins.push_back(nullptr);
    }
    return id;
  }

  void lower_loop(const ir::MetaPipe& m, const std::vector<Loop>& loops, const std::string& path) {
    MP_USER_CHECK(m.scheduled, "MetaPipe #", m.id, " is not scheduled: run the metapipeline pass first");
    const std::string lp = path + "L" + std::to_string(m.id);
    auto inner = loops;
    inner.push_back({m.var, m.trip()});
    for (auto& b : m.buffers)
      if (b.kind == ir::BufferInfo::Kind::Stream) depth_of_[b.value->id] = b.depth;
    // Each carried value enters the body through a control stage: iteration t forwards `init` when t is the
    // first iteration of a loop run, else the `next` of iteration t - 1 (a buffer with one initial token),
    // so every reader of `arg`, nested loops included, gets it as an ordinary token stream.
    std::vector<int> carry_stage;
    for (auto& c : m.carried) {
      Stage cs;
      cs.name = lp + " carry %" + std::to_string(c.arg->id);
      cs.ops = 0;
      int id = new_stage(cs, inner);
      connect(c.init, id);
      src_[c.arg->id] = {id, -1, iters(inner), 2, c.arg->bytes()};
      carry_stage.push_back(id);
      if (mem_) {
        auto seg = seg_[size_t(id)];
        const int64_t trip = m.trip();
        const int init_id = c.init->id;
        g_.stages[size_t(id)].kernel = [seg, trip, init_id](StageIO& io) {
          bool first = io.iter % trip == 0;
          for (size_t k = 0; k < seg->ins.size(); ++k)
            if (seg->ins[k] && (seg->ins[k]->id == init_id) == first)
              for (size_t o = 0; o < seg->outs.size(); ++o)
                if (seg->outs[o]) *io.out_obj[o] = *io.in_obj[k];
        };
      }
    }
    for (auto& st : m.stages) {
      std::vector<ir::NodeRef> compute;
      auto flush = [&]() {
        if (!compute.empty()) lower_segment(compute, inner, lp + "." + st.name);
        compute.clear();
      };
      for (auto& op : st.ops) {
        if (op->as<ir::MetaPipe>()) {
          flush();
          lower_loop(op->cast<ir::MetaPipe>(), inner, lp + "." + st.name + "/");
        } else if (ir::access_of(*op)) {
          flush();
          lower_segment({op}, inner, lp + "." + st.name);
        } else {
          compute.push_back(op);
        }
      }
      flush();
    }
    for (size_t k = 0; k < m.carried.size(); ++k) {
      const ir::Carried& c = m.carried[k];
      auto it = src_.find(c.next->id);
      MP_INTERNAL_CHECK(it != src_.end(), "carried next %", c.next->id, " has no producer");
      int producer = it->second.stage, cs = carry_stage[k];
      int b = g_.add_buffer("%" + std::to_string(c.next->id) + " (loop-carried)",
                            std::max<int64_t>(4, c.next->bytes()), 2);
      g_.buffers[size_t(b)].initial_tokens = 1;
      g_.initial_data.resize(g_.buffers.size());
      g_.initial_data[size_t(b)].assign(size_t(g_.buffers[size_t(b)].elems()), 0.f);
      g_.stages[size_t(producer)].outputs.push_back(b);
      seg_[size_t(producer)]->outs.push_back(c.next);
      g_.stages[size_t(cs)].inputs.push_back({b, 1});
      seg_[size_t(cs)]->ins.push_back(c.next);
    }
    // Loop-carried results leave through a control stage that forwards the last iteration's `next`.
    for (auto& c : m.carried) {
      Stage y;
      y.name = lp + " yield %" + std::to_string(c.result->id);
      y.ops = 0;
      int id = new_stage(y, inner);
      connect(c.next, id);
      g_.stages[size_t(id)].accumulate = m.trip();
      src_[c.result->id] = {id, -1, iters(loops), 2, c.result->bytes()};
      if (mem_) {
        auto seg = seg_[size_t(id)];
        const int64_t trip = m.trip();
        const int next_id = c.next->id;
        g_.stages[size_t(id)].kernel = [seg, trip, next_id](StageIO& io) {
          if ((io.iter + 1) % trip != 0) return;  // the last iteration of each loop run is the result
          for (size_t k = 0; k < seg->ins.size(); ++k)
            if (seg->ins[k] && seg->ins[k]->id == next_id)
              for (size_t o = 0; o < seg->outs.size(); ++o)
                if (seg->outs[o]) *io.out_obj[o] = *io.in_obj[k];
        };
      }
    }
  }

  // A group of nodes run by one graph stage: one off-chip access, or consecutive compute nodes.
  void lower_segment(const std::vector<ir::NodeRef>& ops, const std::vector<Loop>& loops,
                     const std::string& path) {
    Stage s;
    const ir::Node& first = *ops.front();
    auto acc = ir::access_of(first);
    const std::string at = path.empty() ? "" : path + " ";
    if (acc) {
      s.kind = acc->store ? StageKind::Store : StageKind::Load;
      s.name = at + (acc->store ? "store " : "load ") + acc->tensor->name;
      s.tensor = tensor_id_.at(acc->tensor->id);
      s.access.rows = acc->runs;
      s.access.row_bytes = acc->run_bytes;
      s.access.row_stride = acc->stride_bytes;
      const ir::Tensor t = acc->tensor;
      std::vector<ir::Affine> offset;
      if (auto* l = first.as<ir::LoadTile>()) offset = l->offset;
      if (auto* st = first.as<ir::StoreTile>()) offset = st->offset;
      if (!offset.empty()) {
        std::vector<Loop> ls = loops;
        s.access.base = [t, offset, ls](int64_t it) {
          auto idx = decompose(ls, it);
          int64_t el = 0, stride = 1;
          for (int ax = int(t->shape.size()) - 1; ax >= 0; --ax) {
            int64_t o = offset[size_t(ax)].constant;
            for (auto& [var, coef] : offset[size_t(ax)].terms) o += coef * idx.at(var->id);
            el += o * stride;
            stride *= t->shape[size_t(ax)];
          }
          return el * ir::bytes_of(t->dtype);
        };
      } else {  // gather / scatter: rows picked at run time; spread them over the table for timing
        int64_t rows = t->shape[0], rb = acc->run_bytes;
        s.access.row_at = [rows, rb](int64_t it, int64_t r) {
          uint64_t h = uint64_t(it) * 0x9E3779B97F4A7C15ull ^ uint64_t(r) * 0xC2B2AE3D27D4EB4Full;
          h ^= h >> 29;
          return int64_t(h % uint64_t(rows)) * rb;
        };
      }
    } else {
      s.kind = StageKind::Compute;
      s.name = at + ir::to_string(first.kind) + (ops.size() > 1 ? "+" + std::to_string(ops.size() - 1) : "");
      int64_t elements = 0, elem_ops = 0;
      int par = 1, matmuls = 0;
      for (auto& op : ops) {
        par = std::max(par, op->par);
        if (auto* mm = op->as<ir::MatMul>()) {
          int64_t M = mm->out->shape[0], N = mm->out->shape[1], K = mm->a->shape[mm->transpose_a ? 0 : 1];
          if (matmuls++ == 0) {
            s.m = M, s.k = K, s.n = N;
          } else {  // several matmuls in one stage: their MACs on the first one's tile shape, SIMD only
            s.k += K * M * N / std::max<int64_t>(1, s.m * s.n);
            s.systolic_ok = false;
          }
          continue;
        }
        const int64_t ops_here = elem_ops_of(*op);
        elem_ops += ops_here;
        if (ops_here > 0) {
          int64_t e = op->out ? ir::num_elements(op->out->shape) : 0;
          if (auto* r = op->as<ir::Reduce>()) e = ir::num_elements(r->in->shape);
          elements = std::max(elements, e);
        }
      }
      s.elements = elements;
      s.ops = elements > 0 ? int((elem_ops + elements - 1) / elements) : 0;
      s.par = par;
    }
    const int id = new_stage(std::move(s), loops);
    std::set<int> produced_here;
    for (auto& op : ops) {
      for (auto& v : ir::reads_of(*op)) {
        if (produced_here.count(v->id)) continue;
        connect(v, id);
      }
      if (op->out) {
        produced_here.insert(op->out->id);
        int depth = depth_of_.count(op->out->id) ? depth_of_[op->out->id] : 2;
        src_[op->out->id] = {id, -1, g_.stages[size_t(id)].iterations, depth, op->out->bytes()};
      }
    }
    if (mem_) {
      auto seg = seg_[size_t(id)];
      ir::Memory* mem = mem_;
      std::vector<ir::NodeRef> nodes = ops;
      std::vector<Loop> ls = loops;
      g_.stages[size_t(id)].kernel = [seg, mem, nodes, ls](StageIO& io) {
        ir::Env env;
        auto idx = decompose(ls, io.iter);
        for (auto& l : ls) env.set_loop(l.var, idx.at(l.var->id));
        for (size_t k = 0; k < seg->ins.size(); ++k)
          if (seg->ins[k]) {
            MP_INTERNAL_CHECK(*io.in_obj[k] != nullptr, "functional rdu: an empty slot read for %",
                              seg->ins[k]->id);
            env.set(seg->ins[k], tile_of(*io.in_obj[k]));
          }
        std::map<int, ir::TileRef> made;
        for (auto& op : nodes) {
          ir::TileRef t = ir::eval_node(*op, env, *mem);
          if (op->out && t) env.set(op->out, t), made[op->out->id] = t;
        }
        for (size_t o = 0; o < seg->outs.size(); ++o)
          if (seg->outs[o])
            *io.out_obj[o] = std::const_pointer_cast<ir::Tile>(env.get(seg->outs[o]));
          else
            *io.out_obj[o] = std::make_shared<int>(0);  // control token
      };
    }
  }

  const ir::Program& p_;
  ir::Memory* mem_;
  Graph g_;
  std::vector<std::shared_ptr<SegInfo>> seg_;
  std::map<int, int> tensor_id_;
  std::map<int, Src> src_;
  std::map<int, int> depth_of_;
  std::vector<std::pair<int, int>> last_writer_;  // (tensor id, store stage)
  std::vector<int> waits_;
  int phase_ = 0;       // of the top-level statement being lowered
  int statement_ = -1;  // its index in the body
  std::map<int, int> phase_of_value_;  // values of top-level statements -> the statement's phase
  std::map<int, int> done_;  // writer stage -> its "done" buffer
};

}  // namespace

Graph lower(const ir::Program& p, ir::Memory* mem) { return Lowerer(p, mem).run(); }

}  // namespace mp::rdu
