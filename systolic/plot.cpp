// A self-contained SVG chart of a topology run under each dataflow: per-layer overall utilization (top)
// and total cycles (bottom, log scale), one colour per dataflow.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/text.h"
#include "systolic/scalesim.h"

namespace mp::systolic {
namespace {

std::string esc(const std::string& s) { return xml_escape(s); }
std::string num(double v, int prec = 1) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}
std::string count(std::int64_t v) {
  std::string s = std::to_string(v), o;
  int n = 0;
  for (auto it = s.rbegin(); it != s.rend(); ++it) {
    if (n && n % 3 == 0 && *it != '-') o += ',';
    o += *it;
    ++n;
  }
  return {o.rbegin(), o.rend()};
}

}  // namespace

std::string plot_svg(const std::string& title, const std::vector<PlotSeries>& series) {
  const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"};
  size_t layers = 0;
  for (const auto& s : series) layers = std::max(layers, s.layers.size());
  const int bar = 18, gap = 26, left = 80, right = 30;
  const int group = static_cast<int>(series.size()) * bar + gap;
  // Wide enough for the bars and for the title (about 8.5 px per character at font-size 16).
  const int width = std::max({560, left + right + static_cast<int>(layers) * group,
                              40 + static_cast<int>(title.size() * 17 / 2)});
  const int panel_h = 220, top1 = 70, top2 = top1 + panel_h + 80, height = top2 + panel_h + 70;
  std::int64_t max_cycles = 1;
  for (const auto& s : series)
    for (const auto& l : s.layers) max_cycles = std::max(max_cycles, l.total_cycles);
  const double log_max = std::ceil(std::log10(static_cast<double>(max_cycles)));

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"" << width / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">" << esc(title)
    << "</text>\n";
  // Legend.
  for (size_t i = 0; i < series.size(); ++i) {
    const int x = left + static_cast<int>(i) * 140;
    o << "<rect x=\"" << x << "\" y=\"36\" width=\"14\" height=\"14\" fill=\"" << colors[i % 4] << "\"/>";
    const auto df = series[i].dataflow;
    const char* full = df == Dataflow::WS   ? "weight stationary"
                       : df == Dataflow::OS ? "output stationary"
                                            : "input stationary";
    o << "<text x=\"" << x + 20 << "\" y=\"48\">" << full << "</text>\n";
  }
  auto panel = [&](int top, const std::string& label, auto value_to_h, auto value_label, auto value_of,
                   auto short_label, const std::vector<std::pair<double, std::string>>& ticks) {
    o << "<text x=\"" << left - 60 << "\" y=\"" << top - 10 << "\" font-size=\"13\">" << esc(label)
      << "</text>\n";
    o << "<line x1=\"" << left << "\" y1=\"" << top + panel_h << "\" x2=\"" << width - right << "\" y2=\""
      << top + panel_h << "\" stroke=\"black\"/>\n";
    o << "<line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\"" << top + panel_h
      << "\" stroke=\"black\"/>\n";
    for (const auto& [v, text] : ticks) {
      const double y = top + panel_h - value_to_h(v);
      o << "<line x1=\"" << left - 4 << "\" y1=\"" << num(y) << "\" x2=\"" << width - right << "\" y2=\""
        << num(y) << "\" stroke=\"#ddd\"/><text x=\"" << left - 6 << "\" y=\"" << num(y + 4)
        << "\" text-anchor=\"end\">" << text << "</text>\n";
    }
    for (size_t l = 0; l < layers; ++l) {
      const int gx = left + gap / 2 + static_cast<int>(l) * group;
      for (size_t i = 0; i < series.size(); ++i) {
        if (l >= series[i].layers.size()) continue;
        const auto& r = series[i].layers[l];
        const double h = std::max(0.0, value_to_h(value_of(r)));
        const int x = gx + static_cast<int>(i) * bar;
        o << "<rect x=\"" << x << "\" y=\"" << num(top + panel_h - h) << "\" width=\"" << bar - 2
          << "\" height=\"" << num(h) << "\" fill=\"" << colors[i % 4] << "\"><title>" << esc(r.name) << " "
          << dataflow_name(series[i].dataflow) << ": " << value_label(r) << "</title></rect>\n";
        if (layers <= 8)  // small topologies: print the value on the bar too
          o << "<text x=\"" << x + (bar - 2) / 2 << "\" y=\"" << num(top + panel_h - h - 3)
            << "\" text-anchor=\"middle\" font-size=\"8\">" << short_label(value_of(r)) << "</text>\n";
      }
      const std::string& name = series.front().layers.size() > l ? series.front().layers[l].name : "";
      o << "<text x=\"" << gx + static_cast<int>(series.size()) * bar / 2 << "\" y=\"" << top + panel_h + 16
        << "\" text-anchor=\"middle\">" << esc(name) << "</text>\n";
    }
  };
  std::vector<std::pair<double, std::string>> util_ticks;
  for (int v = 0; v <= 100; v += 25) util_ticks.push_back({v, std::to_string(v) + "%"});
  panel(
      top1, "overall utilization (%)", [&](double v) { return v / 100.0 * panel_h; },
      [](const LayerReport& r) { return num(r.overall_util, 2) + " %"; },
      [](const LayerReport& r) { return r.overall_util; }, [](double v) { return num(v, 0); }, util_ticks);
  std::vector<std::pair<double, std::string>> cyc_ticks;
  for (int e = 0; e <= static_cast<int>(log_max); ++e)
    cyc_ticks.push_back({std::pow(10.0, e), "1e" + std::to_string(e)});
  panel(
      top2, "total cycles (log scale)",
      [&](double v) { return v <= 1 ? 0.0 : std::log10(v) / std::max(1.0, log_max) * panel_h; },
      [](const LayerReport& r) { return count(r.total_cycles) + " cycles"; },
      [](const LayerReport& r) { return static_cast<double>(r.total_cycles); },
      [](double v) {
        const char* unit[] = {"", "k", "M", "G", "T"};
        int u = 0;
        while (v >= 1000 && u < 4) v /= 1000, ++u;
        return num(v, v < 10 ? 1 : 0) + unit[u];
      },
      cyc_ticks);
  o << "</svg>\n";
  return o.str();
}

}  // namespace mp::systolic
