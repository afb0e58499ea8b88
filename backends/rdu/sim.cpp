// Event-driven simulation of one configuration. Time is in fabric cycles (double: DRAM timing is in ns).
#include "backends/rdu/sim.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <queue>
#include <unordered_map>

#include "core/checked.h"
#include "core/error.h"

namespace mp::rdu {
namespace {

enum EvType : int {
  TRY,
  RELEASE,
  DONE,
  AGCU_ISSUE,
  CHAN_SERVE,
  BURST_DONE,
  CHAN_DONE_HEAD,
  RELEASE_TRY,
  DONE_REGISTER  // a compute stage's accumulator-register outputs (Buffer::in_register)
};

struct Ev {
  double t;
  uint64_t seq;
  int type;
  int a;
  int64_t b;
  bool operator>(const Ev& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

// A 4-ary min-heap of events by (time, sequence): half the depth of a binary heap, and the four
// children of a node share a cache line or two. (time, sequence) is a strict total order, so the order in
// which events come out is the same as from any other priority queue.
class EventHeap {
 public:
  bool empty() const { return v_.empty(); }
  size_t size() const { return v_.size(); }
  const Ev& top() const { return v_.front(); }
  void push(const Ev& e) {
    size_t i = v_.size();
    v_.push_back(e);
    while (i > 0) {
      const size_t parent = (i - 1) / 4;
      if (!(v_[parent] > e)) break;
      v_[i] = v_[parent];
      i = parent;
    }
    v_[i] = e;
  }
  void pop() {
    const Ev last = v_.back();
    v_.pop_back();
    const size_t n = v_.size();
    if (n == 0) return;
    size_t i = 0;
    for (;;) {
      const size_t c = 4 * i + 1;
      if (c >= n) break;
      size_t best = c;
      const size_t end = std::min(c + 4, n);
      for (size_t k = c + 1; k < end; ++k)
        if (v_[best] > v_[k]) best = k;
      if (!(last > v_[best])) break;
      v_[i] = v_[best];
      i = best;
    }
    v_[i] = last;
  }

 private:
  std::vector<Ev> v_;
};

struct Req {
  int stage;
  int64_t iter;
  int64_t addr;  // channel-local address
  bool write;
  double arrival;
  bool last_of_iter;  // stores: the iteration's data has left the PMU once this one is issued
};

struct Channel {
  std::deque<Req> queue;
  std::deque<Ev> done;  // bursts on the bus or returning, in completion order
  double bus_free = 0;
  bool serve_pending = false;
  bool last_write = false;
  double next_refresh = 0;
  int owed = 0;  // refreshes due and postponed (Memory::refresh_postpone)
  std::vector<int64_t> open_row;
  std::vector<double> bank_free;
  // Per-bank refresh (Memory::refresh_bank_ns > 0): when each bank's next refresh falls due, how many it
  // owes, and when the channel issued its latest per-bank refresh command (tRREFD spacing).
  std::vector<double> bank_due;
  std::vector<int> bank_owed;
  std::vector<int> bank_queued;  // queued requests per bank
  int owed_banks = 0;            // banks that owe a refresh
  double refresh_cmd = -1e300;
};

struct Agcu {
  std::deque<Req> queue;  // addr here is the global address
  int outstanding = 0;
  bool issue_pending = false;
  double last_issue = -1;
  double issue_gap = 1;  // cycles between issue rounds
  int per_round = 1;     // bursts one round issues: the stream's AGCUs each issue one per cycle
  int max_outstanding = 1;
  int inflight_iters = 0;
  double busy_since = 0;
};

struct StageState {
  int64_t next = 0;      // next iteration to start
  int64_t finished = 0;  // iterations whose outputs are complete
  double busy_until = 0;
  double idle_from = 0;  // when the stage became able to start again
  int last_block = 0;    // 1 input, 2 output
  bool try_pending = false;
  double try_at = -1;
  std::unordered_map<int64_t, int64_t> bursts_left;  // loads/stores: per iteration in flight
  int agcu = -1;
  double inflight_since = 0;
  int inflight = 0;
};

struct BufState {
  int64_t avail = 0;  // tokens complete (initial tokens included)
  int producer = -1;
  std::vector<int> consumers;
  std::vector<int> input_index;             // per consumer entry: which input of the consumer
  std::vector<int64_t> released;            // per consumer entry: tokens fully read
  std::vector<int64_t> done_ahead;          // tokens completed out of order (beyond avail)
  std::vector<float> data;                  // functional: depth x elems
  std::vector<std::shared_ptr<void>> objs;  // functional: one object per slot
};

class Sim {
 public:
  Sim(const Arch& a, Config& c, const SimOptions& o)
      : a_(a), cfg_(c), g_(c.graph), opt_(o), mem_(a.memory()) {
    const double ghz = a.clock_ghz;
    burst_cycles_ = mem_.burst_bytes / (mem_.channel_gbs / ghz);  // bytes / (bytes per cycle)
    latency_ = mem_.latency_ns * ghz;
    row_miss_ = mem_.row_miss_ns * ghz;
    refresh_int_ = mem_.refresh_interval_ns * ghz;
    refresh_ = mem_.refresh_ns * ghz;
    turn_ = mem_.turnaround_ns * ghz;
    per_bank_ = mem_.refresh_bank_ns > 0 && refresh_int_ > 0;
    refresh_bank_ = mem_.refresh_bank_ns * ghz;
    refresh_gap_ = mem_.refresh_bank_gap_ns * ghz;
    chans_.resize(mem_.channels);
    want_.assign(mem_.banks, 0);
    for (auto& ch : chans_) {
      ch.open_row.assign(mem_.banks, -1);
      ch.bank_free.assign(mem_.banks, 0);
      ch.next_refresh = refresh_int_ > 0 ? refresh_int_ : 1e300;
      if (per_bank_) {
        // bank b's refreshes fall due at (b + 1) / banks of the interval, then once per interval
        ch.bank_due.resize(mem_.banks);
        for (int b = 0; b < mem_.banks; ++b) ch.bank_due[b] = refresh_int_ * (b + 1) / mem_.banks;
        ch.bank_owed.assign(mem_.banks, 0);
        ch.bank_queued.assign(mem_.banks, 0);
        ch.next_refresh = ch.bank_due[0];
      }
    }
    st_.resize(g_.stages.size());
    has_register_output_.assign(g_.stages.size(), false);
    register_run_.assign(g_.stages.size(), 0);
    for (size_t s = 0; s < g_.stages.size(); ++s)
      for (int b : g_.stages[s].outputs)
        if (g_.buffers[size_t(b)].in_register && g_.stages[s].kind == StageKind::Compute) {
          has_register_output_[s] = true;
          for (int c : g_.consumers_of(b))
            if (g_.stages[size_t(c)].accumulate > 1) register_run_[s] = g_.stages[size_t(c)].accumulate;
        }
    bs_.resize(g_.buffers.size());
    for (size_t b = 0; b < g_.buffers.size(); ++b) {
      bs_[b].avail = g_.buffers[b].initial_tokens;
      bs_[b].producer = g_.producer_of(int(b));
    }
    for (size_t s = 0; s < g_.stages.size(); ++s)
      for (size_t k = 0; k < g_.stages[s].inputs.size(); ++k) {
        int b = g_.stages[s].inputs[k].buffer;
        bs_[b].consumers.push_back(int(s));
        bs_[b].input_index.push_back(int(k));
        bs_[b].released.push_back(0);
      }
    int next_agcu = 0;
    for (size_t s = 0; s < g_.stages.size(); ++s)
      if (g_.stages[s].kind != StageKind::Compute) st_[s].agcu = next_agcu++;
    ag_.resize(std::max(next_agcu, 1));
    // A stream served by k AGCUs issues k bursts per cycle (one round of k, one event) with k times the
    // outstanding requests.
    for (size_t s = 0; s < g_.stages.size(); ++s)
      if (st_[s].agcu >= 0) {
        int k = std::max(1, cfg_.stages[s].agcus);
        ag_[st_[s].agcu].per_round = k;
        ag_[st_[s].agcu].max_outstanding = k * a_.agcu_outstanding;
      }
    if (opt_.functional) {
      for (size_t b = 0; b < g_.buffers.size(); ++b) {
        const Buffer& buf = g_.buffers[b];
        bs_[b].data.assign(size_t(buf.depth) * buf.elems(), std::nanf(""));
        bs_[b].objs.assign(size_t(buf.depth), nullptr);
        if (buf.initial_tokens > 0) {
          MP_INTERNAL_CHECK(b < g_.initial_data.size() &&
                                int64_t(g_.initial_data[b].size()) == buf.initial_tokens * buf.elems(),
                            "buffer '", buf.name, "' has initial tokens but no initial data");
          for (int64_t t = 0; t < buf.initial_tokens; ++t)
            std::copy_n(g_.initial_data[b].begin() + t * buf.elems(), buf.elems(),
                        bs_[b].data.begin() + (t % buf.depth) * buf.elems());
        }
      }
    }
    res_.stages.resize(g_.stages.size());
    for (size_t s = 0; s < g_.stages.size(); ++s) {
      auto& ss = res_.stages[s];
      const Stage& S = g_.stages[s];
      ss.name = S.name;
      ss.kind = to_string(S.kind);
      ss.mode = cfg_.stages[s].mode;
      ss.pcus = cfg_.stages[s].pcus;
      ss.iterations = S.iterations;
      ss.ii = cfg_.stages[s].ii;
      ss.first_start = -1;
    }
  }

  ConfigResult run() {
    for (size_t s = 0; s < g_.stages.size(); ++s) push(0, TRY, int(s), 0);
    // No input may stall the loop: it stops, as metapipe's own error, well past the events the graph
    // can need (estimate_events counts them from the stage iterations and bursts).
    const int64_t cap = add_sat(mul_sat(estimate_events(a_, g_), 64), 1000000);
    while (!q_.empty() || now_head_ < now_q_.size()) {
      if (res_.events >= cap)
        fail_internal("simulation of '", g_.name, "' did not finish within ", cap,
                      " events (estimated from its stages); the event loop is stuck");
      Ev e = pop();
      now_ = e.t;
      ++res_.events;
      if (opt_.progress && (res_.events & 0xfff) == 0) report_progress();
      switch (e.type) {
        case TRY:
          st_[e.a].try_pending = false;
          try_fire(e.a);
          break;
        case RELEASE:
          release(e.a, e.b);
          break;
        case RELEASE_TRY:
          release(e.a, e.b);
          st_[e.a].try_pending = false;
          try_fire(e.a);
          break;
        case DONE:
          complete(e.a, e.b);
          break;
        case DONE_REGISTER:
          complete_outputs(e.a, e.b, true);
          break;
        case AGCU_ISSUE:
          ag_[e.a].issue_pending = false;
          agcu_issue(e.a);
          break;
        case CHAN_SERVE:
          chans_[e.a].serve_pending = false;
          serve(e.a);
          break;
        case BURST_DONE:
          burst_done(e.a, e.b);
          break;
        case CHAN_DONE_HEAD: {
          auto& dq = chans_[e.a].done;
          const Ev d = dq.front();
          dq.pop_front();
          if (!dq.empty()) q_.push({dq.front().t, dq.front().seq, CHAN_DONE_HEAD, e.a, 0});
          burst_done(d.a, d.b);
          break;
        }
      }
    }
    for (size_t s = 0; s < g_.stages.size(); ++s) {
      if (st_[s].finished != g_.stages[s].iterations) {
        std::string detail;
        for (size_t k = 0; k < g_.stages.size(); ++k)
          detail += "\n  " + g_.stages[k].name + ": started " + std::to_string(st_[k].next) + ", finished " +
                    std::to_string(st_[k].finished) + " of " + std::to_string(g_.stages[k].iterations);
        fail_internal("simulation of '", g_.name, "' deadlocked at cycle ", int64_t(now_), " (stage '",
                      g_.stages[s].name, "' cannot proceed):", detail);
      }
    }
    res_.cycles = end_;
    for (size_t s = 0; s < g_.stages.size(); ++s) {
      res_.pcu_busy += res_.stages[s].busy * cfg_.stages[s].pcus;
      if (g_.stages[s].kind != StageKind::Compute)
        res_.agcu_busy += res_.stages[s].busy * std::max(1, cfg_.stages[s].agcus);
    }
    return std::move(res_);
  }

 private:
  // Events are processed in (time, sequence) order. Most are scheduled for the current cycle (a stage
  // trying again as soon as a token arrives or a slot frees); those go to a FIFO instead of the heap. Every
  // event of the FIFO has the same time and a later sequence number than any in the heap then, so taking
  // the smaller of the two heads keeps exactly the order of one priority queue, at no heap cost.
  void push(double t, int type, int a, int64_t b) {
    if (t == now_ && (now_head_ == now_q_.size() || now_q_.back().t == t)) {
      if (now_head_ == now_q_.size()) now_q_.clear(), now_head_ = 0;
      now_q_.push_back({t, seq_++, type, a, b});
      return;
    }
    q_.push({t, seq_++, type, a, b});
  }
  Ev pop() {
    if (now_head_ < now_q_.size() && (q_.empty() || q_.top() > now_q_[now_head_])) return now_q_[now_head_++];
    Ev e = q_.top();
    q_.pop();
    return e;
  }

  void schedule_try(int s, double t) {
    auto& S = st_[s];
    if (S.try_pending && S.try_at <= t) return;
    S.try_pending = true;
    S.try_at = t;
    push(t, TRY, s, 0);
  }

  int64_t out_token(int s, int64_t iter, int b) const {
    return g_.buffers[b].initial_tokens + iter / g_.stages[s].accumulate;
  }
  int64_t released_all(int b) const {
    int64_t r = INT64_MAX;
    for (auto x : bs_[b].released) r = std::min(r, x);
    return bs_[b].consumers.empty() ? INT64_MAX / 2 : r;
  }

  void try_fire(int s) {
    const Stage& S = g_.stages[s];
    auto& T = st_[s];
    if (T.next >= S.iterations) return;
    if (now_ < T.busy_until) return schedule_try(s, T.busy_until);
    int64_t i = T.next;
    for (auto& in : S.inputs)
      if (bs_[in.buffer].avail <= i / in.reuse) {
        T.last_block = 1;
        return;
      }
    if (i % S.accumulate == 0)
      for (int b : S.outputs)
        if (out_token(s, i, b) - released_all(b) >= g_.buffers[b].depth) {
          T.last_block = 2;
          return;
        }
    fire(s, i);
  }

  float* slot(int b, int64_t token) {
    return bs_[b].data.data() + (token % g_.buffers[b].depth) * g_.buffers[b].elems();
  }

  void run_kernel(int s, int64_t i) {
    const Stage& S = g_.stages[s];
    MP_USER_CHECK(bool(S.kernel), "--functional: stage '", S.name, "' has no functional kernel");
    StageIO io;
    io.iter = i;
    for (auto& in : S.inputs) {
      int64_t tok = i / in.reuse;  // initial tokens are the first ones
      io.in.push_back(slot(in.buffer, tok));
      io.in_obj.push_back(&bs_[in.buffer].objs[size_t(tok % g_.buffers[in.buffer].depth)]);
    }
    for (int b : S.outputs) {
      int64_t tok = out_token(s, i, b);
      io.out.push_back(slot(b, tok));
      io.out_obj.push_back(&bs_[b].objs[size_t(tok % g_.buffers[b].depth)]);
    }
    if (S.tensor >= 0) {
      auto& t = g_.tensors[S.tensor];
      if (int64_t(t.host.size()) * 4 < t.bytes) t.host.resize(size_t(t.bytes / 4), std::nanf(""));
      io.tensor = t.host.data();
      io.tensor_elems = int64_t(t.host.size());
      io.tensor_objs = &t.objs;
    }
    S.kernel(io);
  }

  void fire(int s, int64_t i) {
    const Stage& S = g_.stages[s];
    auto& T = st_[s];
    auto& R = res_.stages[s];
    if (R.first_start < 0) R.first_start = now_;
    double gap = now_ - std::max(T.idle_from, T.busy_until);
    // a load or store with requests in flight is busy, not stalled
    if (i > 0 && gap > 0 && !(S.kind != StageKind::Compute && T.inflight > 0))
      (T.last_block == 2 ? R.stall_output : R.stall_input) += gap;
    T.last_block = 0;
    T.next = i + 1;
    if (opt_.functional) run_kernel(s, i);
    const StageMap& M = cfg_.stages[s];
    double extra = s < int(opt_.stage_extra_latency.size()) ? double(opt_.stage_extra_latency[s]) : 0;
    if (S.kind == StageKind::Compute) {
      double ii = double(M.ii);
      T.busy_until = now_ + ii;
      T.idle_from = T.busy_until;
      R.busy += ii;
      const double done_at = now_ + ii + double(M.latency) + extra + double(S.delay_cycles);
      // An accumulator register is combined at the end of the pipeline, in step with the iterations: the
      // next iteration may take it as soon as the stage is free (its own partial result arrives there one
      // pipeline depth later, when this combine is done).
      // The register's value at the end of a loop run leaves for the loop's result (yield) as any output
      // does, after the pipeline and the route.
      if (has_register_output_[size_t(s)] && !register_leaves(s, i)) push(T.busy_until, DONE_REGISTER, s, i);
      // The stage tries its next iteration when it is free again, right after releasing its inputs: one
      // event for both (the try would come next anyway: the only event scheduled between the two is the
      // completion, at a later time).
      if (done_at != T.busy_until && !(T.try_pending && T.try_at <= T.busy_until)) {
        T.try_pending = true;
        T.try_at = T.busy_until;
        push(T.busy_until, RELEASE_TRY, s, i);
        push(done_at, DONE, s, i);
        ++seq_;  // the sequence number the separate try would have had
        return;
      }
      push(now_ + ii, RELEASE, s, i);
      push(done_at, DONE, s, i);
      schedule_try(s, T.busy_until);
      return;
    }
    // Loads and stores: bursts to the AGCU.
    const Access& A = S.access;
    const Tensor& ten = g_.tensors[S.tensor];
    int64_t base = ten.base + A.offset + (A.base ? A.base(i) : (i % A.wrap) * A.iter_stride);
    const int64_t bb = mem_.burst_bytes;
    int64_t count = 0;
    auto& ag = ag_[T.agcu];
    bool write = S.kind == StageKind::Store;
    for (int64_t r = 0; r < A.rows; ++r) {
      int64_t lo = A.row_at ? ten.base + A.row_at(i, r) : base + r * A.row_stride, hi = lo + A.row_bytes;
      for (int64_t x = lo / bb * bb; x < hi; x += bb) {
        ag.queue.push_back({s, i, x, write, now_, false});
        ++count;
      }
    }
    ag.queue.back().last_of_iter = true;
    (write ? res_.bytes_written : res_.bytes_read) += A.bytes();
    // a gather reads its index tile while generating addresses: released once they are generated
    if (!write && !S.inputs.empty()) push(now_ + double(count), RELEASE, s, i);
    T.bursts_left[i] = count;
    if (T.inflight++ == 0) T.inflight_since = now_;
    T.busy_until = now_ + 1;  // address generation of the next iteration can start next cycle
    T.idle_from = T.busy_until;
    if (!ag.issue_pending) {
      ag.issue_pending = true;
      push(std::max(now_, ag.last_issue + ag.issue_gap), AGCU_ISSUE, T.agcu, 0);
    }
    schedule_try(s, T.busy_until);
  }

  void agcu_issue(int a) {
    auto& ag = ag_[a];
    int issued = 0;
    for (; issued < ag.per_round; ++issued) {
      if (ag.queue.empty() || ag.outstanding >= ag.max_outstanding) break;  // burst_done re-arms
      issue_one(ag);
    }
    if (issued > 0) ag.last_issue = now_;
    if (!ag.queue.empty() && ag.outstanding < ag.max_outstanding) {
      ag.issue_pending = true;
      push(now_ + ag.issue_gap, AGCU_ISSUE, a, 0);
    }
  }

  void issue_one(Agcu& ag) {
    Req r = ag.queue.front();
    ag.queue.pop_front();
    ++ag.outstanding;
    // Channel interleaving with the address bits above one interleave chunk per bank and channel folded
    // into the channel choice (as memory controllers hash row bits into the channel): a tile whose rows are
    // a multiple of channels x interleave bytes apart would otherwise put every row on one channel, while
    // a sequential stream sees a new rotation only every channels x banks chunks. For a fixed upper part
    // the map is a rotation, so it stays one to one.
    const int64_t il = mem_.interleave_bytes, nch = mem_.channels, chunk = r.addr / il, upper = chunk / nch;
    int ch = int((chunk + upper / std::max(1, mem_.banks)) % nch);
    int64_t local = upper * il + r.addr % il;
    Req cr = r;
    cr.addr = local;
    cr.arrival = now_;
    cr.stage = r.stage;
    auto& C = chans_[ch];
    C.queue.push_back(cr);
    if (per_bank_) ++C.bank_queued[size_t(bank_of(local))];
    if (!C.serve_pending) {
      C.serve_pending = true;
      push(std::max(now_, C.bus_free), CHAN_SERVE, ch, 0);
    }
    if (r.last_of_iter && r.write) push(now_, RELEASE, r.stage, r.iter);  // store data has left the PMU
  }

  int bank_of(int64_t addr) const {
    int64_t row = addr / mem_.row_bytes;
    // XOR bank hashing, as memory controllers do, so streams at row-aligned offsets spread over banks.
    return int((row ^ (row / mem_.banks)) % mem_.banks);
  }
  int64_t row_of(int64_t addr) const { return addr / (int64_t(mem_.row_bytes) * mem_.banks); }

  // An all-bank refresh ending at `end`: the channel was blocked refresh_ and every row is closed.
  void refreshed(Channel& C, double end) {
    std::fill(C.open_row.begin(), C.open_row.end(), -1);
    std::fill(C.bank_free.begin(), C.bank_free.end(), end);
    ++res_.refreshes;
  }
  // The refreshes before a request picked at t = max(now_, bus_free); returns when it can start.
  double refresh_before(Channel& C, double t) {
    if (mem_.refresh_postpone == 0) {  // every refresh issued when it falls due
      // Refreshes that fell in an idle stretch cannot block this request (refresh_ns < refresh_interval_ns,
      // checked with the arch): count them at once instead of one by one, so a long gap costs no loop.
      if (t >= C.next_refresh + 64 * refresh_int_) {
        const double skipped = std::floor((t - C.next_refresh) / refresh_int_) - 1;
        C.next_refresh += skipped * refresh_int_;
        res_.refreshes += int64_t(skipped);
      }
      while (t >= C.next_refresh) {
        t = std::max(t, C.next_refresh + refresh_);
        C.next_refresh += refresh_int_;
        refreshed(C, t);
      }
      return t;
    }
    // Postponed refresh (the "deficit mode" of HBM controllers, e.g. AMD PG313: refreshes are skipped up
    // to eight times while transactions are queued and made up when the queue is empty). A request served
    // after the bus had been free (now_ > bus_free) found the queue empty since bus_free: in that stretch
    // the controller issued what it owed and what fell due, each as soon as it could, as long as it
    // started before this request arrived (then the request waits for its end).
    if (now_ > C.bus_free) {
      double free = C.bus_free;
      if (C.next_refresh + 64 * refresh_int_ <= now_) {  // a long stretch: everything fits, no loop
        const double skipped = std::floor((now_ - C.next_refresh) / refresh_int_) - 1;
        res_.refreshes += C.owed + int64_t(skipped) - 1;
        C.owed = 0;
        C.next_refresh += skipped * refresh_int_;
        free = C.next_refresh - refresh_int_ + refresh_;
        refreshed(C, free);
      }
      for (;;) {
        double start;
        if (C.owed > 0) {
          start = free;
        } else if (C.next_refresh < now_) {
          start = std::max(free, C.next_refresh);
          C.next_refresh += refresh_int_;
          ++C.owed;
        } else {
          break;
        }
        if (start >= now_) break;  // the request came first: the refresh stays owed
        --C.owed;
        free = start + refresh_;
        refreshed(C, free);
      }
      t = std::max(t, free);
    }
    // Refreshes falling due while requests wait are owed; one past the limit is issued at once.
    while (t >= C.next_refresh) {
      const double due = C.next_refresh;
      C.next_refresh += refresh_int_;
      if (++C.owed > mem_.refresh_postpone) {
        --C.owed;
        t = std::max(t, std::max(due, C.bus_free) + refresh_);
        refreshed(C, t);
      }
    }
    return t;
  }

  // Per-bank refresh (REFSB, single-bank refresh: JESD235 for HBM2, JESD238 for HBM3; AMD PG313 "Single
  // Bank Refresh", "banks are refreshed separately"): the refreshed bank is precharged and busy for
  // refresh_bank_ns (tRFCsb) while the channel's other banks keep their open rows and serve. Refreshes of
  // different banks may overlap in time: the specs only space two REFSB commands of a channel by tRREFD
  // (refresh_bank_gap_ns, [E] 8 ns) and keep a bank from being refreshed again within tRFCsb. Bank b's
  // refresh falls due once per refresh_interval_ns, at (b + 1) / banks of it (a controller issuing one REFSB
  // every tREFI / banks, round robin). The controller issues a due refresh as soon as its bank is free unless
  // a queued request waits for that bank (the oldest such arrived before the refresh could start): then it is
  // postponed, at most refresh_postpone per bank; past that the oldest is issued at its deadline (when the
  // next one falls due) or when its bank is free, blocking that bank only. Refreshes in a stretch in which no
  // request wanted the bank were issued when due; they are placed there (the decision is made at the next
  // request, so refreshes before it are issued retroactively, in time order).
  void refresh_banks(Channel& C, double t, size_t window) {
    if (t < C.next_refresh && C.owed_banks == 0) return;
    const int nb = mem_.banks;
    // queued requests past the window arrived after its last one (the queue is in arrival order)
    const double later = C.queue[window - 1].arrival;
    for (int b = 0; b < nb; ++b) want_[size_t(b)] = C.bank_queued[size_t(b)] > 0 ? later : 1e300;
    for (size_t k = 0; k < window; ++k) {
      const Req& r = C.queue[k];
      double& w = want_[size_t(bank_of(r.addr))];
      w = std::min(w, r.arrival);
    }
    for (int b = 0; b < nb; ++b) {
      double& due = C.bank_due[size_t(b)];
      int& owed = C.bank_owed[size_t(b)];
      // A long stretch in which no request wanted the bank: its refreshes went out when due (the few it
      // owed right after its last use), so they are counted at once, no loop; the last few are placed.
      const double idle = std::min(t, want_[size_t(b)]);
      if (idle >= std::max(due, C.bank_free[size_t(b)]) + 4 * refresh_int_) {
        const double skipped = std::floor((idle - due) / refresh_int_) - 1;
        res_.refreshes += owed + int64_t(skipped);
        owed = 0;
        due += skipped * refresh_int_;
        C.open_row[size_t(b)] = -1;
        C.bank_free[size_t(b)] = std::max(C.bank_free[size_t(b)], due - refresh_int_ + refresh_bank_);
      }
      while (t >= due) ++owed, due += refresh_int_;
    }
    // Issue in time order: the earliest refresh that may start, until none may.
    for (;;) {
      int best = -1;
      double best_start = 1e300;
      bool best_forced = false;
      for (int b = 0; b < nb; ++b) {
        const int owed = C.bank_owed[size_t(b)];
        if (owed == 0) continue;
        const double oldest = C.bank_due[size_t(b)] - owed * refresh_int_;
        double start = std::max(oldest, C.bank_free[size_t(b)]);
        bool forced = false;
        if (start > t || start >= want_[size_t(b)]) {   // not yet, or a request waits for the bank
          if (owed <= mem_.refresh_postpone) continue;  // postponed
          start = std::max(oldest + mem_.refresh_postpone * refresh_int_, C.bank_free[size_t(b)]);
          forced = true;
        }
        if (start < best_start) best = b, best_start = start, best_forced = forced;
      }
      if (best < 0) break;
      const size_t b = size_t(best);
      const double start = std::max(best_start, C.refresh_cmd + refresh_gap_);
      if (!best_forced && (start > t || start >= want_[b])) {  // the command spacing made it too late
        want_[b] = -1;                                         // postponed for now
        continue;
      }
      C.bank_free[b] = start + (C.open_row[b] >= 0 ? row_miss_ / 2 : 0) + refresh_bank_;  // tRP first
      C.open_row[b] = -1;
      C.refresh_cmd = std::max(C.refresh_cmd, start);
      --C.bank_owed[b];
      ++res_.refreshes;
    }
    double next = 1e300;
    C.owed_banks = 0;
    for (int b = 0; b < nb; ++b) {
      C.owed_banks += C.bank_owed[size_t(b)] > 0;
      next = std::min(next, C.bank_due[size_t(b)]);
    }
    C.next_refresh = next;
  }

  void serve(int c) {
    auto& C = chans_[c];
    if (C.queue.empty()) return;
    const size_t window = std::min<size_t>(C.queue.size(), 16);
    double t = std::max(now_, C.bus_free);
    if (per_bank_) refresh_banks(C, t, window);
    // FR-FCFS within a window: the oldest row hit first, else the oldest request (with per-bank refresh:
    // the oldest whose bank is not being refreshed, else the one whose bank is free first).
    size_t pick = 0;
    bool hit = false;
    for (size_t k = 0; k < window; ++k) {
      const Req& r = C.queue[k];
      if (C.open_row[bank_of(r.addr)] == row_of(r.addr)) {
        pick = k;
        hit = true;
        break;
      }
    }
    if (per_bank_ && !hit)
      for (size_t k = 0; k < window; ++k) {
        const double f = C.bank_free[bank_of(C.queue[k].addr)];
        if (f <= t) {
          pick = k;
          break;
        }
        if (f < C.bank_free[bank_of(C.queue[pick].addr)]) pick = k;
      }
    Req r = C.queue[pick];
    C.queue.erase(C.queue.begin() + long(pick));
    if (per_bank_) --C.bank_queued[size_t(bank_of(r.addr))];
    if (!per_bank_) t = refresh_before(C, t);
    int b = bank_of(r.addr);
    int64_t row = row_of(r.addr);
    double start = t;
    if (C.open_row[b] != row) {
      double act = std::max(r.arrival, C.bank_free[b]);
      start = std::max(start, act + row_miss_);
      C.open_row[b] = row;
      ++res_.row_misses;
    }
    if (r.write != C.last_write) {
      start = std::max(start, C.bus_free + turn_);
      C.last_write = r.write;
      ++res_.turnarounds;
    }
    double end = start + burst_cycles_;
    C.bus_free = end;
    C.bank_free[b] = end;
    ++res_.bursts;
    // A channel's bursts finish in the order it serves them (its bus is serial), so they queue per channel
    // and only the earliest of each channel sits in the heap, keeping its own time and sequence number.
    C.done.push_back({end + latency_, seq_++, BURST_DONE, r.stage, r.iter});
    if (C.done.size() == 1) q_.push({C.done.front().t, C.done.front().seq, CHAN_DONE_HEAD, c, 0});
    if (!C.queue.empty()) {
      C.serve_pending = true;
      push(C.bus_free, CHAN_SERVE, c, 0);
    }
    end_ = std::max(end_, end + latency_);
  }

  void burst_done(int s, int64_t i) {
    auto& T = st_[s];
    auto& ag = ag_[T.agcu];
    --ag.outstanding;
    if (!ag.issue_pending && !ag.queue.empty()) {
      ag.issue_pending = true;
      push(std::max(now_, ag.last_issue + ag.issue_gap), AGCU_ISSUE, T.agcu, 0);
    }
    auto it = T.bursts_left.find(i);
    MP_INTERNAL_CHECK(it != T.bursts_left.end(), "burst for an iteration not in flight");
    if (--it->second > 0) return;
    T.bursts_left.erase(it);
    if (--T.inflight == 0) res_.stages[s].busy += now_ - T.inflight_since;
    double extra = s < int(opt_.stage_extra_latency.size()) ? double(opt_.stage_extra_latency[s]) : 0;
    if (g_.stages[s].kind == StageKind::Load) {
      push(now_ + extra, DONE, s, i);
    } else {
      complete(s, i);
    }
  }

  // Inputs of iteration i have been read: release tokens whose last reader this was.
  void release(int s, int64_t i) {
    const Stage& S = g_.stages[s];
    for (size_t k = 0; k < S.inputs.size(); ++k) {
      const Input& in = S.inputs[k];
      if ((i + 1) % in.reuse != 0) continue;
      auto& B = bs_[in.buffer];
      for (size_t c = 0; c < B.consumers.size(); ++c)
        if (B.consumers[c] == s && B.input_index[c] == int(k)) B.released[c] = i / in.reuse + 1;
      if (B.producer >= 0) schedule_try(B.producer, now_);
    }
  }

  void report_progress() const {
    int64_t finished = 0, total = 0;
    for (size_t s = 0; s < g_.stages.size(); ++s)
      finished = add_sat(finished, st_[s].finished), total = add_sat(total, g_.stages[s].iterations);
    opt_.progress(finished, total);
  }

  void complete(int s, int64_t i) {
    auto& T = st_[s];
    ++T.finished;
    end_ = std::max(end_, now_);
    res_.stages[s].last_end = std::max(res_.stages[s].last_end, now_);
    complete_outputs(s, i, false);
    if (has_register_output_[size_t(s)] && register_leaves(s, i)) complete_outputs(s, i, true);
  }

  // Iteration i of a stage writing an accumulator register is the last of a loop run, whose value a
  // yield (a control stage accumulating the run) takes out of the PCU.
  bool register_leaves(int s, int64_t i) const {
    const int64_t run = register_run_[size_t(s)];
    return run > 1 && (i + 1) % run == 0;
  }

  // The output tokens of iteration i in the stage's accumulator registers (`in_register`) or elsewhere.
  void complete_outputs(int s, int64_t i, bool in_register) {
    const Stage& S = g_.stages[s];
    if ((i + 1) % S.accumulate == 0)
      for (int b : S.outputs) {
        if (g_.buffers[b].in_register != in_register) continue;
        auto& B = bs_[b];
        B.done_ahead.push_back(out_token(s, i, b));
        // tokens can complete out of order (bursts on different channels); advance over the done prefix
        bool moved = true;
        while (moved) {
          moved = false;
          for (size_t k = 0; k < B.done_ahead.size(); ++k)
            if (B.done_ahead[k] == B.avail) {
              ++B.avail;
              B.done_ahead[k] = B.done_ahead.back();
              B.done_ahead.pop_back();
              moved = true;
              break;
            }
        }
        for (int c : B.consumers) schedule_try(c, now_);
      }
  }

  const Arch& a_;
  Config& cfg_;
  Graph& g_;
  const SimOptions& opt_;
  const Memory& mem_;
  double burst_cycles_, latency_, row_miss_, refresh_int_, refresh_, turn_, refresh_bank_ = 0,
                                                                            refresh_gap_ = 0;
  bool per_bank_ = false;
  std::vector<double> want_;  // per bank: arrival of the oldest request in the window (refresh_banks)
  std::vector<Channel> chans_;
  std::vector<Agcu> ag_;
  std::vector<StageState> st_;
  std::vector<bool> has_register_output_;  // per stage: writes an accumulator register
  std::vector<int64_t> register_run_;      // per stage: iterations of a loop run whose result leaves it
  std::vector<BufState> bs_;
  EventHeap q_;
  std::vector<Ev> now_q_;  // events at the current time, in sequence order, from now_head_ on
  size_t now_head_ = 0;
  uint64_t seq_ = 0;
  double now_ = 0, end_ = 0;
  ConfigResult res_;
};

}  // namespace

int64_t estimate_events(const Arch& a, const Graph& g) {
  const int64_t bb = a.memory().burst_bytes;
  int64_t total = 0;
  for (const Stage& S : g.stages) {
    // An iteration fires, releases its inputs and completes (a few events, one per consumer each); a load
    // or store also issues, serves and finishes each of its bursts (a row may straddle one more burst).
    int64_t per_iter = add_sat(8, mul_sat(4, int64_t(S.inputs.size() + S.outputs.size())));
    if (S.kind != StageKind::Compute) {
      const int64_t bursts = mul_sat(S.access.rows, add_sat(S.access.row_bytes / bb, 2));
      per_iter = add_sat(per_iter, mul_sat(bursts, 4));
    }
    total = add_sat(total, mul_sat(S.iterations, per_iter));
  }
  return total;
}

ConfigResult simulate_config(const Arch& a, Config& cfg, const SimOptions& opt) {
  MP_INTERNAL_CHECK(cfg.stages.size() == cfg.graph.stages.size(), "mapping and graph disagree");
  Sim sim(a, cfg, opt);
  return sim.run();
}

}  // namespace mp::rdu
