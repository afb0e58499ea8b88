// The metapipelined executor: one thread per stage per loop invocation, bounded queues as N-buffers,
// stall and busy accounting per stage, clean shutdown (all threads joined) when a stage throws.
#include "backends/cpu/executor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/table.h"

namespace mp::cpu {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct Abort {
  std::atomic<bool> flag{false};
};

// One N-buffer as seen by one consumer: `depth` slots; the producer claims a slot before computing the
// iteration that fills it, the consumer frees it when it finishes the iteration that read it.
class Slots {
 public:
  Slots(size_t depth, Abort& ab) : depth_(depth), abort_(ab) {}
  // The producer claims a free slot before it computes into it (so `depth` tiles exist at most) ...
  void reserve() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return q_.size() + reserved_ < depth_ || abort_.flag; });
    if (abort_.flag) throw_abort();
    ++reserved_;
  }
  // ... and hands it over when the iteration is done.
  void push(TileRef t) {
    std::lock_guard lk(mu_);
    --reserved_;
    q_.push_back(std::move(t));
    cv_.notify_all();
  }
  TileRef front() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return !q_.empty() || abort_.flag; });
    if (abort_.flag) throw_abort();
    return q_.front();
  }
  void pop() {
    std::lock_guard lk(mu_);
    q_.pop_front();
    cv_.notify_all();
  }
  void wake() {
    std::lock_guard lk(mu_);
    cv_.notify_all();
  }

 private:
  struct Aborted {};
  [[noreturn]] static void throw_abort() { throw Aborted{}; }
  friend struct Runner;
  size_t depth_;
  Abort& abort_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TileRef> q_;
  size_t reserved_ = 0;
};

struct Interval {
  double a, b;
};

struct Runner {
  explicit Runner(Memory& m) : mem(m) {}
  Memory& mem;
  Clock::time_point t0 = Clock::now();
  std::mutex stats_mu;
  std::map<std::string, StageStats> stages;
  std::map<std::string, LoopStats> loops;
  std::vector<std::string> order;  // first-seen order of stage names

  void add_stage(const std::string& key, const std::string& ops, int64_t iters, double busy, double win,
                 double wout) {
    std::lock_guard lk(stats_mu);
    auto [it, fresh] = stages.try_emplace(key);
    if (fresh) order.push_back(key);
    auto& s = it->second;
    s.name = key;
    s.ops = ops;
    s.iterations += iters;
    s.busy_ms += busy;
    s.wait_in_ms += win;
    s.wait_out_ms += wout;
  }

  void run_list(const std::vector<ir::NodeRef>& nodes, Env& env, const std::string& path) {
    for (auto& n : nodes) {
      if (auto* m = n->as<ir::MetaPipe>()) {
        run_metapipe(*m, env, path);
        continue;
      }
      auto t = eval_node(*n, env, mem);
      if (n->out) env.set(n->out, std::move(t));
    }
  }

  static std::string describe(const ir::Stage& s) {
    std::string o;
    for (auto& n : s.ops) {
      std::string k = ir::to_string(n->kind);
      if (o.find(k) != std::string::npos) continue;
      o += (o.empty() ? "" : ", ") + k;
    }
    return o;
  }

  void run_metapipe(const ir::MetaPipe& m, Env& env, const std::string& path) {
    MP_USER_CHECK(m.scheduled, m.where(), " has not been metapipelined; run the metapipeline pass first");
    std::string here = (path.empty() ? "" : path + "/") + "L" + std::to_string(m.id);
    size_t S = m.stages.size();
    Abort abort;
    // Channels: (buffer, consumer) -> slots.
    struct In {
      ir::Value v;
      Slots* slots;
    };
    std::vector<std::vector<In>> inputs(S);
    std::vector<std::vector<std::pair<ir::Value, Slots*>>> outputs(S);
    std::vector<std::unique_ptr<Slots>> all;
    int state_stage = -1;
    for (auto& b : m.buffers) {
      if (b.kind == ir::BufferInfo::Kind::State) {
        state_stage = b.producer;
        continue;
      }
      for (int c : b.consumers) {
        all.push_back(std::make_unique<Slots>(size_t(std::max(1, b.depth)), abort));
        inputs[c].push_back({b.value, all.back().get()});
        outputs[b.producer].push_back({b.value, all.back().get()});
      }
    }
    if (!m.carried.empty() && state_stage < 0) state_stage = int(S) - 1;
    std::vector<TileRef> state;
    for (auto& c : m.carried) state.push_back(env.get(c.init));

    std::vector<std::vector<Interval>> busy(S);
    std::vector<std::exception_ptr> errors(S);
    auto start = Clock::now();
    auto stage_fn = [&](size_t s) {
      double b_ms = 0, win = 0, wout = 0;
      int64_t iters = 0;
      try {
        for (int64_t i = 0; i < m.trip(); ++i) {
          Env it(&env);
          it.set_loop(m.var, i);
          auto w0 = Clock::now();
          for (auto& in : inputs[s]) it.set(in.v, in.slots->front());
          auto wr = Clock::now();
          win += ms_since(w0, wr);
          for (auto& out : outputs[s]) out.second->reserve();
          auto w1 = Clock::now();
          wout += ms_since(wr, w1);
          if (int(s) == state_stage)
            for (size_t k = 0; k < m.carried.size(); ++k) it.set(m.carried[k].arg, state[k]);
          run_list(m.stages[s].ops, it, here + ".s" + std::to_string(s));
          auto w2 = Clock::now();
          b_ms += ms_since(w1, w2);
          busy[s].push_back({ms_since(t0, w1), ms_since(t0, w2)});
          if (int(s) == state_stage)
            for (size_t k = 0; k < m.carried.size(); ++k) state[k] = it.get(m.carried[k].next);
          for (auto& [v, slots] : outputs[s]) slots->push(it.get(v));
          for (auto& in : inputs[s]) in.slots->pop();
          ++iters;
        }
      } catch (const Slots::Aborted&) {
        // another stage failed; its error is reported
      } catch (...) {
        errors[s] = std::current_exception();
        abort.flag = true;
        for (auto& sl : all) sl->wake();
      }
      add_stage(here + ".s" + std::to_string(s), describe(m.stages[s]), iters, b_ms, win, wout);
    };
    if (S == 1) {
      stage_fn(0);
    } else {
      std::vector<std::thread> threads;
      for (size_t s = 0; s < S; ++s) threads.emplace_back(stage_fn, s);
      for (auto& t : threads) t.join();
    }
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    double wall = ms_since(start, Clock::now());
    for (size_t k = 0; k < m.carried.size(); ++k) env.set(m.carried[k].result, state[k]);

    // Overlap: sweep over the stages' busy intervals, counting time with >= 2 stages busy.
    std::vector<std::pair<double, int>> ev;
    double busy_sum = 0;
    for (auto& v : busy)
      for (auto& iv : v) ev.push_back({iv.a, +1}), ev.push_back({iv.b, -1}), busy_sum += iv.b - iv.a;
    std::sort(ev.begin(), ev.end());
    double overlap = 0;
    int active = 0;
    for (size_t i = 0; i < ev.size(); ++i) {
      if (i && active >= 2) overlap += ev[i].first - ev[i - 1].first;
      active += ev[i].second;
    }
    std::lock_guard lk(stats_mu);
    auto& L = loops[here];
    L.name = here;
    L.stages = int(S);
    if (L.invocations == 0) {
      double origin = ms_since(t0, start);
      L.first_run_ms = wall;
      L.first_run.resize(S);
      for (size_t st = 0; st < S; ++st)
        for (auto& iv : busy[st]) L.first_run[st].push_back({iv.a - origin, iv.b - origin});
    }
    L.invocations += 1;
    L.wall_ms += wall;
    L.busy_sum_ms += busy_sum;
    L.overlap_ms += overlap;
  }
};

}  // namespace

ExecReport execute(const ir::Program& p, Memory& mem) {
  MP_USER_CHECK(p.metapipelined, "program '", p.name,
                "' has not been metapipelined; compile it with the metapipeline pass before executing it");
  Runner r(mem);
  Env env;
  auto t0 = Clock::now();
  r.run_list(p.body, env, "");
  ExecReport rep;
  rep.wall_ms = ms_since(t0, Clock::now());
  for (auto& k : r.order) rep.stages.push_back(r.stages[k]);
  for (auto& [k, l] : r.loops) rep.loops.push_back(l);
  return rep;
}

std::string ExecReport::format() const {
  auto f = [](double ms) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3f", ms);
    return std::string(b);
  };
  std::ostringstream os;
  Table t({"stage", "nodes", "iterations", "busy ms", "stall in ms", "stall out ms"});
  for (auto& s : stages)
    t.add({s.name, s.ops, std::to_string(s.iterations), f(s.busy_ms), f(s.wait_in_ms), f(s.wait_out_ms)});
  t.print(os);
  os << "\n";
  Table l({"loop", "stages", "runs", "wall ms", "sum of stage busy ms", "overlapped ms (>= 2 stages busy)"});
  for (auto& x : loops)
    l.add({x.name, std::to_string(x.stages), std::to_string(x.invocations), f(x.wall_ms), f(x.busy_sum_ms),
           f(x.overlap_ms)});
  l.print(os);
  // A timeline of each loop's first run: one row per stage, '#' where the stage was busy.
  const int W = 64;
  for (auto& x : loops) {
    if (x.first_run_ms <= 0 || x.stages < 2) continue;
    os << "\ntimeline of " << x.name << " (first run, 0 .. " << f(x.first_run_ms) << " ms, # = busy):\n";
    for (size_t st = 0; st < x.first_run.size(); ++st) {
      std::string row(W, '.');
      for (auto [a, b] : x.first_run[st]) {
        int c0 = std::clamp(int(a / x.first_run_ms * W), 0, W - 1);
        int c1 = std::clamp(int(b / x.first_run_ms * W), c0, W - 1);
        for (int c = c0; c <= c1; ++c) row[c] = '#';
      }
      os << "  s" << st << (st < 10 ? " " : "") << " |" << row << "|\n";
    }
  }
  os << "total wall " << f(wall_ms) << " ms\n";
  return os.str();
}

}  // namespace mp::cpu
