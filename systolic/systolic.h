// The systolic-array compute model: an R x C array of PEs running O[M x N] = I[M x K] * W[K x N] under the
// weight-, output- or input-stationary dataflow, as an analytical model (for sweeps) and as a cycle-level
// simulation in which values move PE to PE (for trust). Both follow SCALE-Sim v2's timing conventions, so
// their cycle counts agree with each other and with SCALE-Sim (see docs/systolic.md).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace mp::systolic {

// What stays in the PEs for the whole fold (slide 17):
//   WS: a R x C tile of W (K along rows, N along columns); rows of I stream in from the left.
//   OS: a R x C tile of O (M along rows, N along columns); I streams from the left, W from the top.
//   IS: a R x C tile of I^T (K along rows, M along columns); columns of W stream in from the left.
enum class Dataflow { WS, OS, IS };

std::string_view dataflow_name(Dataflow df);                 // "ws", "os", "is"
std::optional<Dataflow> parse_dataflow(std::string_view s);  // accepts ws/os/is in any case

struct ArrayConfig {
  int rows = 32;  // R, the array height
  int cols = 32;  // C, the array width
  Dataflow dataflow = Dataflow::WS;
};

struct GemmShape {
  std::int64_t M = 0;  // output rows (for a convolution: output pixels)
  std::int64_t K = 0;  // reduction length (filter height x width x channels)
  std::int64_t N = 0;  // output columns (number of filters)
};

// How a GEMM folds onto the array. The dataflow picks which two of M, K, N are laid out spatially
// (Sr along the rows, Sc along the columns) and which one streams in time (T):
//   WS: Sr = K, Sc = N, T = M      OS: Sr = M, Sc = N, T = K      IS: Sr = K, Sc = M, T = N
// The work is cut into ceil(Sr/R) x ceil(Sc/C) folds run one after another; each fold lasts
// cycles_per_fold cycles, fill and drain skew included:
//   WS, IS: R (preload the stationary tile) + T + (R - 1) + (C - 1) = 2R + C + T - 2
//   OS:     T + (R - 1) + (C - 1) = R + C + T - 2 (the skewed operands reach the far corner PE)
struct FoldPlan {
  std::int64_t spatial_rows = 0, spatial_cols = 0, temporal = 0;
  std::int64_t row_folds = 0, col_folds = 0;
  std::int64_t cycles_per_fold = 0;
  std::int64_t folds() const { return row_folds * col_folds; }
};
FoldPlan plan_gemm(const GemmShape& g, const ArrayConfig& a);

// Compute-only result of the analytical model (no memory stalls). `cycles` follows SCALE-Sim: the index of
// the cycle in which the last output is produced, counting the first cycle of the first fold as cycle 0,
// i.e. folds * cycles_per_fold - 1. Fractions are in [0, 1].
struct ComputeResult {
  std::int64_t cycles = 0;
  std::int64_t folds = 0;
  std::int64_t macs = 0;              // M * K * N
  double overall_utilization = 0;     // macs / ((cycles) * R * C)
  double mapping_efficiency = 0;      // mean over folds of (used PEs / R*C)
  double compute_utilization = 0;     // mean over folds of used PEs * T / (R*C * fold cycles), SCALE-Sim's
                                      // definition (for WS/IS it counts a fold R + C - 1 cycles longer)
  std::int64_t ifmap_sram_reads = 0;  // operand words read from the SRAMs / written to it
  std::int64_t filter_sram_reads = 0;
  std::int64_t ofmap_sram_writes = 0;
};
ComputeResult analyze_gemm(const GemmShape& g, const ArrayConfig& a);

// Cycle-level simulation: every PE has its own registers, values move one PE per cycle, and the array
// computes the product. `input` is M x K row-major, `weights` K x N row-major; `output` is M x N
// row-major. `cycles` uses the same convention as ComputeResult::cycles, so for every shape and dataflow
// simulate_gemm(...).cycles == analyze_gemm(...).cycles (tested).
struct CycleResult {
  std::int64_t cycles = 0;
  std::int64_t mac_ops = 0;  // multiply-accumulates the PEs performed on real (not padding) data
  std::vector<float> output;
};
// `progress`, when given, is called after each fold with the fraction of folds done (a progress line).
CycleResult simulate_gemm(const GemmShape& g, const ArrayConfig& a, std::span<const float> input,
                          std::span<const float> weights, const std::function<void(double)>& progress = {});

// Throws mp::user_error naming the bad field when a shape or array size is zero or negative.
void check(const GemmShape& g, const ArrayConfig& a);

}  // namespace mp::systolic
