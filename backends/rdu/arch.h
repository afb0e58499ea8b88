// The architecture model of the simulated reconfigurable dataflow accelerator (Plasticine / SN40L style):
// a grid of PCUs and PMUs in a checkerboard, AGCUs on the edges, a mesh of switches, off-chip memories.
// Read from plain-text .arch files (key = value, documented in docs/rdu.md); presets are built in.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mp::rdu {

// One off-chip memory (DDR3 channel set, HBM, DDR5...). Timing is in nanoseconds, converted to core
// cycles by the simulator. The DRAM timing keys model what makes a real channel deliver less than its pin
// bandwidth: row (page) misses, refresh, and read/write bus turnaround.
struct Memory {
  std::string name;
  int channels = 1;
  double channel_gbs = 12.8;  // pin bandwidth per channel, GB/s (1e9 bytes/s)
  double latency_ns = 50;     // request to first data, row hit, unloaded
  int burst_bytes = 64;       // one request moves this many bytes
  double capacity_gb = 4;
  int banks = 8;                      // banks per channel (row buffers)
  int row_bytes = 8192;               // row (page) size per bank across the channel
  double row_miss_ns = 27.5;          // precharge + activate (tRP + tRCD)
  double refresh_interval_ns = 7800;  // tREFI (0 = no refresh)
  double refresh_ns = 260;            // tRFC: channel blocked this long every refresh interval
  // Refreshes a channel may owe: while requests wait, the controller postpones due refreshes, at most
  // this many, and issues the ones it owes as soon as its queue is empty (JEDEC DDR3/DDR4/HBM allow 8
  // postponed REF commands; 0: every refresh is issued when it falls due).
  int refresh_postpone = 0;
  // Per-bank refresh (REFpb / REFSB): > 0 refreshes each bank separately, for this long (tRFCsb), while
  // the channel's other banks keep serving; every bank is refreshed once per refresh_interval_ns. Refreshes
  // of different banks may overlap in time, their commands at least refresh_bank_gap_ns apart (tRREFD). 0:
  // all-bank refresh (refresh_ns, the whole channel blocked).
  double refresh_bank_ns = 0;
  double refresh_bank_gap_ns = 8;  // tRREFD: REFSB to REFSB (different banks) of one channel
  double turnaround_ns = 7.5;      // bus idle when switching between reads and writes
  int interleave_bytes = 256;      // address interleaving granularity across channels
  double peak_gbs() const { return channels * channel_gbs; }
};

struct Arch {
  std::string name;
  std::string source;  // file name or "preset NAME", for messages
  double clock_ghz = 1.0;
  int rows = 8, cols = 16;  // unit grid; checkerboard: (r + c) even is a PCU, odd a PMU
  // PCU: a SIMD pipeline of `stages` stages x `lanes` lanes; optionally a systolic array mode.
  int pcu_lanes = 16, pcu_stages = 6;
  bool pcu_systolic = false;
  int systolic_rows = 16, systolic_cols = 8;
  // PMU: banked scratchpad.
  int pmu_banks = 16;
  int64_t pmu_bank_bytes = 16 * 1024;
  int pmu_max_nbuf = 4;  // N-buffering supported by a PMU's address logic
  // AGCU: address generation and coalescing units, the portals to off-chip memory.
  int agcus = 16;
  int agcu_outstanding = 32;  // requests in flight per AGCU
  // Mesh: links between neighbouring switches.
  int link_bytes = 64;  // bytes per cycle per link direction (vector network: 16 x 32 bit)
  int hop_cycles = 1;
  // Kernel calls: cycles to load a configuration onto the fabric.
  int64_t config_cycles = 10000;
  // Socket-to-socket links (tensor parallelism over several chips): a ring all-reduce moves its chunks
  // over these, outside the mesh and the program memory. Bandwidth per link direction and the latency of
  // one transfer (link, protocol and the receiving socket's write into its PMUs).
  double socket_link_gbs = 64;
  double socket_link_latency_ns = 1000;
  std::vector<Memory> memories;  // at least one
  std::string program_memory;    // memory that holds program tensors (default: the first)

  int pcus() const { return (rows * cols + 1) / 2; }
  int pmus() const { return rows * cols / 2; }
  int64_t pmu_bytes() const { return pmu_banks * pmu_bank_bytes; }
  bool is_pcu(int r, int c) const { return (r + c) % 2 == 0; }
  const Memory& memory() const;              // the program memory
  double peak_flops_per_cycle() const;       // all PCUs, FMA = 2 flops
  std::vector<std::string> summary() const;  // lines for `metapipe info` and reports
};

// Parse an architecture description. `origin` names the file in messages. Throws user_error naming the
// line and key and what is expected.
Arch parse_arch(const std::string& text, const std::string& origin);
// A preset name (plasticine, sn40l) or a path to an .arch file.
Arch load_arch(const std::string& name_or_file);
// Apply NAME=VALUE overrides (same keys as the file).
void apply_override(Arch& a, const std::string& assignment);
std::vector<std::string> preset_names();
std::string preset_text(const std::string& name);  // empty when unknown
// Every key with a one-line description, for docs and error messages.
std::vector<std::pair<std::string, std::string>> arch_keys();

}  // namespace mp::rdu
