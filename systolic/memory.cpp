// SCALE-Sim v2's memory model, driven by the array's per-cycle operand demand. Each fold of the array
// produces three demand streams (IFMAP and filter reads, OFMAP writes), one line per cycle; the lines go
// through two read buffers and one write buffer in front of DRAM. With InterfaceBandwidth CALC the read
// buffers never stall (SCALE-Sim estimates the DRAM bandwidth they would need) and only a full OFMAP
// buffer stalls the array; with USER the read buffers prefetch at the given words per cycle and stall.
//
// The streams are never materialized: a line's addresses are computed from the fold geometry, and folds
// that cannot change the buffer state (no window boundary inside them, or a repeat of the previous block)
// are visited in whatever order is cheapest, which is what makes whole networks run in well under a second.
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>

#include "core/error.h"
#include "systolic/scalesim.h"

namespace mp::systolic {
namespace {

using i64 = std::int64_t;

i64 ceil_div(i64 a, i64 b) { return (a + b - 1) / b; }

// Address generator for the three operand matrices of a layer, as SCALE-Sim lays them out: IFMAP (M x K,
// im2col of an H x W x C image, -1 where a window hangs over the edge), filter (K x N), OFMAP (M x N).
// Indices are addresses minus the operand's offset.
struct Operands {
  i64 M, K, N;
  std::vector<i64> m_base;                 // window start address per output pixel
  std::vector<std::int32_t> m_row, m_col;  // image row/column of the window's corner
  std::vector<i64> k_off;                  // address offset of window element k
  std::vector<std::int32_t> k_row, k_col;  // filter row/column of window element k
  i64 H, W;
  i64 max_k_row = 0, max_k_col = 0;
  i64 ifmap_space, filter_space;

  explicit Operands(const Layer& L) {
    const GemmShape g = L.gemm();
    M = g.M, K = g.K, N = g.N;
    H = L.ifmap_h, W = L.ifmap_w;
    const i64 Ew = L.ofmap_w(), Ch = L.channels;
    m_base.resize(M), m_row.resize(M), m_col.resize(M);
    for (i64 m = 0; m < M; ++m) {
      const i64 r = (m / Ew) * L.stride_h, c = (m % Ew) * L.stride_w;
      m_row[m] = static_cast<std::int32_t>(r), m_col[m] = static_cast<std::int32_t>(c);
      m_base[m] = (r * W + c) * Ch;
    }
    k_off.resize(K), k_row.resize(K), k_col.resize(K);
    for (i64 k = 0; k < K; ++k) {
      const i64 fr = k / (L.filter_w * Ch), rem = k % (L.filter_w * Ch), fc = rem / Ch, ch = rem % Ch;
      k_row[k] = static_cast<std::int32_t>(fr), k_col[k] = static_cast<std::int32_t>(fc);
      k_off[k] = (fr * W + fc) * Ch + ch;
    }
    ifmap_space = H * W * Ch;
    max_k_row = *std::max_element(k_row.begin(), k_row.end());
    max_k_col = *std::max_element(k_col.begin(), k_col.end());
    filter_space = K * N;
  }
  // -1 when the element lies outside the image.
  i64 ifmap(i64 m, i64 k) const {
    if (m_row[m] + k_row[k] >= H || m_col[m] + k_col[k] >= W) return -1;
    return m_base[m] + k_off[k];
  }
  i64 filter(i64 k, i64 n) const { return n * K + k; }
};

// The fold schedule: column folds outer, row folds inner, cycles_per_fold demand lines each.
struct Schedule {
  FoldPlan plan;
  int R, C;
  Dataflow df;
  i64 folds() const { return plan.folds(); }
  i64 lines() const { return plan.folds() * plan.cycles_per_fold; }
  struct Fold {
    i64 index, fr, fc, r0, c0;
    int rows_used, cols_used;
  };
  Fold fold(i64 f) const {
    Fold x;
    x.index = f;
    x.fc = f / plan.row_folds, x.fr = f % plan.row_folds;
    x.r0 = x.fr * R, x.c0 = x.fc * C;
    x.rows_used = static_cast<int>(std::min<i64>(R, plan.spatial_rows - x.r0));
    x.cols_used = static_cast<int>(std::min<i64>(C, plan.spatial_cols - x.c0));
    return x;
  }
};

enum class Operand { Ifmap, Filter };

// How one read operand is demanded in a fold: either streamed with skew (one time step per line, column j
// of the demand delayed by j cycles) or preloaded as the stationary tile (its rows in reverse order, one
// per line, during the first R lines).
struct ReadStream {
  const Operands& ops;
  const Schedule& s;
  Operand which;

  bool streamed() const {
    if (s.df == Dataflow::OS) return true;
    return (s.df == Dataflow::WS) == (which == Operand::Ifmap);
  }
  i64 prefix() const { return s.df == Dataflow::OS ? 0 : s.R; }
  int used(const Schedule::Fold& f) const {
    if (s.df == Dataflow::OS) return which == Operand::Ifmap ? f.rows_used : f.cols_used;
    return f.rows_used;  // the streamed operand of WS/IS spreads over the rows
  }
  // Address index of streamed element (time step u, column j) or stationary element (row, column j).
  i64 stream_addr(const Schedule::Fold& f, i64 u, i64 j) const {
    switch (s.df) {
      case Dataflow::WS:
        return ops.ifmap(u, f.r0 + j);
      case Dataflow::IS:
        return ops.filter(f.r0 + j, u);
      case Dataflow::OS:
        return which == Operand::Ifmap ? ops.ifmap(f.r0 + j, u) : ops.filter(u, f.c0 + j);
    }
    return -1;
  }
  i64 stationary_addr(const Schedule::Fold& f, i64 row, i64 j) const {
    return s.df == Dataflow::WS ? ops.filter(f.r0 + row, f.c0 + j) : ops.ifmap(f.c0 + j, f.r0 + row);
  }
  // A key equal for two folds exactly when they demand the same block of the operand.
  i64 block_key(const Schedule::Fold& f) const {
    if (s.df == Dataflow::OS) return which == Operand::Ifmap ? f.fr : f.fc;
    if (streamed()) return f.fr;
    return f.index;
  }
  i64 block_size(const Schedule::Fold& f) const {
    return streamed() ? s.plan.temporal * used(f) : static_cast<i64>(f.rows_used) * f.cols_used;
  }
  // Calls fn(index) for every valid address of line l of the fold, in SCALE-Sim's column order.
  template <class Fn>
  void line(const Schedule::Fold& f, i64 l, Fn&& fn) const {
    if (streamed()) {
      const i64 T = s.plan.temporal, base = l - prefix();
      const int n = used(f);
      const i64 jlo = std::max<i64>(0, base - T + 1), jhi = std::min<i64>(n - 1, base);
      for (i64 j = jlo; j <= jhi; ++j) {
        const i64 a = stream_addr(f, base - j, j);
        if (a >= 0) fn(a);
      }
    } else if (l < s.R) {
      const i64 row = s.R - 1 - l;
      if (row < f.rows_used)
        for (i64 j = 0; j < f.cols_used; ++j) {
          const i64 a = stationary_addr(f, row, j);
          if (a >= 0) fn(a);
        }
    }
  }
  // The lines of the fold that can hold a demand, [first, last].
  std::pair<i64, i64> active_lines(const Schedule::Fold& f) const {
    if (streamed()) return {prefix(), prefix() + s.plan.temporal - 1 + used(f) - 1};
    return {s.R - f.rows_used, s.R - 1};
  }
  // Every valid address of the fold, in a cache-friendly order.
  template <class Fn>
  void block(const Schedule::Fold& f, Fn&& fn) const {
    if (!streamed()) {
      for (i64 row = 0; row < f.rows_used; ++row)
        for (i64 j = 0; j < f.cols_used; ++j) {
          const i64 a = stationary_addr(f, row, j);
          if (a >= 0) fn(a);
        }
      return;
    }
    const i64 T = s.plan.temporal;
    const int n = used(f);
    if (s.df == Dataflow::OS && which == Operand::Ifmap) {  // rows m = r0 + j, columns k = u: row-major
      for (i64 j = 0; j < n; ++j) {
        const i64 m = f.r0 + j, base = ops.m_base[m];
        if (ops.m_row[m] + ops.max_k_row < ops.H && ops.m_col[m] + ops.max_k_col < ops.W) {
          // The whole window lies inside the image: no edge checks.
          const i64* off = ops.k_off.data();
          for (i64 u = 0; u < T; ++u) fn(base + off[u]);
        } else {
          for (i64 u = 0; u < T; ++u) {
            const i64 a = ops.ifmap(m, u);
            if (a >= 0) fn(a);
          }
        }
      }
    } else {
      for (i64 u = 0; u < T; ++u)
        for (i64 j = 0; j < n; ++j) {
          const i64 a = stream_addr(f, u, j);
          if (a >= 0) fn(a);
        }
    }
  }
};

// Number of OFMAP writes in line l of a fold (SCALE-Sim's OFMAP demand: WS/IS write the bottom of each
// column 2R-1 cycles after the stream starts, skewed by column; OS writes the drained rows after T-1).
i64 ofmap_count(const Schedule& s, const Schedule::Fold& f, i64 l) {
  i64 lo, hi;
  const i64 T = s.plan.temporal;
  if (s.df == Dataflow::OS) {
    lo = l - (T - 1) - (s.R - 1), hi = l - (T - 1) - (s.R - f.rows_used);
  } else {
    lo = l - (2 * s.R - 1) - T + 1, hi = l - (2 * s.R - 1);
  }
  lo = std::max<i64>(lo, 0), hi = std::min<i64>(hi, f.cols_used - 1);
  return hi >= lo ? hi - lo + 1 : 0;
}
std::pair<i64, i64> ofmap_active_lines(const Schedule& s, const Schedule::Fold& f) {
  const i64 T = s.plan.temporal;
  if (s.df == Dataflow::OS) return {T - 1 + (s.R - f.rows_used), T - 1 + s.R - 1 + f.cols_used - 1};
  return {2 * s.R - 1, 2 * s.R - 1 + T - 1 + f.cols_used - 1};
}

// SCALE-Sim's OFMAP write buffer: words collect in lines of `bw`; once more than the active half is
// occupied the drain half goes to DRAM at one line per cycle, and the array stalls when the buffer is
// full while a drain is in flight. Only the number of words per line matters, not their addresses.
class WriteBuffer {
 public:
  WriteBuffer(i64 total_words, i64 bw)
      : total_(total_words),
        active_((total_words + 1) / 2),
        drain_(total_words - active_),
        bw_(bw),
        free_(total_words) {}

  // Services one demand line of n words issued at `cycle`; returns the cycle it completes. Words that
  // cannot trigger a drain or a stall are stored in bulk; the others one by one, as SCALE-Sim does.
  i64 service(i64 cycle, i64 n) {
    i64 current = cycle;
    while (n > 0) {
      const i64 quiet = std::min(n, current < drain_end_ ? free_ - 1 : free_ - active_);
      if (quiet > 0) {
        store(quiet);
        n -= quiet;
        continue;
      }
      store(1);
      --n;
      if (current < drain_end_) {
        if (free_ <= 0) current = drain_end_;
      } else if (free_ < total_ - drain_) {
        append(true);
        drain_end_ = drain(current);
      }
    }
    return current;
  }
  void finish(i64 cycle) {
    append(true);
    if (!trace_started_) return;
    while (drain_start_ < visible()) {
      drain_end_ = drain(cycle);
      cycle = drain_end_ + 1;
    }
  }
  i64 accesses() const { return accesses_; }
  bool valid() const { return drained_any_; }
  i64 first_cycle() const { return first_; }
  i64 last_cycle() const { return last_; }

 private:
  void store(i64 k) {
    free_ -= k;
    line_fill_ += k;
    while (line_fill_ >= bw_) {
      line_fill_ -= bw_;
      push_line(bw_);
      if (cached_ >= 1024) append(false);
    }
  }
  void push_line(i64 words) {
    lines_.push_back(static_cast<std::int32_t>(words));
    ++cached_;
  }
  void append(bool force) {
    if (force && line_fill_ != 0) {
      push_line(line_fill_);
      line_fill_ = 0;
    }
    if (cached_ == 0) return;
    cached_ = 0;
    trace_started_ = true;
  }
  i64 visible() const { return base_ + static_cast<i64>(lines_.size()) - cached_; }
  i64 drain(i64 start_cycle) {
    const i64 lines_per_drain = ceil_div(drain_, bw_);
    const i64 end = std::min(drain_start_ + lines_per_drain, visible());
    const i64 n = end - drain_start_;
    MP_INTERNAL_CHECK(n > 0, "OFMAP drain with nothing to drain");
    // SCALE-Sim discounts the empty slots of the last line of the chunk only.
    const i64 words = n * bw_ - (bw_ - lines_[static_cast<size_t>(end - 1 - base_)]);
    accesses_ += words;
    if (!drained_any_) first_ = start_cycle;
    drained_any_ = true;
    last_ = start_cycle + n - 1;
    free_ += words;
    drain_start_ = end;
    if (drain_start_ - base_ > 4096 && drain_start_ - base_ > static_cast<i64>(lines_.size()) / 2) {
      // Drained lines are never read again: keep memory bounded by the buffer, not the layer.
      lines_.erase(lines_.begin(), lines_.begin() + (drain_start_ - base_));
      base_ = drain_start_;
    }
    return start_cycle + n - 1;
  }

  i64 total_, active_, drain_, bw_;
  i64 free_;
  i64 line_fill_ = 0;
  // Words per line not yet drained, from line `base_` on; the last `cached_` of them are not drainable yet.
  std::vector<std::int32_t> lines_;
  i64 base_ = 0;
  i64 cached_ = 0;
  bool trace_started_ = false;
  i64 drain_start_ = 0;
  i64 drain_end_ = 0;
  i64 accesses_ = 0;
  bool drained_any_ = false;
  i64 first_ = 0, last_ = 0;
};

// SCALE-Sim's read buffer in CALC mode: it always hits, and it counts the distinct words it had to fetch,
// in windows of half the buffer (50 "sets" of 1/100 of it). A window that fills up triggers a prefetch
// whose duration sets the DRAM bandwidth the operand needs.
class EstimateReadBuffer {
 public:
  EstimateReadBuffer(i64 total_words, i64 bw, i64 space)
      : items_(total_words / 100),
        cap_(50 * (total_words / 100)),
        bw_(bw),
        stamp_(static_cast<size_t>(space), 0) {
    MP_USER_CHECK(items_ > 0, "SRAM too small for SCALE-Sim's buffer model (needs at least 100 words)");
  }
  void set_first_request(i64 cycle) { first_request_ = cycle; }
  i64 window_misses() const { return in_window_; }
  i64 capacity() const { return cap_; }

  // A demand for address index a at `cycle`; returns true when it closed a window.
  bool access(i64 a, i64 cycle) {
    auto& st = stamp_[static_cast<size_t>(a)];
    if (st == window_) return false;
    st = window_;
    ++misses_;
    if (++in_window_ < cap_) return false;
    // The window is full: fetch it (the first one before the first request, the later ones in the time
    // since the previous window closed) and start an empty one.
    if (!prefetched_) {
      last_end_ = first_request_ - 2;
      const i64 cycles = ceil_div(cap_, bw_);
      last_start_ = last_end_ - cycles + 1;
      prefetched_ = true;
    }
    record(last_start_ + 1, last_end_ + 1);
    ++window_;
    in_window_ = 0;
    last_start_ = last_end_ + 1;
    last_end_ = cycle;
    return true;
  }
  // Same as access() for a caller that knows no window can close.
  void access_quiet(i64 a) {
    auto& st = stamp_[static_cast<size_t>(a)];
    if (st != window_) {
      st = window_;
      ++misses_;
      ++in_window_;
    }
  }
  void finish() {
    if (!prefetched_) {
      const i64 sets = in_window_ / items_ + (in_window_ % items_ ? 1 : 0);
      const i64 cycles = ceil_div(sets * items_, bw_);
      record(-cycles, -1);
    } else {
      record(last_start_ + 1, last_end_ + 1);
    }
  }
  i64 accesses() const { return misses_; }
  i64 first_cycle() const { return first_; }
  i64 last_cycle() const { return last_; }

 private:
  void record(i64 a, i64 b) {
    if (!recorded_) first_ = a;
    recorded_ = true;
    last_ = b;
  }
  i64 items_, cap_, bw_;
  std::vector<std::uint32_t> stamp_;
  std::uint32_t window_ = 1;
  i64 in_window_ = 0, misses_ = 0;
  i64 first_request_ = 0;
  bool prefetched_ = false, recorded_ = false;
  i64 last_start_ = -2, last_end_ = -1;
  i64 first_ = 0, last_ = 0;
};

// Cumulative stall cycles as a step function of the demand line.
struct StallSchedule {
  std::vector<std::pair<i64, i64>> steps{{0, 0}};  // (first line, stalls before it)
  void add(i64 after_line, i64 total) { steps.emplace_back(after_line + 1, total); }
  i64 at(i64 line) const {
    auto it = std::upper_bound(steps.begin(), steps.end(), std::pair<i64, i64>{line, INT64_MAX});
    return std::prev(it)->second;
  }
};

struct ReadResult {
  i64 sram_first_line = -1, sram_last_line = -1;
  i64 dram_reads = 0, dram_first = 0, dram_last = 0;
};

ReadResult run_read_operand_calc(const ReadStream& rs, const StallSchedule& stalls, i64 buffer_words,
                                 i64 space) {
  const Schedule& s = rs.s;
  const i64 L = s.plan.cycles_per_fold, F = s.folds();
  ReadResult out;
  // The first and last lines with a demand set the SRAM start/stop cycles (and the first request).
  for (i64 f = 0; f < F && out.sram_first_line < 0; ++f) {
    auto fo = s.fold(f);
    auto [a, b] = rs.active_lines(fo);
    for (i64 l = a; l <= b && out.sram_first_line < 0; ++l) {
      bool any = false;
      rs.line(fo, l, [&](i64) { any = true; });
      if (any) out.sram_first_line = f * L + l;
    }
  }
  for (i64 f = F - 1; f >= 0 && out.sram_last_line < 0; --f) {
    auto fo = s.fold(f);
    auto [a, b] = rs.active_lines(fo);
    for (i64 l = b; l >= a && out.sram_last_line < 0; --l) {
      bool any = false;
      rs.line(fo, l, [&](i64) { any = true; });
      if (any) out.sram_last_line = f * L + l;
    }
  }
  MP_INTERNAL_CHECK(out.sram_first_line >= 0, "operand with no demand");

  EstimateReadBuffer buf(buffer_words, 10, space);
  buf.set_first_request(out.sram_first_line + stalls.at(out.sram_first_line));
  i64 prev_key = -1;
  bool prev_clean = false;
  for (i64 f = 0; f < F; ++f) {
    auto fo = s.fold(f);
    const i64 key = rs.block_key(fo);
    if (key == prev_key && prev_clean) continue;  // the same block again, all still in the window: all hits
    bool closed = false;
    if (buf.window_misses() + rs.block_size(fo) < buf.capacity()) {
      rs.block(fo, [&](i64 a) { buf.access_quiet(a); });
    } else {
      auto [a, b] = rs.active_lines(fo);
      for (i64 l = a; l <= b; ++l) {
        const i64 line = f * L + l, cycle = line + stalls.at(line);
        rs.line(fo, l, [&](i64 addr) { closed |= buf.access(addr, cycle); });
      }
    }
    prev_key = key;
    prev_clean = !closed;
  }
  buf.finish();
  out.dram_reads = buf.accesses();
  out.dram_first = buf.first_cycle();
  out.dram_last = buf.last_cycle();
  return out;
}

// The operand's prefetch order in USER mode: SCALE-Sim fetches the operand block by block (one block per
// row or column fold, padded to the array edge with empty slots), reading the streamed operands along
// anti-diagonals so that the skewed demand finds them in time. Calls fn(index or -1) for every slot.
template <class Fn>
void prefetch_order(const ReadStream& rs, Fn&& fn) {
  const Schedule& s = rs.s;
  const Operands& ops = rs.ops;
  const i64 R = s.R, C = s.C, T = s.plan.temporal, Sr = s.plan.spatial_rows, Sc = s.plan.spatial_cols;
  const i64 RF = s.plan.row_folds, CF = s.plan.col_folds;
  auto rows_used = [&](i64 fr) { return std::min<i64>(R, Sr - fr * R); };
  auto cols_used = [&](i64 fc) { return std::min<i64>(C, Sc - fc * C); };
  i64 rows = 0, width = 0;
  bool rolled = true;
  std::function<i64(i64, i64)> at;
  const bool ifm = rs.which == Operand::Ifmap;
  switch (s.df) {
    case Dataflow::WS:
      if (ifm) {
        rows = RF * T, width = R;
        at = [&](i64 r, i64 j) {
          const i64 fr = r / T;
          return j < rows_used(fr) ? ops.ifmap(r % T, fr * R + j) : -1;
        };
      } else {
        rows = CF * Sr, width = C, rolled = false;
        at = [&](i64 r, i64 j) {
          const i64 fc = r / Sr;
          return j < cols_used(fc) ? ops.filter(r % Sr, fc * C + j) : -1;
        };
      }
      break;
    case Dataflow::IS:
      if (ifm) {
        rows = CF * Sr, width = C, rolled = false;
        at = [&](i64 r, i64 j) {
          const i64 fc = r / Sr;
          return j < cols_used(fc) ? ops.ifmap(fc * C + j, r % Sr) : -1;
        };
      } else {
        rows = RF * T, width = R;
        at = [&](i64 r, i64 j) {
          const i64 fr = r / T;
          return j < rows_used(fr) ? ops.filter(fr * R + j, r % T) : -1;
        };
      }
      break;
    case Dataflow::OS:
      if (ifm) {
        rows = RF * T, width = R;
        at = [&](i64 r, i64 j) {
          const i64 fr = r / T;
          return j < rows_used(fr) ? ops.ifmap(fr * R + j, r % T) : -1;
        };
      } else {
        rows = CF * T, width = C;
        at = [&](i64 r, i64 j) {
          const i64 fc = r / T;
          return j < cols_used(fc) ? ops.filter(r % T, fc * C + j) : -1;
        };
      }
      break;
  }
  if (!rolled) {
    for (i64 r = 0; r < rows; ++r)
      for (i64 j = 0; j < width; ++j) fn(at(r, j));
    return;
  }
  for (i64 d = 0; d < rows + width - 1; ++d) {
    const i64 hi = std::min(d, rows - 1), lo = std::max<i64>(0, d - width + 1);
    for (i64 r = hi; r >= lo; --r) fn(at(r, d - r));
  }
}

// SCALE-Sim's read buffer with a user-given DRAM bandwidth: the prefetch order is cut into 100 sets per
// buffer size; the active half of the buffer holds a window of sets, and a demand that misses it slides
// the window by the prefetch half, which takes a new prefetch of ceil(prefetch words / bandwidth) cycles
// issued right after the previous one. The demand waits for that prefetch: a stall.
class UserReadBuffer {
 public:
  UserReadBuffer(const ReadStream& rs, i64 total_words, i64 bw, i64 space) : bw_(bw) {
    active_words_ = (total_words + 1) / 2;
    prefetch_words_ = total_words - active_words_;
    const i64 per_set = ceil_div(total_words, 100);
    // Membership of every address in the sets (CSR by address), in set order.
    std::vector<std::int32_t> last_set(static_cast<size_t>(space), -1);
    std::vector<std::pair<i64, std::int32_t>> pairs;
    i64 slots = 0, valid = 0;
    prefetch_order(rs, [&](i64 a) {
      ++slots;
      if (a < 0) return;
      const auto set = static_cast<std::int32_t>(valid / per_set);
      ++valid;
      if (last_set[static_cast<size_t>(a)] != set) {
        last_set[static_cast<size_t>(a)] = set;
        pairs.emplace_back(a, set);
      }
    });
    start_.assign(static_cast<size_t>(space) + 1, 0);
    for (auto& p : pairs) ++start_[static_cast<size_t>(p.first) + 1];
    for (size_t i = 1; i < start_.size(); ++i) start_[i] += start_[i - 1];
    sets_.resize(pairs.size());
    std::vector<i64> fill(start_.begin(), start_.end() - 1);
    for (auto& p : pairs) sets_[static_cast<size_t>(fill[static_cast<size_t>(p.first)]++)] = p.second;
    fetch_rows_ = ceil_div(slots, bw_);
    num_sets_ = valid / per_set + 1;
    const i64 max_active = ceil_div(active_words_, per_set),
              max_prefetch = ceil_div(prefetch_words_, per_set);
    active_sets_ = std::min(num_sets_, max_active);
    prefetch_sets_ = std::min(num_sets_ - active_sets_, max_prefetch);
  }

  i64 service(const std::vector<i64>& line, i64 cycle) {
    if (!started_) start(cycle);
    i64 offset = 1;
    for (i64 a : line) {
      i64 guard = 0;
      while (!hit(a)) {
        slide();
        offset = last_prefetch_ - cycle;
        MP_INTERNAL_CHECK(++guard <= num_sets_ + 2, "read buffer never holds address ", a);
      }
    }
    return cycle + offset;
  }
  i64 accesses() const { return accesses_; }
  i64 first_cycle() const { return first_; }
  i64 last_cycle() const { return last_prefetch_; }

 private:
  void start(i64 cycle) {
    i64 n = ceil_div(active_words_, bw_);
    if (n >= fetch_rows_) n = fetch_rows_;
    accesses_ += n * bw_;
    first_ = cycle - n;
    last_prefetch_ = cycle - 1;
    win_start_ = 0, win_end_ = active_sets_;
    started_ = true;
  }
  void slide() {
    win_start_ = (win_start_ + prefetch_sets_) % num_sets_;
    win_end_ = (win_start_ + active_sets_) % num_sets_;
    const i64 n = ceil_div(prefetch_words_, bw_);
    accesses_ += n * bw_;
    last_prefetch_ += n + 1;
  }
  bool hit(i64 a) const {
    const auto b = sets_.begin() + start_[static_cast<size_t>(a)],
               e = sets_.begin() + start_[static_cast<size_t>(a) + 1];
    if (win_start_ < win_end_) {
      auto it = std::lower_bound(b, e, static_cast<std::int32_t>(win_start_));
      return it != e && *it < win_end_;
    }
    // The window wraps around (or covers every set when start == end).
    auto it = std::lower_bound(b, e, static_cast<std::int32_t>(win_start_));
    if (it != e) return true;
    return b != e && *b < win_end_;
  }

  i64 bw_, active_words_ = 0, prefetch_words_ = 0;
  std::vector<i64> start_;
  std::vector<std::int32_t> sets_;
  i64 fetch_rows_ = 0, num_sets_ = 0, active_sets_ = 0, prefetch_sets_ = 0;
  bool started_ = false;
  i64 win_start_ = 0, win_end_ = 0;
  i64 accesses_ = 0, first_ = 0, last_prefetch_ = 0;
};

LayerReport finish_report(const Layer& layer, const SimConfig& cfg, const ComputeResult& cr, i64 total_cycles,
                          i64 stall_total) {
  const ArrayConfig& a = cfg.array;
  LayerReport r;
  r.name = layer.name;
  r.gemm = layer.gemm();
  r.total_cycles = total_cycles;
  r.stall_cycles = stall_total;
  r.overall_util = static_cast<double>(cr.macs * 100) / static_cast<double>(total_cycles * a.rows * a.cols);
  r.mapping_eff = cr.mapping_efficiency * 100;
  r.compute_util = cr.compute_utilization * 100;
  r.ifmap_sram_reads = cr.ifmap_sram_reads;
  r.filter_sram_reads = cr.filter_sram_reads;
  r.ofmap_sram_writes = cr.ofmap_sram_writes;
  r.ifmap_sram_bw = static_cast<double>(r.ifmap_sram_reads) / static_cast<double>(total_cycles);
  r.filter_sram_bw = static_cast<double>(r.filter_sram_reads) / static_cast<double>(total_cycles);
  r.ofmap_sram_bw = static_cast<double>(r.ofmap_sram_writes) / static_cast<double>(total_cycles);
  return r;
}

void finish_dram_bw(LayerReport& r) {
  auto bw = [](i64 n, i64 a0, i64 a1) { return static_cast<double>(n) / static_cast<double>(a1 - a0 + 1); };
  r.ifmap_dram_bw = bw(r.ifmap_dram_reads, r.ifmap_dram_start, r.ifmap_dram_stop);
  r.filter_dram_bw = bw(r.filter_dram_reads, r.filter_dram_start, r.filter_dram_stop);
  r.ofmap_dram_bw = bw(r.ofmap_dram_writes, r.ofmap_dram_start, r.ofmap_dram_stop);
}

// USER bandwidth: the three buffers interact through the stalls, so the demand lines run in lockstep.
LayerReport simulate_layer_user(const Layer& layer, const SimConfig& cfg) {
  const GemmShape g = layer.gemm();
  const ArrayConfig& a = cfg.array;
  const ComputeResult cr = analyze_gemm(g, a);
  Schedule s{plan_gemm(g, a), a.rows, a.cols, a.dataflow};
  Operands ops(layer);
  const i64 L = s.plan.cycles_per_fold, F = s.folds(), bw = cfg.bandwidth.at(0);
  ReadStream ifs{ops, s, Operand::Ifmap}, fls{ops, s, Operand::Filter};
  UserReadBuffer ib(ifs, cfg.ifmap_sram_kb * 1024, bw, ops.ifmap_space);
  UserReadBuffer fb(fls, cfg.filter_sram_kb * 1024, bw, ops.filter_space);
  WriteBuffer wb(cfg.ofmap_sram_kb * 1024, bw);
  i64 stalls = 0, last_out = 0;
  i64 if_first = -1, if_last = -1, fl_first = -1, fl_last = -1, of_first = -1, of_last = -1;
  std::vector<i64> iline, fline;
  for (i64 f = 0; f < F; ++f) {
    auto fo = s.fold(f);
    for (i64 l = 0; l < L; ++l) {
      const i64 cycle = f * L + l + stalls;
      iline.clear(), fline.clear();
      ifs.line(fo, l, [&](i64 x) { iline.push_back(x); });
      fls.line(fo, l, [&](i64 x) { fline.push_back(x); });
      const i64 n = ofmap_count(s, fo, l);
      const i64 io = ib.service(iline, cycle), fo_ = fb.service(fline, cycle), oo = wb.service(cycle, n);
      if (!iline.empty()) {
        if (if_first < 0) if_first = io;
        if_last = io;
      }
      if (!fline.empty()) {
        if (fl_first < 0) fl_first = fo_;
        fl_last = fo_;
      }
      if (n > 0) {
        if (of_first < 0) of_first = oo;
        of_last = oo;
      }
      stalls += std::max({io - cycle - 1, fo_ - cycle - 1, oo - cycle - 1});
      last_out = oo;
    }
  }
  wb.finish(last_out);
  LayerReport r = finish_report(layer, cfg, cr, last_out, stalls);
  r.ifmap_sram_start = if_first, r.ifmap_sram_stop = if_last;
  r.filter_sram_start = fl_first, r.filter_sram_stop = fl_last;
  r.ofmap_sram_start = of_first, r.ofmap_sram_stop = of_last;
  r.ifmap_dram_reads = ib.accesses(), r.ifmap_dram_start = ib.first_cycle(),
  r.ifmap_dram_stop = ib.last_cycle();
  r.filter_dram_reads = fb.accesses(), r.filter_dram_start = fb.first_cycle(),
  r.filter_dram_stop = fb.last_cycle();
  r.ofmap_dram_writes = wb.accesses(), r.ofmap_dram_start = wb.first_cycle(),
  r.ofmap_dram_stop = wb.last_cycle();
  finish_dram_bw(r);
  return r;
}

}  // namespace

LayerReport simulate_layer(const Layer& layer, const SimConfig& cfg) {
  if (cfg.user_bandwidth) return simulate_layer_user(layer, cfg);
  const GemmShape g = layer.gemm();
  const ArrayConfig& a = cfg.array;
  const ComputeResult cr = analyze_gemm(g, a);
  Schedule s{plan_gemm(g, a), a.rows, a.cols, a.dataflow};
  Operands ops(layer);
  const i64 L = s.plan.cycles_per_fold, F = s.folds();

  // OFMAP writes first: with CALC bandwidth they alone decide the stalls.
  WriteBuffer wb(cfg.ofmap_sram_kb * 1024, a.cols);
  StallSchedule stalls;
  i64 stall_total = 0;
  i64 of_first = -1, of_last = -1;
  for (i64 f = 0; f < F; ++f) {
    auto fo = s.fold(f);
    auto [lo, hi] = ofmap_active_lines(s, fo);
    for (i64 l = lo; l <= hi; ++l) {
      const i64 n = ofmap_count(s, fo, l);
      if (n == 0) continue;
      const i64 line = f * L + l, cycle = line + stall_total;
      const i64 done = wb.service(cycle, n);
      if (of_first < 0) of_first = done;
      of_last = done;
      if (done - cycle - 1 > 0) {
        stall_total += done - cycle - 1;
        stalls.add(line, stall_total);
      }
    }
  }
  // The last demand line completes at its issue cycle plus its OFMAP delay.
  i64 total_cycles;
  {
    const i64 last_line = s.lines() - 1;
    auto fo = s.fold(F - 1);
    const i64 cycle = last_line + stall_total;
    total_cycles = cycle;
    if (ofmap_count(s, fo, L - 1) > 0) total_cycles = of_last;
  }
  wb.finish(total_cycles);

  ReadStream ifs{ops, s, Operand::Ifmap}, fls{ops, s, Operand::Filter};
  const ReadResult ir = run_read_operand_calc(ifs, stalls, cfg.ifmap_sram_kb * 1024, ops.ifmap_space);
  const ReadResult fr = run_read_operand_calc(fls, stalls, cfg.filter_sram_kb * 1024, ops.filter_space);

  LayerReport r = finish_report(layer, cfg, cr, total_cycles, stall_total);
  r.ifmap_sram_start = ir.sram_first_line + stalls.at(ir.sram_first_line) + 1;
  r.ifmap_sram_stop = ir.sram_last_line + stalls.at(ir.sram_last_line) + 1;
  r.filter_sram_start = fr.sram_first_line + stalls.at(fr.sram_first_line) + 1;
  r.filter_sram_stop = fr.sram_last_line + stalls.at(fr.sram_last_line) + 1;
  r.ofmap_sram_start = of_first;
  r.ofmap_sram_stop = of_last;
  r.ifmap_dram_reads = ir.dram_reads, r.ifmap_dram_start = ir.dram_first, r.ifmap_dram_stop = ir.dram_last;
  r.filter_dram_reads = fr.dram_reads, r.filter_dram_start = fr.dram_first, r.filter_dram_stop = fr.dram_last;
  r.ofmap_dram_writes = wb.accesses(), r.ofmap_dram_start = wb.first_cycle(),
  r.ofmap_dram_stop = wb.last_cycle();
  finish_dram_bw(r);
  return r;
}

}  // namespace mp::systolic
