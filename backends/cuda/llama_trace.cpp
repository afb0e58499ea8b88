// The trace of one position of the GPU Llama engine, summarized per operation role: where a token's time
// goes between the operations' own work and the hand-offs between them (plain C++, tested without a GPU).
#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "backends/cuda/llama_gpu.h"
#include "core/error.h"

namespace mp::cuda {

std::string op_role(const LlamaSchedule& s, int32_t op) {
  MP_USER_CHECK(op >= 0 && op < int32_t(s.ops.size()), "op_role: op ", op, " of ", s.ops.size());
  const GpuOp& o = s.ops[size_t(op)];
  if (o.kind != OpKind::gemv || o.weight < 0) return to_string(o.kind);
  std::string n = s.weights[size_t(o.weight)].name;
  if (n.rfind("blk.", 0) == 0) n = n.substr(std::min(n.size(), n.find('.', 4) + 1));
  if (n.size() > 7 && n.compare(n.size() - 7, 7, ".weight") == 0) n.resize(n.size() - 7);
  return n;
}

namespace {

struct OpTimes {
  uint64_t first_fetch = ~0ull, first_ready = ~0ull, last_end = 0;
  double wait = 0, run = 0;  // summed over the tasks
};

std::vector<OpTimes> per_op(const LlamaSchedule& s, const std::vector<TaskTime>& t) {
  MP_USER_CHECK(t.size() == s.tasks.size(), "trace: ", t.size(), " task times for ", s.tasks.size(), " tasks");
  std::vector<OpTimes> ops(s.ops.size());
  for (size_t i = 0; i < t.size(); ++i) {
    OpTimes& o = ops[size_t(s.tasks[i].op)];
    const TaskTime& x = t[i];
    MP_USER_CHECK(x.fetched <= x.ready && x.ready <= x.finished, "trace: task ", i,
                  " has its times out of order (fetched ", x.fetched, ", ready ", x.ready, ", finished ",
                  x.finished, ")");
    o.first_fetch = std::min(o.first_fetch, x.fetched);
    o.first_ready = std::min(o.first_ready, x.ready);
    o.last_end = std::max(o.last_end, x.finished);
    o.wait += double(x.ready - x.fetched);
    o.run += double(x.finished - x.ready);
  }
  return ops;
}

}  // namespace

std::string trace_summary(const LlamaSchedule& s, const std::vector<TaskTime>& times,
                          const std::vector<int64_t>& weight_bytes) {
  MP_USER_CHECK(weight_bytes.size() == s.ops.size(), "trace: ", weight_bytes.size(), " weight sizes for ",
                s.ops.size(), " ops");
  const std::vector<OpTimes> ops = per_op(s, times);
  uint64_t t0 = ~0ull, t1 = 0;
  for (auto& o : ops) t0 = std::min(t0, o.first_fetch), t1 = std::max(t1, o.last_end);
  struct Role {
    int n = 0, order = 0;
    double span = 0, lag = 0, wait = 0, run = 0, tasks = 0, bytes = 0;
  };
  std::map<std::string, Role> roles;
  int order = 0;
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const GpuOp& op = s.ops[i];
    const OpTimes& o = ops[i];
    uint64_t dep_end = o.first_ready;
    if (op.dep_count > 0) {
      dep_end = 0;
      for (int d = 0; d < op.dep_count; ++d)
        dep_end = std::max(dep_end, ops[size_t(s.deps[size_t(op.dep_begin + d)])].last_end);
    }
    auto [it, fresh] = roles.try_emplace(op_role(s, int32_t(i)));
    Role& r = it->second;
    if (fresh) r.order = order++;
    ++r.n;
    r.span += double(o.last_end - o.first_ready);
    // A producer's last publish and this op's first "ready" are read from different SMs' view of the
    // global timer; a hand-off shorter than its resolution can come out slightly negative.
    r.lag += double(int64_t(o.first_ready) - int64_t(dep_end));
    r.wait += o.wait, r.run += o.run, r.tasks += op.tasks;
    r.bytes += double(weight_bytes[i]);
  }
  std::vector<std::pair<std::string, Role>> sorted(roles.begin(), roles.end());
  std::sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) { return a.second.order < b.second.order; });
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "trace of one position: %.1f us from the first task taken to the last finished\n",
                double(t1 - t0) / 1e3);
  os << line;
  std::snprintf(line, sizeof line, "%-14s %4s %6s %10s %9s %11s %10s %9s\n", "role", "ops", "tasks", "span us",
                "lag us", "wait/task", "run/task", "GB/s");
  os << line;
  for (auto& [name, r] : sorted) {
    const double span = r.span / r.n / 1e3, lag = r.lag / r.n / 1e3;
    const double gbs = r.bytes > 0 && r.span > 0 ? r.bytes / r.span : 0.0;  // bytes per ns = GB/s
    std::snprintf(line, sizeof line, "%-14s %4d %6.0f %10.2f %9.2f %9.2fus %8.2fus %9s\n", name.c_str(), r.n,
                  r.tasks / r.n, span, lag, r.wait / r.tasks / 1e3, r.run / r.tasks / 1e3,
                  gbs > 0 ? std::to_string(int64_t(gbs + 0.5)).c_str() : "-");
    os << line;
  }
  os << "(span: the op's first task ready to its last finished; lag: its first task ready minus its last "
        "producer's end; means over the ops of a role)\n";
  return os.str();
}

std::string trace_csv(const LlamaSchedule& s, const std::vector<TaskTime>& times) {
  MP_USER_CHECK(times.size() == s.tasks.size(), "trace: ", times.size(), " task times for ", s.tasks.size(),
                " tasks");
  uint64_t t0 = ~0ull;
  for (auto& t : times) t0 = std::min(t0, t.fetched);
  std::ostringstream os;
  os << "op,role,layer,task,sm,fetched_ns,ready_ns,finished_ns\n";
  for (size_t i = 0; i < times.size(); ++i) {
    const GpuTask& k = s.tasks[i];
    const TaskTime& t = times[i];
    os << k.op << ',' << op_role(s, k.op) << ',' << s.ops[size_t(k.op)].layer << ',' << k.index << ',' << t.sm
       << ',' << t.fetched - t0 << ',' << t.ready - t0 << ',' << t.finished - t0 << '\n';
  }
  return os.str();
}

}  // namespace mp::cuda
