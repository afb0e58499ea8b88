// SCALE-Sim v2's three CSV reports, byte for byte: the same headers, ", " separators, trailing commas, and
// numbers printed the way Python prints them (ints as ints, floats with repr()).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "systolic/scalesim.h"

namespace mp::systolic {

std::string py_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: fixed when -4 <= exponent < 16, else 1.5e+16.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') sign = "-", sci = sci.substr(1);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  const int exp10 = std::stoi(sci.substr(e + 1));
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int n = static_cast<int>(digits.size());
  const int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  std::string out;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0)
      out = "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    else if (decpt >= n)
      out = digits + std::string(static_cast<size_t>(decpt - n), '0') + ".0";
    else
      out = digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
  } else {
    out = digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    out += eb;
  }
  return sign + out;
}

namespace {
std::string cyc(std::int64_t v) {
  return py_float(static_cast<double>(v));
}  // SCALE-Sim prints these as floats
}  // namespace

std::string compute_report_csv(const std::vector<LayerReport>& layers) {
  std::ostringstream o;
  o << "LayerID, Total Cycles, Stall Cycles, Overall Util %, Mapping Efficiency %, Compute Util %,\n";
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& r = layers[i];
    o << i << ", " << r.total_cycles << ", " << r.stall_cycles << ", " << py_float(r.overall_util) << ", "
      << py_float(r.mapping_eff) << ", " << py_float(r.compute_util) << ",\n";
  }
  return o.str();
}

std::string bandwidth_report_csv(const std::vector<LayerReport>& layers) {
  std::ostringstream o;
  o << "LayerID, Avg IFMAP SRAM BW, Avg FILTER SRAM BW, Avg OFMAP SRAM BW, "
       "Avg IFMAP DRAM BW, Avg FILTER DRAM BW, Avg OFMAP DRAM BW,\n";
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& r = layers[i];
    o << i << ", " << py_float(r.ifmap_sram_bw) << ", " << py_float(r.filter_sram_bw) << ", "
      << py_float(r.ofmap_sram_bw) << ", " << py_float(r.ifmap_dram_bw) << ", " << py_float(r.filter_dram_bw)
      << ", " << py_float(r.ofmap_dram_bw) << ",\n";
  }
  return o.str();
}

std::string detailed_access_report_csv(const std::vector<LayerReport>& layers) {
  std::ostringstream o;
  o << "LayerID, "
       "SRAM IFMAP Start Cycle, SRAM IFMAP Stop Cycle, SRAM IFMAP Reads, "
       "SRAM Filter Start Cycle, SRAM Filter Stop Cycle, SRAM Filter Reads, "
       "SRAM OFMAP Start Cycle, SRAM OFMAP Stop Cycle, SRAM OFMAP Writes, "
       "DRAM IFMAP Start Cycle, DRAM IFMAP Stop Cycle, DRAM IFMAP Reads, "
       "DRAM Filter Start Cycle, DRAM Filter Stop Cycle, DRAM Filter Reads, "
       "DRAM OFMAP Start Cycle, DRAM OFMAP Stop Cycle, DRAM OFMAP Writes,\n";
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& r = layers[i];
    o << i << ", " << cyc(r.ifmap_sram_start) << ", " << cyc(r.ifmap_sram_stop) << ", " << r.ifmap_sram_reads
      << ", " << cyc(r.filter_sram_start) << ", " << cyc(r.filter_sram_stop) << ", " << r.filter_sram_reads
      << ", " << cyc(r.ofmap_sram_start) << ", " << cyc(r.ofmap_sram_stop) << ", " << r.ofmap_sram_writes
      << ", " << cyc(r.ifmap_dram_start) << ", " << cyc(r.ifmap_dram_stop) << ", " << r.ifmap_dram_reads
      << ", " << cyc(r.filter_dram_start) << ", " << cyc(r.filter_dram_stop) << ", " << r.filter_dram_reads
      << ", " << cyc(r.ofmap_dram_start) << ", " << cyc(r.ofmap_dram_stop) << ", " << r.ofmap_dram_writes
      << ",\n";
  }
  return o.str();
}

void write_reports(const std::filesystem::path& dir, const std::vector<LayerReport>& layers) {
  auto put = [&](const char* name, const std::string& text) {
    std::ofstream f(dir / name, std::ios::binary);
    if (!f) fail_user((dir / name).string(), ": cannot write the report");
    f << text;
  };
  put("COMPUTE_REPORT.csv", compute_report_csv(layers));
  put("BANDWIDTH_REPORT.csv", bandwidth_report_csv(layers));
  put("DETAILED_ACCESS_REPORT.csv", detailed_access_report_csv(layers));
}

}  // namespace mp::systolic
