// Readers for SCALE-Sim v2's .cfg (an INI file read with Python's configparser) and topology CSVs, with
// errors that say which file, line or key is wrong and what is expected.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "core/checked.h"
#include "core/error.h"
#include "systolic/scalesim.h"

namespace mp::systolic {
namespace {

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}
std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::optional<std::int64_t> to_int(const std::string& s) {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

std::string read_file(const std::filesystem::path& file, const char* what) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail_user(file.string(), ": cannot open the ", what, " file (does it exist and is it readable?)");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Entry {
  std::string value;
  int line = 0;
  std::string key;  // as written
};
using Section = std::map<std::string, Entry>;  // lower-case key -> entry

}  // namespace

SimConfig parse_config(std::string_view text, const std::string& file) {
  std::map<std::string, Section> sections;
  std::string current;
  std::istringstream in{std::string(text)};
  std::string raw;
  std::map<std::string, int> section_line;
  int lineno = 0;
  while (std::getline(in, raw)) {
    ++lineno;
    std::string l = trim(raw);
    if (l.empty() || l[0] == '#' || l[0] == ';') continue;
    if (l[0] == '[') {
      MP_USER_CHECK(l.back() == ']', file, ":", lineno, ": malformed section header '", l,
                    "' (expected [name])");
      current = trim(std::string_view(l).substr(1, l.size() - 2));
      // configparser (strict, its default) rejects a section or key given twice; so do we, naming both
      // lines, rather than silently keeping one of the values.
      auto first = section_line.find(current);
      MP_USER_CHECK(first == section_line.end(), file, ":", lineno, ": section [", current,
                    "] is given twice (first on line ", first == section_line.end() ? 0 : first->second,
                    "); merge the two");
      section_line[current] = lineno;
      sections[current];
      continue;
    }
    const size_t eq = l.find_first_of(":=");
    MP_USER_CHECK(eq != std::string::npos, file, ":", lineno,
                  ": expected 'key : value' or 'key = value', got '", l, "'");
    MP_USER_CHECK(!current.empty(), file, ":", lineno, ": key '", trim(l.substr(0, eq)),
                  "' appears before any [section] header");
    std::string key = trim(l.substr(0, eq));
    auto& sec = sections[current];
    if (auto old = sec.find(lower(key)); old != sec.end())
      fail_user(file, ":", lineno, ": key ", key, " in [", current, "] is given twice (first on line ",
                old->second.line, "); keep one");
    sec[lower(key)] = Entry{trim(l.substr(eq + 1)), lineno, key};
  }

  auto need = [&](const char* sec, const char* key) -> const Entry& {
    auto s = sections.find(sec);
    MP_USER_CHECK(s != sections.end(), file, ": missing section [", sec, "] (needed for key ", key, ")");
    auto e = s->second.find(lower(key));
    MP_USER_CHECK(e != s->second.end(), file, ": missing key ", key, " in [", sec, "]");
    return e->second;
  };
  // Every integer key has a range (docs/systolic.md); a value outside it is rejected with its line.
  auto integer = [&](const char* sec, const char* key, std::int64_t lo, std::int64_t hi) {
    const Entry& e = need(sec, key);
    auto v = to_int(e.value);
    MP_USER_CHECK(v.has_value(), file, ":", e.line, ": ", key, " must be an integer, got '", e.value, "'");
    MP_USER_CHECK(*v >= lo && *v <= hi, file, ":", e.line, ": ", key, " must be in [", lo, ", ", hi,
                  "], got ", *v);
    return *v;
  };
  constexpr std::int64_t kMaxArray = 65536, kMaxSramKb = std::int64_t{1} << 30,
                         kMaxOffset = std::int64_t{1} << 48, kMaxBandwidth = std::int64_t{1} << 20;

  SimConfig c;
  c.run_name = need("general", "run_name").value;
  {
    const Entry& e = need("general", "run_name");
    MP_USER_CHECK(!c.run_name.empty() && c.run_name.find_first_of("/\\") == std::string::npos &&
                      c.run_name != "." && c.run_name != "..",
                  file, ":", e.line, ": run_name must be a plain directory name, got '", c.run_name, "'");
  }
  {
    const Entry& e = need("run_presets", "InterfaceBandwidth");
    if (e.value == "USER")
      c.user_bandwidth = true;
    else if (e.value == "CALC")
      c.user_bandwidth = false;
    else
      fail_user(file, ":", e.line, ": InterfaceBandwidth must be CALC or USER, got '", e.value, "'");
  }
  const char* arch = "architecture_presets";
  c.array.rows = static_cast<int>(integer(arch, "ArrayHeight", 1, kMaxArray));
  c.array.cols = static_cast<int>(integer(arch, "ArrayWidth", 1, kMaxArray));
  c.ifmap_sram_kb = integer(arch, "IfmapSramSzkB", 1, kMaxSramKb);
  c.filter_sram_kb = integer(arch, "FilterSramSzkB", 1, kMaxSramKb);
  c.ofmap_sram_kb = integer(arch, "OfmapSramSzkB", 1, kMaxSramKb);
  c.ifmap_offset = integer(arch, "IfmapOffset", 0, kMaxOffset);
  c.filter_offset = integer(arch, "FilterOffset", 0, kMaxOffset);
  c.ofmap_offset = integer(arch, "OfmapOffset", 0, kMaxOffset);
  {
    const Entry& e = need(arch, "Dataflow");
    auto df = parse_dataflow(e.value);
    MP_USER_CHECK(df.has_value(), file, ":", e.line, ": Dataflow must be ws, os or is, got '", e.value, "'");
    c.array.dataflow = *df;
  }
  if (c.user_bandwidth) {
    const Entry& e = need(arch, "Bandwidth");
    std::stringstream ss(e.value);
    std::string item;
    while (std::getline(ss, item, ',')) {
      auto v = to_int(trim(item));
      MP_USER_CHECK(v.has_value() && *v > 0 && *v <= kMaxBandwidth, file, ":", e.line,
                    ": Bandwidth must be a comma-separated list of integers in [1, ", kMaxBandwidth,
                    "] (words per cycle), got '", e.value, "'");
      c.bandwidth.push_back(*v);
    }
    MP_USER_CHECK(!c.bandwidth.empty(), file, ":", e.line,
                  ": Bandwidth is empty; InterfaceBandwidth USER needs it");
  }
  // TopologyCsvLoc belongs to [network_presets]; SCALE-Sim v2 actually looks it up in [architecture_presets]
  // (once [network_presets] exists), so accept it in either.
  for (const char* sec : {"network_presets", "architecture_presets"}) {
    auto s = sections.find(sec);
    if (s == sections.end() || !c.topology_path.empty()) continue;
    if (auto e = s->second.find("topologycsvloc"); e != s->second.end()) {
      std::string v = e->second.value;
      if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
      c.topology_path = v;
    }
  }
  return c;
}

SimConfig read_config(const std::filesystem::path& file) {
  return parse_config(read_file(file, "config"), file.string());
}

std::vector<Layer> parse_topology(std::string_view text, const std::string& file, TopologyKind kind) {
  std::vector<Layer> layers;
  std::istringstream in{std::string(text)};
  std::string raw;
  int lineno = 0;
  bool header = true;
  // Every column is at most 2^24; the products the models index with (image and filter sizes, M x K x N)
  // are checked here, before anything is allocated, so no later arithmetic can overflow.
  constexpr std::int64_t kMaxColumn = std::int64_t{1} << 24, kMaxProduct = std::int64_t{1} << 56,
                         kMaxLayers = std::int64_t{1} << 16;
  auto product = [&](int line, const std::string& name, const char* what,
                     std::initializer_list<std::int64_t> factors) {
    std::int64_t r = 1;
    for (std::int64_t f : factors) {
      auto next = checked_mul(r, f);
      if (!next || *next > kMaxProduct)
        fail_user(file, ":", line, ": layer '", name, "' is too large: ", what,
                  " exceeds 2^56 (make the layer smaller or split it)");
      r = *next;
    }
    return r;
  };
  auto add_layer = [&](int line, const Layer& L) {
    // K first: gemm() multiplies filter height x width x channels, which must not overflow.
    product(line, L.name, "filter height x width x channels (K)", {L.filter_h, L.filter_w, L.channels});
    product(line, L.name, "IFMAP height x width x channels", {L.ifmap_h, L.ifmap_w, L.channels});
    const GemmShape g = L.gemm();
    product(line, L.name, "M x K (IFMAP operand)", {g.M, g.K});
    product(line, L.name, "K x N (filter operand)", {g.K, g.N});
    product(line, L.name, "M x N (OFMAP operand)", {g.M, g.N});
    product(line, L.name, "M x K x N (multiply-accumulates)", {g.M, g.K, g.N});
    MP_USER_CHECK(std::int64_t(layers.size()) < kMaxLayers, file, ":", line, ": more than ", kMaxLayers,
                  " layers (a depthwise DP layer counts one layer per channel)");
    layers.push_back(L);
  };
  while (std::getline(in, raw)) {
    ++lineno;
    std::string l = trim(raw);
    if (header) {  // SCALE-Sim skips the first line whatever it holds
      header = false;
      continue;
    }
    if (l.empty()) continue;
    std::vector<std::string> f;
    std::stringstream ss(l);
    std::string item;
    while (std::getline(ss, item, ',')) f.push_back(trim(item));
    if (!l.empty() && l.back() == ',') {
      // SCALE-Sim's rows end with a comma; getline already dropped the empty last field.
    }
    while (!f.empty() && f.back().empty()) f.pop_back();
    auto field = [&](size_t i, const char* what) {
      MP_USER_CHECK(i < f.size(), file, ":", lineno, ": missing column ", i + 1, " (", what, ")");
      auto v = to_int(f[i]);
      MP_USER_CHECK(v.has_value(), file, ":", lineno, ": column ", i + 1, " (", what,
                    ") must be an integer, got '", f[i], "'");
      MP_USER_CHECK(*v > 0, file, ":", lineno, ": column ", i + 1, " (", what,
                    ") must be a positive integer, got ", *v);
      MP_USER_CHECK(*v <= kMaxColumn, file, ":", lineno, ": column ", i + 1, " (", what,
                    ") must be at most 2^24 = ", kMaxColumn, ", got ", *v);
      return *v;
    };
    MP_USER_CHECK(!f.empty() && !f[0].empty(), file, ":", lineno, ": column 1 (layer name) is empty");
    Layer L;
    L.name = f[0];
    if (kind == TopologyKind::Gemm) {
      const auto m = field(1, "M"), n = field(2, "N"), k = field(3, "K");
      L.ifmap_h = m, L.ifmap_w = k, L.filter_h = 1, L.filter_w = k, L.channels = 1, L.num_filters = n;
      L.stride_h = L.stride_w = 1;
      add_layer(lineno, L);
      continue;
    }
    L.ifmap_h = field(1, "IFMAP height");
    L.ifmap_w = field(2, "IFMAP width");
    L.filter_h = field(3, "filter height");
    L.filter_w = field(4, "filter width");
    L.channels = field(5, "channels");
    L.num_filters = field(6, "number of filters");
    L.stride_h = field(7, "stride");
    L.stride_w = f.size() > 8 ? field(8, "stride width") : L.stride_h;
    MP_USER_CHECK(L.filter_h <= L.ifmap_h, file, ":", lineno, ": filter height ", L.filter_h,
                  " is larger than the IFMAP height ", L.ifmap_h);
    MP_USER_CHECK(L.filter_w <= L.ifmap_w, file, ":", lineno, ": filter width ", L.filter_w,
                  " is larger than the IFMAP width ", L.ifmap_w);
    if (L.name.find("DP") != std::string::npos) {  // SCALE-Sim runs a depthwise layer channel by channel
      const auto ch = L.channels;
      MP_USER_CHECK(std::int64_t(layers.size()) + ch <= kMaxLayers, file, ":", lineno, ": depthwise layer '",
                    L.name, "' has ", ch,
                    " channels and would expand to one layer per channel; a topology "
                    "holds at most ",
                    kMaxLayers, " layers");
      for (std::int64_t c = 0; c < ch; ++c) {
        Layer d = L;
        d.name = L.name + "Channel_" + std::to_string(c);
        d.channels = 1;
        add_layer(lineno, d);
      }
    } else {
      add_layer(lineno, L);
    }
  }
  MP_USER_CHECK(!layers.empty(), file, ": no layers (expected a header line and then one layer per line)");
  return layers;
}

std::vector<Layer> read_topology(const std::filesystem::path& file, TopologyKind kind) {
  return parse_topology(read_file(file, "topology"), file.string(), kind);
}

}  // namespace mp::systolic
