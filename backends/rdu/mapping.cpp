// Resource mapping and the split into kernel calls. Stages are packed greedily in graph order; a stage that
// no longer fits (PCUs, PMUs for its outputs, or AGCUs) starts a new configuration. Buffers produced in one
// configuration and read in a later one go off chip: the producer side gets a spill store, the consumer side
// a spill load, so the extra traffic is simulated like any other.
#include "backends/rdu/mapping.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "systolic/systolic.h"

namespace mp::rdu {
namespace {

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t systolic_cycles(const Arch& a, int64_t m, int64_t k, int64_t n) {
  systolic::ArrayConfig ac;
  ac.rows = a.systolic_rows;
  ac.cols = a.systolic_cols;
  int64_t best = -1;
  for (auto df : {systolic::Dataflow::WS, systolic::Dataflow::OS}) {
    ac.dataflow = df;
    int64_t c = systolic::analyze_gemm({m, k, n}, ac).cycles + 1;
    if (best < 0 || c < best) best = c;
  }
  return best;
}

// PMUs of a buffer: enough capacity for depth x bytes, enough slots (one PMU's address logic handles up to
// pmu.max_nbuf slots), and enough banks for its widest parallel access (one lane per bank and cycle).
int buffer_pmus(const Arch& a, const Buffer& b) {
  if (b.control || b.in_register) return 0;  // ordering tokens: the control network; accumulators: a register
  int64_t total = b.bytes * b.depth;
  int64_t slots = cdiv(b.depth, a.pmu_max_nbuf), banks = cdiv(std::max(1, b.access_lanes), a.pmu_banks);
  return int(std::max<int64_t>({1, cdiv(total, a.pmu_bytes()), slots, banks}));
}

// Memory-level parallelism of one configuration, from the architecture's memory: a stream keeps the
// channels busy only with enough bytes in flight to cover the bandwidth-delay product (peak bytes per cycle
// x unloaded latency) and, since addresses interleave over channels every `interleave_bytes`, a sequential
// stream must have a window of at least channels x interleave bytes in flight to touch every channel.
// Each stream gets its share (by the bytes it moves) of that window, and AGCUs enough both to issue its
// share of the peak rate (one burst per AGCU and cycle) and to hold its window (agcu.outstanding requests
// each); a load's output buffer gets enough slots to hold its window (the N-buffer is the prefetch queue),
// as far as the PMUs go round. Returns the AGCUs of every stage (0 for compute stages); deepens `g`'s load
// buffers in place.
std::vector<int> plan_streams(const Arch& a, Graph& g, int call, std::vector<std::string>& notes) {
  const Memory& mem = a.memory();
  std::vector<int> agcus(g.stages.size(), 0);
  std::vector<double> want(g.stages.size(), 0);
  const double peak_bpc = mem.peak_gbs() / a.clock_ghz;
  const double round_trip = mem.latency_ns * a.clock_ghz + mem.row_miss_ns * a.clock_ghz +
                            double(mem.burst_bytes) / (mem.channel_gbs / a.clock_ghz);
  // Streams of different phases (dependency depths of their top-level statements, Stage::phase) are
  // ordered by the statements' waits, so each phase shares out all the AGCUs among its own streams: an
  // AGCU is programmed with the streams of every phase it serves and moves to the next when the control
  // token of the previous arrives. Within a phase, streams run concurrently and share.
  // Streams that move under 1 % of the configuration's bytes (a norm's weights, a final store) keep one
  // AGCU each for the whole call, outside the phases, so that they never take a share from a phase.
  std::vector<double> bytes(g.stages.size(), 0);
  double call_bytes = 0;
  for (size_t i = 0; i < g.stages.size(); ++i)
    if (g.stages[i].kind != StageKind::Compute) {
      bytes[i] = double(g.stages[i].iterations) * double(std::max<int64_t>(1, g.stages[i].access.bytes()));
      call_bytes += bytes[i];
    }
  auto small = [&](size_t i) { return bytes[i] < 0.01 * call_bytes; };
  int pool = a.agcus;
  std::vector<int> phases;
  for (size_t i = 0; i < g.stages.size(); ++i) {
    if (g.stages[i].kind == StageKind::Compute) continue;
    if (small(i)) {
      agcus[i] = 1, want[i] = bytes[i], --pool;
      continue;
    }
    if (std::find(phases.begin(), phases.end(), g.stages[i].phase) == phases.end())
      phases.push_back(g.stages[i].phase);
  }
  pool = std::max(pool, 1);
  for (int ph : phases) {
    auto in_phase = [&](size_t i) {
      return g.stages[i].kind != StageKind::Compute && !small(i) && g.stages[i].phase == ph;
    };
    std::vector<double> total(g.stages.size(), 0);
    double all = 0;
    int streams = 0;
    for (size_t i = 0; i < g.stages.size(); ++i)
      if (in_phase(i)) {
        total[i] = double(g.stages[i].iterations) * double(std::max<int64_t>(1, g.stages[i].access.bytes()));
        all += total[i];
        ++streams;
      }
    if (streams == 0) continue;
    int big = 0;  // streams that move a noticeable share of the traffic each want every channel
    for (size_t i = 0; i < g.stages.size(); ++i) big += in_phase(i) && total[i] > 0.05 * all;
    const double window = std::max(2.0 * peak_bpc * round_trip,
                                   double(mem.channels) * double(mem.interleave_bytes) * std::max(1, big));
    int asked = 0;
    for (size_t i = 0; i < g.stages.size(); ++i) {
      if (!in_phase(i)) continue;
      const double f = total[i] / all;
      want[i] = std::min(total[i], f * window);
      const double issue = std::ceil(f * peak_bpc / mem.burst_bytes);
      const double hold = std::ceil(want[i] / (double(mem.burst_bytes) * a.agcu_outstanding));
      agcus[i] = int(std::clamp(std::max(issue, hold), 1.0, double(pool)));
      asked += agcus[i];
    }
    // Every AGCU serves some stream: each stream keeps one, the rest are shared out by the streams' asks
    // (largest remainders first), so the window in flight is as wide as the AGCUs allow. More streams
    // than AGCUs share them round-robin (place_route.h).
    const int spare = std::max(0, pool - streams);
    int extra_asked = 0;
    for (size_t i = 0; i < g.stages.size(); ++i)
      if (in_phase(i)) extra_asked += std::max(0, agcus[i] - 1);
    std::vector<std::pair<double, size_t>> rest;
    int given = streams;
    for (size_t i = 0; i < g.stages.size(); ++i) {
      if (!in_phase(i)) continue;
      const double share =
          extra_asked > 0 ? double(spare) * (agcus[i] - 1) / extra_asked : double(spare) * total[i] / all;
      agcus[i] = 1 + int(std::floor(share));
      given += agcus[i] - 1;
      rest.push_back({share - std::floor(share), i});
      want[i] = std::max(want[i], double(agcus[i]) * a.agcu_outstanding * mem.burst_bytes * 0.5);
    }
    std::sort(rest.begin(), rest.end(), [](auto& x, auto& y) { return x.first > y.first; });
    for (auto& [frac, i] : rest)
      if (given < pool && frac > 0) ++agcus[i], ++given;
    if (asked > pool)
      notes.push_back("kernel call " + std::to_string(call + 1) + ": " + std::to_string(streams) +
                      " memory streams" + (phases.size() > 1 ? " of phase " + std::to_string(ph) : "") +
                      " asked for " + std::to_string(asked) + " AGCUs and share " + std::to_string(pool));
  }
  // Deeper load buffers, widest windows first, while the configuration's PMUs allow.
  auto pmus_total = [&]() {
    int n = 0;
    for (auto& b : g.buffers) n += buffer_pmus(a, b);
    return n;
  };
  for (size_t i = 0; i < g.stages.size(); ++i) {
    const Stage& s = g.stages[i];
    if (s.kind != StageKind::Load || s.outputs.empty()) continue;
    Buffer& b = g.buffers[size_t(s.outputs.front())];
    // a single buffer is the program asking for no overlap (depth=1): kept
    if (b.initial_tokens > 0 || b.depth < 2 || s.iterations <= b.depth) continue;
    const int64_t tile = std::max<int64_t>(1, s.access.bytes());
    const int64_t need = std::min<int64_t>(s.iterations, 1 + cdiv(int64_t(std::ceil(want[i])), tile));
    const int before = b.depth;
    while (b.depth < need) {
      const int old = b.depth;
      b.depth = int(std::min<int64_t>(need, int64_t(b.depth) * 2));
      if (pmus_total() > a.pmus()) {
        b.depth = old;
        break;
      }
    }
    if (b.depth != before)
      notes.push_back("kernel call " + std::to_string(call + 1) + ": buffer '" + b.name + "' deepened from " +
                      std::to_string(before) + " to " + std::to_string(b.depth) + " slots to keep " +
                      std::to_string(int64_t(want[i])) + " bytes of '" + s.name + "' in flight");
  }
  return agcus;
}

// A fold whose running value is small and read by nothing but the stage that combines it (the sums of
// DotProduct and TPC-H Q6: acc = acc + sum(tile)) keeps that value in an accumulator register at the end
// of the combining PCU's pipeline, as a reduction tree's last stage does. The value then never leaves the
// PCU: no PMU holds it and no route carries it, and iteration i + 1 needs it only when its own partial
// result reaches that last stage, one pipeline depth after it fires, by when iteration i's combine is done.
// So the recurrence no longer waits for the stage's pipeline latency and routes every iteration; the carry
// stage's forwarding (init at the start of a loop run, the register otherwise) still costs its cycle.
// Larger carried values (Kmeans' centroids) or values other stages read stay in PMUs.
void keep_accumulators_in_registers(const Arch& a, Graph& g, std::vector<std::string>& notes) {
  const int64_t register_bytes = int64_t(a.pcu_lanes) * 4;  // one 32-bit word per lane
  for (size_t b = 0; b < g.buffers.size(); ++b) {
    Buffer& carried = g.buffers[b];
    if (carried.initial_tokens <= 0 || carried.control || carried.bytes > register_bytes) continue;
    const int s = g.producer_of(int(b));
    const std::vector<int> carriers = g.consumers_of(int(b));
    if (s < 0 || carriers.size() != 1) continue;
    const Stage& S = g.stages[size_t(s)];
    const Stage& C = g.stages[size_t(carriers[0])];
    if (S.kind != StageKind::Compute || S.is_control() || S.is_matmul() || !C.is_control() ||
        C.outputs.size() != 1 || C.iterations != S.iterations)
      continue;
    Buffer& arg = g.buffers[size_t(C.outputs[0])];
    const std::vector<int> readers = g.consumers_of(C.outputs[0]);
    if (arg.control || arg.bytes > register_bytes || readers.size() != 1 || readers[0] != s) continue;
    carried.in_register = arg.in_register = true;
    // The same value on its way to the loop's result (a yield taking the last of each run) is read from
    // the register too; only the run's last value leaves the PCU (the simulator gives it the latency).
    for (int o : S.outputs) {
      Buffer& out = g.buffers[size_t(o)];
      const std::vector<int> cons = g.consumers_of(o);
      bool to_yield = !cons.empty() && !out.control && out.initial_tokens == 0 && out.bytes <= register_bytes;
      for (int c : cons)
        to_yield = to_yield && g.stages[size_t(c)].is_control() && g.stages[size_t(c)].accumulate > 1 &&
                   g.stages[size_t(c)].iterations == S.iterations;
      if (to_yield) out.in_register = true;
    }
    notes.push_back("loop-carried '" + carried.name + "' kept in an accumulator register of stage '" +
                    S.name +
                    "': the fold costs one cycle per iteration, not the stage's pipeline and routes");
  }
}

// The widest parallel access of every buffer (par x lanes of its producer or a consumer) decides its banks.
void set_access_width(const Arch& a, Graph& g, const std::vector<int>& par) {
  for (size_t b = 0; b < g.buffers.size(); ++b) {
    Buffer& buf = g.buffers[b];
    auto width = [&](int st) {
      return g.stages[size_t(st)].kind == StageKind::Compute ? par[size_t(st)] * a.pcu_lanes : a.pcu_lanes;
    };
    buf.access_lanes = 0;
    if (int p = g.producer_of(int(b)); p >= 0) buf.access_lanes = std::max(buf.access_lanes, width(p));
    for (int c : g.consumers_of(int(b))) buf.access_lanes = std::max(buf.access_lanes, width(c));
  }
}

// An element-wise stage much slower than the memory streams of its program would bind a bandwidth-bound
// program to its PCUs: when the whole graph fits one configuration, the slowest such stage gets twice
// the copies while that shortens it, keeps the graph in one configuration, and the stage still takes more
// than half the time the program's off-chip bytes need at the peak rate (counting the slowdown an earlier
// place & route measured on the mesh, MapOptions::stage_slowdown). `par` from the IR is the floor;
// a matmul's par stays the parallelize pass's choice (its compute, not the memory, is what it trades).
void raise_par_to_memory_rate(const Arch& a, const Graph& g0, const std::vector<double>& slowdown,
                              std::vector<int>& par, std::vector<std::string>& notes) {
  Graph g = g0;
  auto fits = [&]() {
    int pcus = 0, pmus = 0, ag = 0;
    for (size_t i = 0; i < g.stages.size(); ++i)
      if (g.stages[i].kind == StageKind::Compute)
        pcus += map_stage(a, g, g.stages[i], par[i]).pcus;
      else
        ++ag;
    set_access_width(a, g, par);
    for (auto& b : g.buffers) pmus += buffer_pmus(a, b);
    return pcus <= a.pcus() && pmus <= a.pmus() && ag <= a.agcus;
  };
  if (g.stages.empty() || !fits()) return;
  const double peak_bpc = a.memory().peak_gbs() / a.clock_ghz;
  const double mem_cycles = double(g.offchip_bytes(false) + g.offchip_bytes(true)) / peak_bpc;
  if (mem_cycles <= 0) return;
  const std::vector<int> asked = par;
  for (;;) {
    int worst = -1;
    double worst_t = 0;
    for (size_t i = 0; i < g.stages.size(); ++i) {
      const Stage& s = g.stages[i];
      if (s.kind != StageKind::Compute || s.is_control() || s.is_matmul()) continue;
      const double slow = i < slowdown.size() ? std::max(1.0, slowdown[i]) : 1.0;
      const double t = double(map_stage(a, g, s, par[i]).ii) * slow * double(s.iterations);
      if (t > worst_t) worst = int(i), worst_t = t;
    }
    if (worst < 0 || worst_t <= 0.5 * mem_cycles) break;
    const size_t w = size_t(worst);
    const int old = par[w];
    const int64_t old_ii = map_stage(a, g, g.stages[w], old).ii;
    par[w] = old * 2;
    if (map_stage(a, g, g.stages[w], par[w]).ii >= old_ii || !fits()) {
      par[w] = old;
      break;
    }
  }
  for (size_t i = 0; i < g.stages.size(); ++i)
    if (par[i] != asked[i])
      notes.push_back("stage '" + g.stages[i].name + "': par " + std::to_string(asked[i]) + " raised to " +
                      std::to_string(par[i]) + " to keep up with the memory streams");
}

// Off-chip tensors are allocated so that tensors streamed side by side keep their rows in different banks.
// A channel receives 1/channels of every address range, so its DRAM row advances every channels x
// row_bytes bytes of a tensor, and the controller hashes a row's bank as (row xor row / banks) mod banks
// (sim.cpp): for tensors starting at multiples of banks such rows ("groups"), tiles at the same index lie
// in the same bank exactly when the tensors' group indices agree modulo banks. Tensors of equal size
// (DotProduct's two vectors, BlackScholes' six inputs and its output: 4 MiB, a multiple of banks groups
// on Plasticine) would then share a bank in every channel, and their streams would close each other's
// rows at every switch. So the k-th tensor starts at the first group boundary after the previous one
// whose index is, modulo banks, k with its bits reversed (0, 8, 4, 12, 2, ... for 16 banks): two
// tensors' indices then differ in a high bit, so a stream one row ahead of another (rows r + 1 and r,
// whose banks differ by an odd xor) does not land in the other's bank either. At most banks - 1 groups
// stay unused per tensor (15 MiB on the SN40L).
void allocate_tensors(const Arch& a, Graph& g) {
  const Memory& mem = a.memory();
  const int64_t group = int64_t(mem.channels) * mem.row_bytes * mem.banks;
  int bits = 0;
  while ((int64_t(1) << (bits + 1)) <= mem.banks) ++bits;
  const bool pow2 = (int64_t(1) << bits) == mem.banks;
  auto residue = [&](int64_t k) {
    if (!pow2) return k % mem.banks;
    int64_t r = 0;
    for (int b = 0; b < bits; ++b) r |= ((k >> b) & 1) << (bits - 1 - b);
    return r;
  };
  int64_t next = 0, k = 0;
  for (auto& t : g.tensors) {
    int64_t index = (next + group - 1) / group;
    index += ((residue(k++) - index) % mem.banks + mem.banks) % mem.banks;
    t.base = index * group;
    next = t.base + std::max<int64_t>(t.bytes, 1);
  }
}

}  // namespace

StageMap map_stage(const Arch& a, const Graph& g, const Stage& s, int par) {
  StageMap m;
  m.par = par;
  if (s.kind != StageKind::Compute) {
    m.mode = "agcu";
    m.pcus = 0;
    m.ii = 1;
    return m;
  }
  // Bytes each copy streams from its input PMUs per iteration: one vector link per PMU port.
  int64_t in_bytes = 0;
  for (auto& in : s.inputs) in_bytes = std::max(in_bytes, g.buffers[in.buffer].bytes);
  int64_t net_ii = cdiv(in_bytes, int64_t(a.link_bytes) * par);
  if (s.is_control()) {
    m.mode = "control";
    m.chain = 0;
    m.pcus = 0;
    m.ii = 1;
    return m;
  }
  m.mode = "simd";
  m.chain = 0;
  m.ii = 0;
  if (s.elements > 0 && s.ops > 0) {
    m.chain = int(cdiv(s.ops, a.pcu_stages));
    m.ii = cdiv(s.elements, int64_t(a.pcu_lanes) * par);
    m.latency = int64_t(m.chain) * (a.pcu_stages + a.hop_cycles);
  }
  if (s.is_matmul()) {
    // SIMD: lanes x stages MACs per PCU and cycle; systolic (when the arch has it): the systolic model of
    // ../systolic with its fold and skew costs. The compiler picks the faster mode for the shape.
    int64_t simd = cdiv(s.m * s.k * s.n, int64_t(a.pcu_lanes) * a.pcu_stages * par);
    int64_t mm_ii = simd, mm_lat = a.pcu_stages;
    if (a.pcu_systolic && s.systolic_ok) {
      int64_t sys = systolic_cycles(a, s.m, s.k, cdiv(s.n, par));
      if (sys < simd + a.pcu_stages) {
        m.mode = "systolic";
        mm_ii = sys;
        mm_lat = 0;  // the systolic cycle count includes fill and drain
      }
    }
    // the elementwise part (if any) streams through a chain behind the matmul PCU
    m.ii = std::max(m.ii, mm_ii);
    m.latency += mm_lat;
    m.chain += 1;
  }
  m.ii = std::max<int64_t>({m.ii, net_ii, 1});
  m.pcus = m.chain * par;
  return m;
}

Mapping map_graph(const Arch& a, const Graph& g0, const MapOptions& opt) {
  g0.validate();
  Graph g = g0;  // buffers get their access width below
  allocate_tensors(a, g);
  Mapping out;
  const int npcu = a.pcus(), npmu = a.pmus(), nag = a.agcus;
  // Choose par per stage: as asked, lowered when one stage alone does not fit the chip.
  std::vector<int> par(g.stages.size());
  for (size_t i = 0; i < g.stages.size(); ++i) {
    const Stage& s = g.stages[i];
    par[i] = s.par;
    if (s.kind != StageKind::Compute) continue;
    while (par[i] > 1 && map_stage(a, g, s, par[i]).pcus > npcu) par[i] = std::max(1, par[i] / 2);
    int need = map_stage(a, g, s, par[i]).pcus;
    MP_USER_CHECK(need <= npcu, "stage '", s.name, "' needs a chain of ", need, " PCUs (", s.ops,
                  " ops per element at ", a.pcu_stages, " stages per PCU) but ", a.name, " has ", npcu,
                  "; split the stage's function");
    if (par[i] != s.par)
      out.notes.push_back("stage '" + s.name + "': par " + std::to_string(s.par) + " lowered to " +
                          std::to_string(par[i]) + " to fit " + std::to_string(npcu) + " PCUs");
  }
  // Greedy packing in graph order (stages are listed producers first by construction of every builder).
  std::vector<int> cfg_of(g.stages.size(), -1);
  std::vector<int> group_end(g.stages.size(), -1);  // back edges: consumer -> latest producer
  for (size_t b = 0; b < g.buffers.size(); ++b) {
    int p = g.producer_of(int(b));
    for (int c : g.consumers_of(int(b)))
      if (p > c) group_end[size_t(c)] = std::max(group_end[size_t(c)], p);
  }
  // A loop-carried cycle that does not fit the chip even alone gets less parallelism, widest stages first.
  for (size_t i = 0; i < g.stages.size(); ++i) {
    if (group_end[i] <= int(i)) continue;
    auto group_pcus = [&]() {
      int n = 0;
      for (int k = int(i); k <= group_end[i]; ++k)
        n += map_stage(a, g, g.stages[size_t(k)], par[size_t(k)]).pcus;
      return n;
    };
    bool lowered = false;
    while (group_pcus() > npcu) {
      int widest = -1;
      for (int k = int(i); k <= group_end[i]; ++k)
        if (par[size_t(k)] > 1 && (widest < 0 || par[size_t(k)] > par[size_t(widest)])) widest = k;
      if (widest < 0) break;
      par[size_t(widest)] = std::max(1, par[size_t(widest)] / 2);
      lowered = true;
    }
    if (lowered)
      out.notes.push_back("the loop-carried cycle from stage '" + g.stages[i].name +
                          "' had its parallelism lowered to fit " + std::to_string(npcu) + " PCUs");
  }
  keep_accumulators_in_registers(a, g, out.notes);
  raise_par_to_memory_rate(a, g, opt.stage_slowdown, par, out.notes);
  // Buffers: their widest parallel access decides the banks (PMUs) they need besides capacity and slots.
  set_access_width(a, g, par);
  for (size_t b = 0; b < g.buffers.size(); ++b) {
    Buffer& buf = g.buffers[b];
    int p = buffer_pmus(a, buf);
    MP_USER_CHECK(p <= npmu, "buffer '", buf.name, "' needs ", buf.bytes * buf.depth, " bytes (", buf.depth,
                  " x ", buf.bytes, ") = ", p, " PMUs but ", a.name, " has ", npmu, " PMUs of ",
                  a.pmu_bytes(), " bytes; use a smaller tile");
    if (p > 1)
      out.notes.push_back("buffer '" + buf.name + "' spans " + std::to_string(p) + " PMUs (" +
                          std::to_string(buf.depth) + " x " + std::to_string(buf.bytes) + " bytes, " +
                          std::to_string(buf.access_lanes) + " lanes wide)");
  }

  struct Use {
    int pcus = 0, pmus = 0, agcus = 0;
  };
  std::vector<Use> uses(1);
  std::vector<std::string> why(1);
  int last_statement = -1;
  // Buffers are charged to the configuration of their producer, and again (as spill buffers) to a later
  // consumer configuration; the estimate below counts a stage's outputs and any inputs from earlier configs.
  for (size_t i = 0; i < g.stages.size(); ++i) {
    const Stage& s = g.stages[i];
    auto need_for = [&](int cfg) {
      Use u;
      u.pcus = map_stage(a, g, s, par[i]).pcus;
      u.agcus = s.kind == StageKind::Compute ? 0 : 1;
      for (int o : s.outputs) u.pmus += buffer_pmus(a, g.buffers[o]);
      for (auto& in : s.inputs) {
        int p = g.producer_of(in.buffer);
        if (p >= 0 && cfg_of[p] >= 0 && cfg_of[p] != cfg && !g.buffers[in.buffer].control) {
          Buffer spilled = g.buffers[in.buffer];
          spilled.in_register = false;  // a spill load fills a PMU
          u.pmus += buffer_pmus(a, spilled);
          u.agcus += 1;
        }
      }
      return u;
    };
    int cfg = int(uses.size()) - 1;
    Use u = need_for(cfg);
    // A call boundary the caller asks for (a fusion level) before the first stage of a later statement.
    if (opt.split_between && last_statement >= 0 && s.statement > last_statement &&
        std::find(cfg_of.begin(), cfg_of.begin() + int64_t(i), cfg) != cfg_of.begin() + int64_t(i)) {
      std::string reason = opt.split_between(last_statement, s.statement);
      if (!reason.empty()) {
        why.back() = reason;
        uses.push_back({});
        why.push_back("");
        cfg = int(uses.size()) - 1;
        u = need_for(cfg);
      }
    }
    last_statement = std::max(last_statement, s.statement);
    // A loop-carried cycle (stage i reads what a later stage writes) must stay in one configuration: when
    // the whole cycle does not fit what is left, start a new configuration here.
    if (group_end[i] > int(i) && (uses[cfg].pcus || uses[cfg].pmus || uses[cfg].agcus)) {
      Use grp;
      for (int k = int(i); k <= group_end[i]; ++k) {
        grp.pcus += map_stage(a, g, g.stages[size_t(k)], par[size_t(k)]).pcus;
        grp.agcus += g.stages[size_t(k)].kind == StageKind::Compute ? 0 : 1;
        for (int o : g.stages[size_t(k)].outputs) grp.pmus += buffer_pmus(a, g.buffers[size_t(o)]);
        for (auto& in : g.stages[size_t(k)].inputs) {
          int p = g.producer_of(in.buffer);
          if (p >= 0 && cfg_of[p] >= 0 && cfg_of[p] != cfg && !g.buffers[in.buffer].control)
            grp.pmus += buffer_pmus(a, g.buffers[in.buffer]), grp.agcus += 1;
        }
      }
      const Use& cur = uses[cfg];
      if (cur.pcus + grp.pcus > npcu || cur.pmus + grp.pmus > npmu || cur.agcus + grp.agcus > nag) {
        why.back() = "the loop-carried cycle from stage '" + s.name + "' to stage '" +
                     g.stages[size_t(group_end[i])].name + "' does not fit what is left of the configuration";
        uses.push_back({});
        why.push_back("");
        cfg = int(uses.size()) - 1;
        u = need_for(cfg);
      }
    }
    Use& cur = uses[cfg];
    std::string short_of;
    if (cur.pcus + u.pcus > npcu)
      short_of = "PCUs (" + std::to_string(cur.pcus + u.pcus) + " > " + std::to_string(npcu) + ")";
    else if (cur.pmus + u.pmus > npmu)
      short_of = "PMUs (" + std::to_string(cur.pmus + u.pmus) + " > " + std::to_string(npmu) + ")";
    else if (cur.agcus + u.agcus > nag)
      short_of = "AGCUs (" + std::to_string(cur.agcus + u.agcus) + " > " + std::to_string(nag) + ")";
    if (!short_of.empty() && (cur.pcus || cur.pmus || cur.agcus)) {
      why.back() = "stage '" + s.name + "' does not fit: the configuration would need " + short_of;
      uses.push_back({});
      why.push_back("");
      cfg = int(uses.size()) - 1;
      u = need_for(cfg);
    }
    MP_USER_CHECK(u.pcus <= npcu && u.pmus <= npmu && u.agcus <= nag, "stage '", s.name, "' alone needs ",
                  u.pcus, " PCUs, ", u.pmus, " PMUs and ", u.agcus, " AGCUs; ", a.name, " has ", npcu, ", ",
                  npmu, " and ", nag);
    uses[cfg].pcus += u.pcus;
    uses[cfg].pmus += u.pmus;
    uses[cfg].agcus += u.agcus;
    cfg_of[i] = cfg;
  }

  // A loop-carried buffer (written by a later stage, read by an earlier one) must stay in one configuration.
  for (size_t b = 0; b < g.buffers.size(); ++b) {
    int p = g.producer_of(int(b));
    if (p < 0) continue;
    for (int c : g.consumers_of(int(b)))
      if (cfg_of[c] < cfg_of[p])
        throw not_supported("splitting the loop-carried buffer '" + g.buffers[b].name +
                            "' across kernel calls (stage '" + g.stages[c].name + "' in call " +
                            std::to_string(cfg_of[c] + 1) + " reads what stage '" + g.stages[p].name +
                            "' writes in call " + std::to_string(cfg_of[p] + 1) +
                            "); use a larger architecture or less parallelism");
  }
  // Build one graph per configuration.
  const int ncfg = int(uses.size());
  std::vector<int> spill_tensor(g.buffers.size(), -1);
  for (int c = 0; c < ncfg; ++c) {
    Config cf;
    cf.why = why[c];
    Graph& sg = cf.graph;
    sg.name = g.name + (ncfg > 1 ? " [call " + std::to_string(c + 1) + "/" + std::to_string(ncfg) + "]" : "");
    sg.tensors = g.tensors;  // the same off-chip space (spills appended below)
    for (size_t b = 0; b < g.buffers.size(); ++b)
      if (spill_tensor[b] >= 0) sg.tensors.push_back(Tensor{"spill:" + g.buffers[b].name, 0, -1, {}, {}});
    std::map<int, int> bmap;  // original buffer -> buffer in this config
    auto local_buffer = [&](int b) {
      auto it = bmap.find(b);
      if (it != bmap.end()) return it->second;
      Buffer nb = g.buffers[b];
      sg.buffers.push_back(nb);
      int id = int(sg.buffers.size()) - 1;
      bmap[b] = id;
      if (nb.initial_tokens > 0 && b < int(g.initial_data.size())) {
        sg.initial_data.resize(sg.buffers.size());
        sg.initial_data[id] = g.initial_data[b];
      }
      return id;
    };
    for (size_t i = 0; i < g.stages.size(); ++i) {
      if (cfg_of[i] != c) continue;
      Stage s = g.stages[i];
      s.par = par[i];
      for (auto& in : s.inputs) {
        // ordering tokens from an earlier kernel call: that call has finished, so they are all there
        if (int p = g.producer_of(in.buffer); g.buffers[in.buffer].control && p >= 0 && cfg_of[p] < c) {
          int64_t need = s.iterations / in.reuse;
          sg.buffers.push_back(
              Buffer{"ready: " + g.buffers[in.buffer].name, 4, int(std::max<int64_t>(1, need)), need, true});
          sg.initial_data.resize(sg.buffers.size());
          sg.initial_data.back().assign(size_t(need), 0.f);
          in.buffer = int(sg.buffers.size()) - 1;
          continue;
        }
        int p = g.producer_of(in.buffer);
        if (p >= 0 && cfg_of[p] < c) {
          // Spill load: the producer's configuration stored every token off chip.
          int ob = in.buffer;
          if (bmap.find(ob) == bmap.end()) {
            int lb = local_buffer(ob);
            // a register's value read in a later call (a fold's result whose yield did not fit): the
            // producer's call stores it from the register, this call loads it into a PMU
            sg.buffers[size_t(lb)].in_register = false;
            const Stage& ps = g.stages[p];
            Stage ld;
            ld.name = "spill-load " + g.buffers[ob].name;
            ld.kind = StageKind::Load;
            ld.phase = s.phase;  // read when its consumer runs
            ld.iterations = ps.iterations / ps.accumulate;
            ld.outputs = {lb};
            ld.tensor = -1;
            for (size_t t = 0; t < sg.tensors.size(); ++t)
              if (sg.tensors[t].name == "spill:" + g.buffers[ob].name) ld.tensor = int(t);
            ld.access.row_bytes = g.buffers[ob].bytes;
            ld.access.iter_stride = g.buffers[ob].bytes;
            int64_t el = g.buffers[ob].elems();
            ld.kernel = [el](StageIO& io) {
              std::copy_n(io.tensor + io.iter * el, el, io.out[0]);
              if (io.iter < int64_t(io.tensor_objs->size()))
                *io.out_obj[0] = (*io.tensor_objs)[size_t(io.iter)];
            };
            sg.stages.push_back(std::move(ld));
            cf.original_stage.push_back(-1);
          }
          in.buffer = bmap[ob];
        } else {
          in.buffer = local_buffer(in.buffer);
        }
      }
      std::vector<int> spilled;
      for (auto& o : s.outputs) {
        bool later = false;
        for (int cons : g.consumers_of(o)) later = later || (cfg_of[cons] > c && !g.buffers[o].control);
        int orig = o;
        o = local_buffer(o);
        if (later) spilled.push_back(orig);
      }
      sg.stages.push_back(std::move(s));
      cf.original_stage.push_back(int(i));
      for (int ob : spilled) {
        if (spill_tensor[ob] < 0) {
          spill_tensor[ob] = 1;
          sg.tensors.push_back(Tensor{"spill:" + g.buffers[ob].name, 0, -1, {}, {}});
        }
        const Stage& ps = g.stages[i];
        int64_t tokens = ps.iterations / ps.accumulate;
        Stage st;
        st.name = "spill-store " + g.buffers[ob].name;
        st.kind = StageKind::Store;
        st.phase = ps.phase;  // written as its producer runs
        st.iterations = tokens;
        st.inputs = {{bmap[ob], 1}};
        for (size_t t = 0; t < sg.tensors.size(); ++t)
          if (sg.tensors[t].name == "spill:" + g.buffers[ob].name) st.tensor = int(t);
        sg.tensors[st.tensor].bytes = g.buffers[ob].bytes * tokens;
        st.access.row_bytes = g.buffers[ob].bytes;
        st.access.iter_stride = g.buffers[ob].bytes;
        int64_t el = g.buffers[ob].elems();
        st.kernel = [el](StageIO& io) {
          std::copy_n(io.in[0], el, io.tensor + io.iter * el);
          if (int64_t(io.tensor_objs->size()) <= io.iter) io.tensor_objs->resize(size_t(io.iter + 1));
          (*io.tensor_objs)[size_t(io.iter)] = *io.in_obj[0];
        };
        sg.stages.push_back(std::move(st));
        cf.original_stage.push_back(-1);
      }
    }
    // spill tensors sizes for loads in later configs
    for (auto& t : sg.tensors)
      if (t.name.rfind("spill:", 0) == 0 && t.bytes == 0)
        for (size_t b = 0; b < g.buffers.size(); ++b)
          if (t.name == "spill:" + g.buffers[b].name) {
            int p = g.producer_of(int(b));
            t.bytes = g.buffers[b].bytes * (g.stages[p].iterations / g.stages[p].accumulate);
          }
    sg.layout();
    sg.validate();
    const std::vector<int> stream_agcus = plan_streams(a, sg, c, out.notes);
    std::map<int, int> agcus_of_phase;
    for (size_t i = 0; i < sg.stages.size(); ++i) {
      const Stage& s = sg.stages[i];
      cf.stages.push_back(map_stage(a, sg, s, s.par));
      cf.pcus += cf.stages.back().pcus;
      cf.stages.back().agcus = stream_agcus[i];
      agcus_of_phase[s.phase] += stream_agcus[i];
    }
    for (auto& [ph, n] : agcus_of_phase) cf.agcus = std::max(cf.agcus, std::min(n, a.agcus));
    for (auto& b : sg.buffers) {
      cf.buffers.push_back({buffer_pmus(a, b), b.depth});
      cf.pmus += cf.buffers.back().pmus;
    }
    out.configs.push_back(std::move(cf));
  }
  return out;
}

}  // namespace mp::rdu
