// Text, JSON and SVG reports.
#include "backends/rdu/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/table.h"
#include "core/text.h"

namespace mp::rdu {
namespace {

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
std::string esc(const std::string& s) { return json_escape(s); }
std::string xml(const std::string& s) { return xml_escape(s); }
std::string count(double v) { return thousands(std::llround(v)); }

}  // namespace

void print_text(std::ostream& os, const Arch& a, const RunResult& r) {
  os << r.program << " on " << a.name << ": " << count(r.cycles)
     << " cycles = " << fmt("%.4g", r.seconds * 1e3) << " ms at " << a.clock_ghz << " GHz, " << r.kernel_calls
     << " kernel call" << (r.kernel_calls > 1 ? "s" : "") << "\n";
  for (auto& w : r.split_reasons) os << "  " << w << "\n";
  os << "  roofs: compute " << count(r.compute_roof_cycles) << " cycles, off-chip bandwidth "
     << count(r.memory_roof_cycles) << " cycles (simulated / max roof = "
     << fmt("%.2f", r.cycles / std::max({1.0, r.compute_roof_cycles, r.memory_roof_cycles})) << ")\n";
  os << "  units: " << r.pcus_used << "/" << a.pcus() << " PCUs, " << r.pmus_used << "/" << a.pmus()
     << " PMUs, " << r.agcus_used << "/" << a.agcus << " AGCUs; utilization PCU "
     << fmt("%.1f", 100 * r.pcu_util) << " %, PMU " << fmt("%.1f", 100 * r.pmu_util) << " %, AGCU "
     << fmt("%.1f", 100 * r.agcu_util) << " %\n";
  os << "  off-chip (" << a.memory().name << ", " << a.memory().peak_gbs() << " GB/s peak): read "
     << count(double(r.bytes_read)) << " B (" << fmt("%.1f", r.load_bw_pct) << " % of peak), written "
     << count(double(r.bytes_written)) << " B (" << fmt("%.1f", r.store_bw_pct) << " %); "
     << count(double(r.row_misses)) << " row misses, " << r.refreshes << " refreshes, "
     << count(double(r.turnarounds)) << " read/write turnarounds\n";
  if (!r.placements.empty())
    os << "  place & route: " << r.total_hops << " hops in all, longest route " << r.max_hops
       << " hops, most congested link " << (r.worst_link.empty() ? "-" : r.worst_link) << " at "
       << fmt("%.0f", 100 * r.worst_link_load) << " % of its width\n";
  for (auto& n : r.notes) os << "  note: " << n << "\n";
  os << "\n";
  Table t({"call", "stage", "kind", "unit", "PCUs", "iterations", "ii", "busy", "stall in", "stall out",
           "busy %"});
  for (auto& s : r.stages)
    t.add({std::to_string(s.config + 1), s.name, s.kind, s.mode, std::to_string(s.pcus),
           count(double(s.iterations)), count(double(s.ii)), count(s.busy), count(s.stall_input),
           count(s.stall_output), fmt("%.1f", 100 * s.busy / std::max(1.0, r.cycles))});
  t.print(os);
}

void print_json(std::ostream& os, const Arch& a, const RunResult& r) {
  os << "{\n";
  os << "  \"program\": \"" << esc(r.program) << "\",\n  \"arch\": \"" << esc(a.name) << "\",\n";
  os << "  \"cycles\": " << int64_t(std::llround(r.cycles)) << ",\n  \"seconds\": " << fmt("%.9g", r.seconds)
     << ",\n";
  os << "  \"clock_ghz\": " << a.clock_ghz << ",\n  \"kernel_calls\": " << r.kernel_calls
     << ",\n  \"split_reasons\": [";
  for (size_t i = 0; i < r.split_reasons.size(); ++i)
    os << (i ? ", " : "") << "\"" << esc(r.split_reasons[i]) << "\"";
  os << "],\n";
  os << "  \"utilization\": {\"pcu\": " << fmt("%.4f", r.pcu_util) << ", \"pmu\": " << fmt("%.4f", r.pmu_util)
     << ", \"agcu\": " << fmt("%.4f", r.agcu_util) << "},\n";
  os << "  \"units_used\": {\"pcu\": " << r.pcus_used << ", \"pmu\": " << r.pmus_used
     << ", \"agcu\": " << r.agcus_used << ", \"pcu_total\": " << a.pcus() << ", \"pmu_total\": " << a.pmus()
     << ", \"agcu_total\": " << a.agcus << "},\n";
  os << "  \"offchip\": {\"memory\": \"" << esc(a.memory().name)
     << "\", \"peak_gbs\": " << a.memory().peak_gbs() << ", \"bytes_read\": " << r.bytes_read
     << ", \"bytes_written\": " << r.bytes_written << ", \"load_bw_pct\": " << fmt("%.2f", r.load_bw_pct)
     << ", \"store_bw_pct\": " << fmt("%.2f", r.store_bw_pct) << ", \"bursts\": " << r.bursts
     << ", \"row_misses\": " << r.row_misses << ", \"refreshes\": " << r.refreshes
     << ", \"turnarounds\": " << r.turnarounds << "},\n";
  os << "  \"roofs\": {\"flops\": " << fmt("%.6g", r.flops)
     << ", \"compute_cycles\": " << fmt("%.1f", r.compute_roof_cycles)
     << ", \"bandwidth_cycles\": " << fmt("%.1f", r.memory_roof_cycles) << "},\n";
  os << "  \"place_route\": {\"total_hops\": " << r.total_hops << ", \"max_hops\": " << r.max_hops
     << ", \"worst_link\": \"" << esc(r.worst_link)
     << "\", \"worst_link_load\": " << fmt("%.4f", r.worst_link_load) << "},\n";
  os << "  \"notes\": [";
  for (size_t i = 0; i < r.notes.size(); ++i) os << (i ? ", " : "") << "\"" << esc(r.notes[i]) << "\"";
  os << "],\n  \"stages\": [\n";
  for (size_t i = 0; i < r.stages.size(); ++i) {
    auto& s = r.stages[i];
    os << "    {\"name\": \"" << esc(s.name) << "\", \"kind\": \"" << s.kind << "\", \"unit\": \"" << s.mode
       << "\", \"call\": " << s.config + 1 << ", \"pcus\": " << s.pcus << ", \"iterations\": " << s.iterations
       << ", \"ii\": " << s.ii << ", \"busy_cycles\": " << fmt("%.0f", s.busy)
       << ", \"stall_input_cycles\": " << fmt("%.0f", s.stall_input)
       << ", \"stall_output_cycles\": " << fmt("%.0f", s.stall_output)
       << ", \"stall_cycles\": " << fmt("%.0f", s.stall_input + s.stall_output) << "}"
       << (i + 1 < r.stages.size() ? "," : "") << "\n";
  }
  os << "  ],\n  \"events\": " << r.events << "\n}\n";
}

std::string render_svg(const Arch& a, const RunResult& r, int config) {
  std::ostringstream o;
  const int cell = a.cols > 24 ? 18 : 46, pad = 20, left = pad + cell + 10, top = 60;
  const int W = left + a.cols * cell + cell + 10 + pad + 240, H = top + a.rows * cell + pad + 60;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"" << pad << "\" y=\"24\" font-size=\"16\">" << xml(r.program) << " on " << xml(a.name)
    << ": " << count(r.cycles) << " cycles, kernel call " << config + 1 << " of " << r.kernel_calls
    << "</text>\n";
  o << "<text x=\"" << pad
    << "\" y=\"44\" font-size=\"12\">PCUs blue, PMUs green, AGCUs orange; darker = busier. Routes: red = "
       "congested. "
    << r.total_hops << " hops, longest " << r.max_hops << ", worst link " << xml(r.worst_link) << " at "
    << fmt("%.0f", 100 * r.worst_link_load) << " %</text>\n";
  if (config >= int(r.placements.size())) {
    o << "</svg>\n";
    return o.str();
  }
  const Placement& P = r.placements[config];
  const Config& cf = r.mapping.configs[config];
  const ConfigResult& cr = r.configs[config];
  auto cx = [&](int x) { return left + x * cell + cell / 2; };
  auto cy = [&](int y) { return top + y * cell + cell / 2; };
  // per-unit utilization: the busy fraction of the owning stage (PCU, AGCU); PMUs: the max of their buffer's
  // producer and consumers.
  std::vector<double> stage_util(cf.graph.stages.size(), 0);
  for (size_t s = 0; s < stage_util.size(); ++s)
    stage_util[s] = std::min(1.0, cr.stages[s].busy / std::max(1.0, cr.cycles));
  std::vector<std::vector<const PlacedUnit*>> at(size_t(a.rows) * a.cols);
  for (auto& u : P.units)
    if (u.x >= 0 && u.x < a.cols) at[size_t(u.y) * a.cols + u.x].push_back(&u);
  auto shade = [](double base_r, double base_g, double base_b, double util) {
    double t = 0.15 + 0.85 * std::clamp(util, 0.0, 1.0);
    char b[32];
    std::snprintf(b, sizeof b, "#%02x%02x%02x", int(255 - (255 - base_r) * t), int(255 - (255 - base_g) * t),
                  int(255 - (255 - base_b) * t));
    return std::string(b);
  };
  auto unit_util = [&](const PlacedUnit& u) {
    if (u.kind != UnitKind::PMU) return stage_util[u.owner];
    double m = 0;
    int p = cf.graph.producer_of(u.owner);
    if (p >= 0) m = stage_util[p];
    for (int c : cf.graph.consumers_of(u.owner)) m = std::max(m, stage_util[c]);
    return m;
  };
  for (int y = 0; y < a.rows; ++y)
    for (int x = 0; x < a.cols; ++x) {
      bool pcu = a.is_pcu(y, x);
      auto& us = at[size_t(y) * a.cols + x];
      std::string fill = "#f4f4f4";
      std::string title =
          std::string(pcu ? "PCU" : "PMU") + " (" + std::to_string(x) + "," + std::to_string(y) + ") idle";
      if (!us.empty()) {
        double u = unit_util(*us[0]);
        fill = pcu ? shade(40, 90, 200, u) : shade(40, 160, 70, u);
        title = std::string(pcu ? "PCU " : "PMU ") + us[0]->label + ": " + fmt("%.0f", 100 * u) + " % busy";
      }
      o << "<rect x=\"" << left + x * cell + 1 << "\" y=\"" << top + y * cell + 1 << "\" width=\"" << cell - 2
        << "\" height=\"" << cell - 2 << "\" fill=\"" << fill << "\" stroke=\"" << (pcu ? "#9ab" : "#9b9")
        << "\"><title>" << xml(title) << "</title></rect>\n";
      if (!us.empty() && cell >= 40)
        o << "<text x=\"" << cx(x) << "\" y=\"" << cy(y) + 4 << "\" font-size=\"8\" text-anchor=\"middle\">"
          << xml(us[0]->label.substr(0, 9)) << "</text>\n";
    }
  for (auto& u : P.units) {
    if (u.kind != UnitKind::AGCU) continue;
    int x = u.x < 0 ? pad : left + a.cols * cell + 10;
    o << "<rect x=\"" << x << "\" y=\"" << top + u.y * cell + 2 << "\" width=\"" << cell - 4 << "\" height=\""
      << cell - 4 << "\" fill=\"" << shade(230, 130, 20, unit_util(u)) << "\" stroke=\"#c80\"><title>AGCU "
      << xml(u.label) << ": " << fmt("%.0f", 100 * unit_util(u)) << " % busy</title></rect>\n";
    if (cell >= 40)
      o << "<text x=\"" << x + (cell - 4) / 2 << "\" y=\"" << top + u.y * cell + cell / 2 + 3
        << "\" font-size=\"7\" text-anchor=\"middle\">" << xml(u.label.substr(0, 9)) << "</text>\n";
  }
  for (auto& n : P.nets) {
    if (n.path.size() < 2) continue;
    double worst = 0;
    for (size_t k = 1; k < n.path.size(); ++k) {
      auto [x0, y0] = n.path[k - 1];
      auto [x1, y1] = n.path[k];
      if (x0 < 0 || x1 < 0 || x0 >= a.cols || x1 >= a.cols) continue;
      int l = y0 == y1 ? (y0 * a.cols + std::min(x0, x1)) * 2 : (std::min(y0, y1) * a.cols + x0) * 2 + 1;
      worst = std::max(worst, P.link_load[size_t(l)]);
    }
    o << "<polyline fill=\"none\" stroke=\""
      << (worst > 1     ? "#d00"
          : worst > 0.5 ? "#e80"
                        : "#333")
      << "\" stroke-opacity=\"0.6\" stroke-width=\""
      << fmt("%.1f", 1 + std::min(3.0, 3 * n.demand / a.link_bytes)) << "\" points=\"";
    for (auto [x, y] : n.path) {
      int px = x < 0         ? pad + (cell - 4) / 2
               : x >= a.cols ? left + a.cols * cell + 10 + (cell - 4) / 2
                             : cx(x);
      o << px << "," << cy(y) << " ";
    }
    o << "\"/>\n";
  }
  // legend: stages and their busy share
  int ly = top;
  const int lx = left + a.cols * cell + cell + 20;
  o << "<text x=\"" << lx << "\" y=\"" << ly
    << "\" font-size=\"12\" font-weight=\"bold\">stage: busy %</text>\n";
  for (size_t s = 0; s < cf.graph.stages.size() && ly < H - 20; ++s) {
    ly += 14;
    o << "<text x=\"" << lx << "\" y=\"" << ly << "\" font-size=\"11\">" << xml(cf.graph.stages[s].name)
      << " (" << cf.stages[s].mode << "): " << fmt("%.0f", 100 * stage_util[s]) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace mp::rdu
