// SCALE-Sim v2 compatibility: its config (.cfg) and topology (.csv) files, its double-buffered SRAM/DRAM
// model driven by the per-cycle operand demand of the array, and its three reports (COMPUTE_REPORT.csv,
// BANDWIDTH_REPORT.csv, DETAILED_ACCESS_REPORT.csv) written with the same columns and number formats.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "systolic/systolic.h"

namespace mp::systolic {

struct SimConfig {
  std::string run_name = "scale_run";
  ArrayConfig array;
  std::int64_t ifmap_sram_kb = 64, filter_sram_kb = 64, ofmap_sram_kb = 64;
  std::int64_t ifmap_offset = 0, filter_offset = 10000000, ofmap_offset = 20000000;
  bool user_bandwidth = false;  // InterfaceBandwidth USER (else CALC)
  std::vector<std::int64_t>
      bandwidth;              // words per cycle; SCALE-Sim v2 uses the first value for every operand
  std::string topology_path;  // [network_presets] TopologyCsvLoc, if given
};

// Reads a SCALE-Sim .cfg. Every error is a user_error naming the file, the line or key, and what is
// expected ("scale.cfg: missing key ArrayHeight in [architecture_presets]").
SimConfig read_config(const std::filesystem::path& file);
SimConfig parse_config(std::string_view text, const std::string& file_name);

// One topology row. A GEMM row (name, M, N, K) becomes SCALE-Sim's convolution with an M x K "image",
// a 1 x K filter and N filters, exactly as SCALE-Sim maps it.
struct Layer {
  std::string name;
  std::int64_t ifmap_h = 0, ifmap_w = 0, filter_h = 0, filter_w = 0, channels = 0, num_filters = 0;
  std::int64_t stride_h = 1, stride_w = 1;
  std::int64_t ofmap_h() const { return (ifmap_h - filter_h + stride_h + stride_h - 1) / stride_h; }
  std::int64_t ofmap_w() const { return (ifmap_w - filter_w + stride_w + stride_w - 1) / stride_w; }
  GemmShape gemm() const { return {ofmap_h() * ofmap_w(), filter_h * filter_w * channels, num_filters}; }
};
enum class TopologyKind { Conv, Gemm };
std::vector<Layer> read_topology(const std::filesystem::path& file, TopologyKind kind);
std::vector<Layer> parse_topology(std::string_view text, const std::string& file_name, TopologyKind kind);

// Everything SCALE-Sim reports for one layer. Cycle fields are integers; SCALE-Sim prints some of them
// as floats ("33.0"), which the report writer reproduces.
struct LayerReport {
  std::string name;
  GemmShape gemm;
  // COMPUTE_REPORT
  std::int64_t total_cycles = 0, stall_cycles = 0;
  double overall_util = 0, mapping_eff = 0, compute_util = 0;  // percent
  // BANDWIDTH_REPORT (words per cycle)
  double ifmap_sram_bw = 0, filter_sram_bw = 0, ofmap_sram_bw = 0;
  double ifmap_dram_bw = 0, filter_dram_bw = 0, ofmap_dram_bw = 0;
  // DETAILED_ACCESS_REPORT
  std::int64_t ifmap_sram_start = 0, ifmap_sram_stop = 0, ifmap_sram_reads = 0;
  std::int64_t filter_sram_start = 0, filter_sram_stop = 0, filter_sram_reads = 0;
  std::int64_t ofmap_sram_start = 0, ofmap_sram_stop = 0, ofmap_sram_writes = 0;
  std::int64_t ifmap_dram_start = 0, ifmap_dram_stop = 0, ifmap_dram_reads = 0;
  std::int64_t filter_dram_start = 0, filter_dram_stop = 0, filter_dram_reads = 0;
  std::int64_t ofmap_dram_start = 0, ofmap_dram_stop = 0, ofmap_dram_writes = 0;
};

// Runs one layer through the compute model and the memory model (analytical mode).
LayerReport simulate_layer(const Layer& layer, const SimConfig& cfg);

// Cycle-level mode for a layer: the PE array computes the layer's GEMM on random operands drawn from
// `seed`; product_ok says whether every output matches a reference product (fp32 tolerance) and every MAC
// was done, and `cycles` are the array's compute cycles (to equal analyze_gemm's). The reports themselves
// come from simulate_layer, whose memory model is driven by the same demand stream.
struct CycleCheck {
  std::int64_t cycles = 0;
  double max_abs_err = 0;
  bool product_ok = false;
};
CycleCheck simulate_layer_cycle_level(const Layer& layer, const SimConfig& cfg, std::uint64_t seed,
                                      const std::function<void(double)>& progress = {});  // see simulate_gemm

// What a layer costs before it runs, saturating at INT64_MAX so that no input overflows the estimate.
// `work` counts the engine's inner steps: R + C operand words per demand line (array cycle) of the memory
// model, plus R x C PE updates per cycle in cycle mode. `bytes` is what the models allocate (address tables,
// buffer stamps, cycle-mode operands).
struct LayerCost {
  std::int64_t work = 0, bytes = 0;
};
LayerCost estimate_cost(const Layer& layer, const SimConfig& cfg, bool cycle_mode);
// Default limits of `metapipe systolic` (--max-work, --max-memory): a few minutes of work at most.
inline constexpr std::int64_t kDefaultMaxWork = std::int64_t{20} * 1000 * 1000 * 1000;
inline constexpr std::int64_t kDefaultMaxMemory = std::int64_t{8} << 30;

// The three report files, in SCALE-Sim's layout, under `dir` (which must exist).
void write_reports(const std::filesystem::path& dir, const std::vector<LayerReport>& layers);
std::string compute_report_csv(const std::vector<LayerReport>& layers);
std::string bandwidth_report_csv(const std::vector<LayerReport>& layers);
std::string detailed_access_report_csv(const std::vector<LayerReport>& layers);

// Python's repr() of a float (shortest round-trip digits, "100.0", "1e-05"), which SCALE-Sim's reports use.
std::string py_float(double v);

// An SVG chart: per-layer utilization and cycles for each dataflow run on the topology.
struct PlotSeries {
  Dataflow dataflow;
  std::vector<LayerReport> layers;
};
std::string plot_svg(const std::string& title, const std::vector<PlotSeries>& series);

}  // namespace mp::systolic
