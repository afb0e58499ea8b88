// Parsing, presets and overrides of the architecture model.
#include "backends/rdu/arch.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "core/error.h"

namespace mp::rdu {

// Defined in the generated presets file (the .arch files under backends/rdu/arch, embedded at build time).
extern const std::vector<std::pair<std::string, std::string>>& builtin_presets();

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

enum class Kind { Int, Pos, Real, Bool, Str };

struct Ctx {
  std::string where;  // "file:line: "
  std::string key, value;
};

[[noreturn]] void bad(const Ctx& c, const std::string& expected) {
  fail_user(c.where, "key '", c.key, "' expects ", expected, ", got '", c.value, "'");
}

// Every numeric key has a range (docs/rdu.md): wide enough for any chip worth modelling, narrow enough
// that the products the mapper and the simulator form (grid size, PMU bytes, cycles per burst) cannot
// overflow and simulated time always advances.
int64_t as_int(const Ctx& c, int64_t lo, int64_t hi) {
  int64_t x = 0;
  auto [p, ec] = std::from_chars(c.value.data(), c.value.data() + c.value.size(), x);
  const std::string range = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (ec != std::errc() || p != c.value.data() + c.value.size() || x < lo || x > hi) bad(c, range);
  return x;
}
std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}
// A finite number in [lo, hi]; with lo == 0 and `positive`, in (0, hi].
double as_real(const Ctx& c, double lo, double hi, bool positive = false) {
  char* end = nullptr;
  double x = std::strtod(c.value.c_str(), &end);
  const std::string range = positive && lo == 0 ? "a number in (0, " + num(hi) + "]"
                                                : "a number in [" + num(lo) + ", " + num(hi) + "]";
  if (c.value.empty() || end != c.value.c_str() + c.value.size() || !std::isfinite(x) || x < lo || x > hi ||
      (positive && x <= 0))
    bad(c, range);
  return x;
}
bool as_bool(const Ctx& c) {
  if (c.value == "true" || c.value == "yes" || c.value == "1") return true;
  if (c.value == "false" || c.value == "no" || c.value == "0") return false;
  bad(c, "true or false");
}

struct KeyDef {
  std::string desc;
  std::function<void(Arch&, const Ctx&)> set;
};
struct MemKeyDef {
  std::string desc;
  std::function<void(Memory&, const Ctx&)> set;
};

const std::map<std::string, KeyDef>& chip_keys() {
  static const std::map<std::string, KeyDef> k = {
      {"name", {"preset name shown in reports", [](Arch& a, const Ctx& c) { a.name = c.value; }}},
      {"clock_ghz",
       {"fabric clock in GHz", [](Arch& a, const Ctx& c) { a.clock_ghz = as_real(c, 0.001, 100); }}},
      {"grid.rows",
       {"rows of the unit grid", [](Arch& a, const Ctx& c) { a.rows = int(as_int(c, 1, 1024)); }}},
      {"grid.cols",
       {"columns of the unit grid", [](Arch& a, const Ctx& c) { a.cols = int(as_int(c, 1, 1024)); }}},
      {"grid.layout",
       {"placement of PCUs and PMUs: checkerboard",
        [](Arch&, const Ctx& c) {
          if (c.value != "checkerboard") bad(c, "checkerboard (the only layout modelled)");
        }}},
      {"pcu.lanes",
       {"SIMD lanes per PCU", [](Arch& a, const Ctx& c) { a.pcu_lanes = int(as_int(c, 1, 4096)); }}},
      {"pcu.stages",
       {"pipeline stages per PCU", [](Arch& a, const Ctx& c) { a.pcu_stages = int(as_int(c, 1, 1024)); }}},
      {"pcu.systolic",
       {"PCUs also run as systolic arrays (true/false)",
        [](Arch& a, const Ctx& c) { a.pcu_systolic = as_bool(c); }}},
      {"pcu.systolic_rows",
       {"systolic array rows", [](Arch& a, const Ctx& c) { a.systolic_rows = int(as_int(c, 1, 4096)); }}},
      {"pcu.systolic_cols",
       {"systolic array columns", [](Arch& a, const Ctx& c) { a.systolic_cols = int(as_int(c, 1, 4096)); }}},
      {"pmu.banks",
       {"scratchpad banks per PMU", [](Arch& a, const Ctx& c) { a.pmu_banks = int(as_int(c, 1, 4096)); }}},
      {"pmu.bank_kb",
       {"KiB per bank", [](Arch& a, const Ctx& c) { a.pmu_bank_bytes = as_int(c, 1, 1 << 20) * 1024; }}},
      {"pmu.max_nbuf",
       {"largest N of an N-buffer in one PMU",
        [](Arch& a, const Ctx& c) { a.pmu_max_nbuf = int(as_int(c, 1, 64)); }}},
      {"agcu.count",
       {"address generation and coalescing units",
        [](Arch& a, const Ctx& c) { a.agcus = int(as_int(c, 1, 4096)); }}},
      {"agcu.outstanding",
       {"memory requests in flight per AGCU",
        [](Arch& a, const Ctx& c) { a.agcu_outstanding = int(as_int(c, 1, 1 << 16)); }}},
      {"mesh.link_bytes",
       {"bytes per cycle per mesh link",
        [](Arch& a, const Ctx& c) { a.link_bytes = int(as_int(c, 1, 1 << 16)); }}},
      {"mesh.hop_cycles",
       {"cycles per switch hop", [](Arch& a, const Ctx& c) { a.hop_cycles = int(as_int(c, 0, 1 << 16)); }}},
      {"config.load_cycles",
       {"cycles to load one configuration (kernel call)",
        [](Arch& a, const Ctx& c) { a.config_cycles = as_int(c, 0, int64_t{1} << 40); }}},
      {"socket.link_gbs",
       {"socket-to-socket link bandwidth per direction, GB/s",
        [](Arch& a, const Ctx& c) { a.socket_link_gbs = as_real(c, 0.001, 1e5); }}},
      {"socket.link_latency_ns",
       {"latency of one socket-to-socket transfer, ns",
        [](Arch& a, const Ctx& c) { a.socket_link_latency_ns = as_real(c, 0, 1e6); }}},
      {"program_memory",
       {"name of the memory that holds program tensors",
        [](Arch& a, const Ctx& c) { a.program_memory = c.value; }}},
  };
  return k;
}

const std::map<std::string, MemKeyDef>& memory_keys() {
  static const std::map<std::string, MemKeyDef> k = {
      {"channels",
       {"independent channels", [](Memory& m, const Ctx& c) { m.channels = int(as_int(c, 1, 4096)); }}},
      {"channel_gbs",
       {"pin bandwidth per channel, GB/s",
        [](Memory& m, const Ctx& c) { m.channel_gbs = as_real(c, 0.001, 1e5); }}},
      {"latency_ns",
       {"unloaded access latency, ns", [](Memory& m, const Ctx& c) { m.latency_ns = as_real(c, 0, 1e6); }}},
      {"burst_bytes",
       {"bytes per request (burst)",
        [](Memory& m, const Ctx& c) { m.burst_bytes = int(as_int(c, 1, 1 << 20)); }}},
      {"capacity_gb",
       {"capacity, GB", [](Memory& m, const Ctx& c) { m.capacity_gb = as_real(c, 0, 1e7, true); }}},
      {"banks", {"banks per channel", [](Memory& m, const Ctx& c) { m.banks = int(as_int(c, 1, 1024)); }}},
      {"row_bytes",
       {"row (page) bytes per bank",
        [](Memory& m, const Ctx& c) { m.row_bytes = int(as_int(c, 1, 1 << 24)); }}},
      {"row_miss_ns",
       {"precharge + activate on a row miss, ns",
        [](Memory& m, const Ctx& c) { m.row_miss_ns = as_real(c, 0, 1e6); }}},
      {"refresh_interval_ns",
       {"refresh period tREFI, ns (0: none)",
        [](Memory& m, const Ctx& c) { m.refresh_interval_ns = as_real(c, 0, 1e9); }}},
      {"refresh_ns",
       {"refresh duration tRFC, ns", [](Memory& m, const Ctx& c) { m.refresh_ns = as_real(c, 0, 1e6); }}},
      {"refresh_postpone",
       {"refreshes a busy channel may postpone (issued once its queue is empty; JEDEC: at most 8)",
        [](Memory& m, const Ctx& c) { m.refresh_postpone = int(as_int(c, 0, 8)); }}},
      {"refresh_bank_ns",
       {"per-bank refresh duration tRFCsb, ns: the refreshed bank is busy, the others serve (0: all-bank "
        "refresh)",
        [](Memory& m, const Ctx& c) { m.refresh_bank_ns = as_real(c, 0, 1e6); }}},
      {"refresh_bank_gap_ns",
       {"least spacing of per-bank refresh commands to different banks of a channel (tRREFD), ns",
        [](Memory& m, const Ctx& c) { m.refresh_bank_gap_ns = as_real(c, 0, 1e6); }}},
      {"turnaround_ns",
       {"read/write bus turnaround, ns",
        [](Memory& m, const Ctx& c) { m.turnaround_ns = as_real(c, 0, 1e6); }}},
      {"interleave_bytes",
       {"channel interleaving granularity, bytes",
        [](Memory& m, const Ctx& c) { m.interleave_bytes = int(as_int(c, 1, 1 << 30)); }}},
  };
  return k;
}

std::string known_keys() {
  std::string s;
  for (auto& [k, _] : chip_keys()) s += (s.empty() ? "" : ", ") + k;
  s += ", memory.NAME.{";
  bool first = true;
  for (auto& [k, _] : memory_keys()) s += (first ? "" : ",") + k, first = false;
  return s + "}";
}

void set_key(Arch& a, const std::string& key, const std::string& value, const std::string& where) {
  Ctx c{where, key, value};
  if (value.empty()) fail_user(where, "key '", key, "' has no value (write ", key, " = VALUE)");
  if (auto it = chip_keys().find(key); it != chip_keys().end()) return it->second.set(a, c);
  if (key.rfind("memory.", 0) == 0) {
    auto dot = key.find('.', 7);
    if (dot == std::string::npos || dot == 7)
      fail_user(where, "key '", key, "' should be memory.NAME.FIELD (e.g. memory.ddr.channels)");
    std::string mem = key.substr(7, dot - 7), field = key.substr(dot + 1);
    auto it = memory_keys().find(field);
    if (it == memory_keys().end())
      fail_user(where, "unknown memory field '", field, "' in key '", key, "' (known keys: ", known_keys(),
                ")");
    auto m =
        std::find_if(a.memories.begin(), a.memories.end(), [&](const Memory& x) { return x.name == mem; });
    if (m == a.memories.end()) {
      a.memories.push_back(Memory{});
      a.memories.back().name = mem;
      m = a.memories.end() - 1;
    }
    it->second.set(*m, c);
    return;
  }
  fail_user(where, "unknown key '", key, "' (known keys: ", known_keys(), ")");
}

void check(const Arch& a) {
  const std::string w = a.source + ": ";
  MP_USER_CHECK(!a.memories.empty(), w,
                "no off-chip memory: add memory.NAME.channels, memory.NAME.channel_gbs, ...");
  MP_USER_CHECK(a.rows * a.cols >= 2, w, "grid.rows x grid.cols must hold at least one PCU and one PMU");
  if (!a.program_memory.empty()) {
    bool found = false;
    for (auto& m : a.memories) found = found || m.name == a.program_memory;
    MP_USER_CHECK(found, w, "key 'program_memory' names '", a.program_memory, "', but no memory.",
                  a.program_memory, ".* keys define it");
  }
  for (auto& m : a.memories) {
    MP_USER_CHECK(m.row_bytes % m.burst_bytes == 0, w, "key 'memory.", m.name, ".row_bytes' (", m.row_bytes,
                  ") must be a multiple of memory.", m.name, ".burst_bytes (", m.burst_bytes, ")");
    MP_USER_CHECK(m.refresh_interval_ns == 0 || m.refresh_ns < m.refresh_interval_ns, w, "key 'memory.",
                  m.name, ".refresh_ns' (", m.refresh_ns, ") must be shorter than memory.", m.name,
                  ".refresh_interval_ns (", m.refresh_interval_ns,
                  ") or the channel is never free (set refresh_interval_ns = 0 for no refresh)");
    MP_USER_CHECK(m.refresh_interval_ns == 0 || m.refresh_bank_ns < m.refresh_interval_ns, w, "key 'memory.",
                  m.name, ".refresh_bank_ns' (", m.refresh_bank_ns, ") must be shorter than memory.", m.name,
                  ".refresh_interval_ns (", m.refresh_interval_ns, ") or the bank is never free");
    MP_USER_CHECK(m.refresh_interval_ns == 0 || m.refresh_bank_ns == 0 ||
                      m.refresh_bank_gap_ns * m.banks < m.refresh_interval_ns,
                  w, "key 'memory.", m.name, ".refresh_bank_gap_ns' (", m.refresh_bank_gap_ns,
                  ") times memory.", m.name, ".banks (", m.banks, ") must be shorter than memory.", m.name,
                  ".refresh_interval_ns (", m.refresh_interval_ns,
                  "): a channel issues one per-bank refresh per bank and interval");
    MP_USER_CHECK(m.interleave_bytes % m.burst_bytes == 0, w, "key 'memory.", m.name, ".interleave_bytes' (",
                  m.interleave_bytes, ") must be a multiple of memory.", m.name, ".burst_bytes (",
                  m.burst_bytes, ")");
  }
  MP_USER_CHECK(a.pmu_max_nbuf >= 1, w, "pmu.max_nbuf must be >= 1");
}

}  // namespace

const Memory& Arch::memory() const {
  MP_INTERNAL_CHECK(!memories.empty(), "architecture without memory");
  for (auto& m : memories)
    if (m.name == program_memory) return m;
  return memories.front();
}

double Arch::peak_flops_per_cycle() const {
  double simd = double(pcus()) * pcu_lanes * pcu_stages * 2;
  double sys = pcu_systolic ? double(pcus()) * systolic_rows * systolic_cols * 2 : 0;
  return std::max(simd, sys);
}

std::vector<std::string> Arch::summary() const {
  std::vector<std::string> out;
  char buf[512];
  std::snprintf(
      buf, sizeof buf,
      "%s: %dx%d grid, %d PCUs (%d lanes x %d stages%s), %d PMUs (%d x %lld KiB = %.1f MiB total), %d AGCUs, "
      "%.2f GHz",
      name.c_str(), cols, rows, pcus(), pcu_lanes, pcu_stages,
      pcu_systolic
          ? (", systolic " + std::to_string(systolic_rows) + "x" + std::to_string(systolic_cols)).c_str()
          : "",
      pmus(), pmu_banks, (long long)(pmu_bank_bytes / 1024), pmus() * double(pmu_bytes()) / (1024.0 * 1024),
      agcus, clock_ghz);
  out.push_back(buf);
  std::snprintf(buf, sizeof buf, "  peak %.1f TFLOPS (fp32 FMA%s), mesh %d B/cycle per link",
                peak_flops_per_cycle() * clock_ghz / 1000, pcu_systolic ? " or bf16 systolic" : "",
                link_bytes);
  out.push_back(buf);
  for (auto& m : memories) {
    std::snprintf(buf, sizeof buf, "  memory %s: %d x %.1f GB/s = %.1f GB/s, %.0f GB, %.0f ns, %d B bursts%s",
                  m.name.c_str(), m.channels, m.channel_gbs, m.peak_gbs(), m.capacity_gb, m.latency_ns,
                  m.burst_bytes, &m == &memory() ? " (program memory)" : "");
    out.push_back(buf);
  }
  return out;
}

Arch parse_arch(const std::string& text, const std::string& origin) {
  Arch a;
  a.memories.clear();
  a.source = origin;
  a.name = origin;
  std::istringstream is(text);
  std::string line;
  int n = 0;
  std::map<std::string, int> seen;  // key -> line: a key given twice is an error, never "the last wins"
  while (std::getline(is, line)) {
    ++n;
    if (auto h = line.find('#'); h != std::string::npos) line = line.substr(0, h);
    line = trim(line);
    if (line.empty()) continue;
    std::string where = origin + ":" + std::to_string(n) + ": ";
    auto eq = line.find('=');
    if (eq == std::string::npos) fail_user(where, "expected 'key = value', got '", line, "'");
    std::string key = trim(line.substr(0, eq)), value = trim(line.substr(eq + 1));
    if (auto [it, fresh] = seen.emplace(key, n); !fresh)
      fail_user(where, "key '", key, "' is given twice (first on line ", it->second,
                "); keep one (use --set ", key, "=VALUE to override a file's value)");
    set_key(a, key, value, where);
  }
  check(a);
  return a;
}

void apply_override(Arch& a, const std::string& assignment) {
  auto eq = assignment.find('=');
  MP_USER_CHECK(eq != std::string::npos,
                "--set expects NAME=VALUE (an architecture key such as pcu.lanes=32), got '", assignment,
                "'");
  std::string key = trim(assignment.substr(0, eq)), value = trim(assignment.substr(eq + 1));
  set_key(a, key, value, "--set " + assignment + ": ");
  check(a);
}

std::vector<std::string> preset_names() {
  std::vector<std::string> n;
  for (auto& [k, _] : builtin_presets()) n.push_back(k);
  return n;
}

std::string preset_text(const std::string& name) {
  for (auto& [k, v] : builtin_presets())
    if (k == name) return v;
  return "";
}

Arch load_arch(const std::string& name_or_file) {
  if (auto t = preset_text(name_or_file); !t.empty()) return parse_arch(t, "preset " + name_or_file);
  std::ifstream f(name_or_file);
  if (!f) {
    std::string names;
    for (auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    fail_user("--arch '", name_or_file, "' is neither a preset (", names,
              ") nor a readable architecture file");
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_arch(ss.str(), name_or_file);
}

std::vector<std::pair<std::string, std::string>> arch_keys() {
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& [k, d] : chip_keys()) out.push_back({k, d.desc});
  for (auto& [k, d] : memory_keys()) out.push_back({"memory.NAME." + k, d.desc});
  return out;
}

}  // namespace mp::rdu
