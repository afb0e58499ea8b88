// The analytical fold/skew model and the cycle-level PE-array simulation of systolic.h.
#include "systolic/systolic.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "core/error.h"

namespace mp::systolic {

std::string_view dataflow_name(Dataflow df) {
  switch (df) {
    case Dataflow::WS:
      return "ws";
    case Dataflow::OS:
      return "os";
    case Dataflow::IS:
      return "is";
  }
  return "?";
}

std::optional<Dataflow> parse_dataflow(std::string_view s) {
  std::string l;
  for (char c : s) l += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (l == "ws") return Dataflow::WS;
  if (l == "os") return Dataflow::OS;
  if (l == "is") return Dataflow::IS;
  return std::nullopt;
}

void check(const GemmShape& g, const ArrayConfig& a) {
  MP_USER_CHECK(a.rows > 0, "array rows (ArrayHeight) must be a positive integer, got ", a.rows);
  MP_USER_CHECK(a.cols > 0, "array columns (ArrayWidth) must be a positive integer, got ", a.cols);
  MP_USER_CHECK(g.M > 0, "GEMM M must be a positive integer, got ", g.M);
  MP_USER_CHECK(g.K > 0, "GEMM K must be a positive integer, got ", g.K);
  MP_USER_CHECK(g.N > 0, "GEMM N must be a positive integer, got ", g.N);
}

static std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

FoldPlan plan_gemm(const GemmShape& g, const ArrayConfig& a) {
  check(g, a);
  FoldPlan p;
  const std::int64_t R = a.rows, C = a.cols;
  switch (a.dataflow) {
    case Dataflow::WS:
      p.spatial_rows = g.K, p.spatial_cols = g.N, p.temporal = g.M;
      break;
    case Dataflow::OS:
      p.spatial_rows = g.M, p.spatial_cols = g.N, p.temporal = g.K;
      break;
    case Dataflow::IS:
      p.spatial_rows = g.K, p.spatial_cols = g.M, p.temporal = g.N;
      break;
  }
  p.row_folds = ceil_div(p.spatial_rows, R);
  p.col_folds = ceil_div(p.spatial_cols, C);
  p.cycles_per_fold = a.dataflow == Dataflow::OS ? R + C + p.temporal - 2 : 2 * R + C + p.temporal - 2;
  return p;
}

ComputeResult analyze_gemm(const GemmShape& g, const ArrayConfig& a) {
  const FoldPlan p = plan_gemm(g, a);
  const std::int64_t R = a.rows, C = a.cols, T = p.temporal;
  ComputeResult r;
  r.folds = p.folds();
  r.cycles = r.folds * p.cycles_per_fold - 1;
  r.macs = g.M * g.K * g.N;
  r.overall_utilization = static_cast<double>(r.macs) / (static_cast<double>(r.cycles) * R * C);
  // SCALE-Sim averages the per-fold ratios in fold order (column folds outer); the same order and the
  // same divisions keep the printed digits identical. Its per-fold compute utilization measures the fold
  // on the skewed demand of the stationary operand, which is R + C - 1 cycles longer for WS/IS than the
  // fold itself (and exactly the fold for OS).
  const std::int64_t util_fold_cycles =
      a.dataflow == Dataflow::OS ? p.cycles_per_fold : 2 * R + 2 * C + T - 3;
  double map_sum = 0, util_sum = 0;
  for (std::int64_t fc = 0; fc < p.col_folds; ++fc) {
    const std::int64_t cols_used = std::min<std::int64_t>(C, p.spatial_cols - fc * C);
    for (std::int64_t fr = 0; fr < p.row_folds; ++fr) {
      const std::int64_t rows_used = std::min<std::int64_t>(R, p.spatial_rows - fr * R);
      const std::int64_t used = rows_used * cols_used;
      map_sum += static_cast<double>(used) / static_cast<double>(R * C);
      util_sum += static_cast<double>(used * T) / static_cast<double>(R * C * util_fold_cycles);
    }
  }
  r.mapping_efficiency = map_sum / static_cast<double>(r.folds);
  r.compute_utilization = util_sum / static_cast<double>(r.folds);
  // Operand words moved between the SRAMs and the array edges.
  const std::int64_t Sr = p.spatial_rows, Sc = p.spatial_cols;
  switch (a.dataflow) {
    case Dataflow::WS:
      r.ifmap_sram_reads = p.col_folds * T * Sr;
      r.filter_sram_reads = Sr * Sc;
      r.ofmap_sram_writes = p.row_folds * T * Sc;
      break;
    case Dataflow::IS:
      r.ifmap_sram_reads = Sr * Sc;
      r.filter_sram_reads = p.col_folds * T * Sr;
      r.ofmap_sram_writes = p.row_folds * T * Sc;
      break;
    case Dataflow::OS:
      r.ifmap_sram_reads = p.col_folds * T * Sr;
      r.filter_sram_reads = p.row_folds * T * Sc;
      // SCALE-Sim v2 also adds R + C per fold here (it counts the drain's shape); kept for compatibility.
      r.ofmap_sram_writes = Sr * Sc + r.folds * (R + C);
      break;
  }
  return r;
}

namespace {

// The PE array as plain arrays of registers (struct of arrays keeps the per-cycle sweep cache friendly).
// Each register is written by its own PE only; the sweep runs from the bottom-right PE to the top-left one
// so that every PE still reads the values its west and north neighbours held in the previous cycle.
struct Registers {
  int R, C;
  std::vector<float> stationary;  // WS: a weight, IS: an input (I^T), OS: unused
  std::vector<float> west;        // the operand moving right
  std::vector<float> north;       // WS/IS: the partial sum moving down; OS: the weight moving down
  std::vector<float> acc;         // OS: the output accumulating in place
  std::vector<std::int32_t> tag;  // time index of the value in `west` (-1: empty slot)
  Registers(int r, int c)
      : R(r), C(c), stationary(size()), west(size()), north(size()), acc(size()), tag(size(), -1) {}
  size_t size() const { return static_cast<size_t>(R) * C; }
  size_t at(int r, int c) const { return static_cast<size_t>(r) * C + c; }
  void clear() {
    std::fill(stationary.begin(), stationary.end(), 0.0f);
    std::fill(west.begin(), west.end(), 0.0f);
    std::fill(north.begin(), north.end(), 0.0f);
    std::fill(acc.begin(), acc.end(), 0.0f);
    std::fill(tag.begin(), tag.end(), -1);
  }
};

}  // namespace

CycleResult simulate_gemm(const GemmShape& g, const ArrayConfig& a, std::span<const float> input,
                          std::span<const float> weights, const std::function<void(double)>& progress) {
  const FoldPlan p = plan_gemm(g, a);
  MP_USER_CHECK(static_cast<std::int64_t>(input.size()) == g.M * g.K, "input must hold M*K = ", g.M * g.K,
                " values, got ", input.size());
  MP_USER_CHECK(static_cast<std::int64_t>(weights.size()) == g.K * g.N, "weights must hold K*N = ", g.K * g.N,
                " values, got ", weights.size());
  const int R = a.rows, C = a.cols;
  const std::int64_t T = p.temporal;
  const Dataflow df = a.dataflow;
  CycleResult res;
  res.output.assign(static_cast<size_t>(g.M * g.N), 0.0f);
  auto I = [&](std::int64_t m, std::int64_t k) { return input[static_cast<size_t>(m * g.K + k)]; };
  auto W = [&](std::int64_t k, std::int64_t n) { return weights[static_cast<size_t>(k * g.N + n)]; };
  auto O = [&](std::int64_t m, std::int64_t n) -> float& {
    return res.output[static_cast<size_t>(m * g.N + n)];
  };

  Registers reg(R, C);
  std::int64_t clock = 0;  // the global cycle being simulated
  for (std::int64_t fc = 0; fc < p.col_folds; ++fc) {
    for (std::int64_t fr = 0; fr < p.row_folds; ++fr) {
      const std::int64_t r0 = fr * R, c0 = fc * C;
      const int rows_used = static_cast<int>(std::min<std::int64_t>(R, p.spatial_rows - r0));
      const int cols_used = static_cast<int>(std::min<std::int64_t>(C, p.spatial_cols - c0));
      reg.clear();
      if (df != Dataflow::OS) {
        // Preload the stationary tile in R cycles: a row enters at the top each cycle and the columns
        // shift down, so the tile's last row goes in first.
        for (int s = 0; s < R; ++s, ++clock) {
          for (int r = R - 1; r > 0; --r)
            for (int c = 0; c < C; ++c) reg.stationary[reg.at(r, c)] = reg.stationary[reg.at(r - 1, c)];
          const int src = R - 1 - s;
          for (int c = 0; c < C; ++c) {
            float v = 0;
            if (src < rows_used && c < cols_used)
              v = df == Dataflow::WS ? W(r0 + src, c0 + c) : I(c0 + c, r0 + src);  // IS holds I^T
            reg.stationary[reg.at(0, c)] = v;
          }
        }
      }
      // Stream. Row r's west edge receives time step t in stream cycle s = t + r (the skew); for OS the
      // north edge of column c receives step t in cycle t + c. The fold is over once the bottom-right PE
      // has handled the last time step.
      bool fold_done = false;
      for (std::int64_t s = 0; !fold_done; ++s, ++clock) {
        for (int r = R - 1; r >= 0; --r) {
          const bool row_real = r < rows_used;
          for (int c = C - 1; c >= 0; --c) {
            const size_t i = reg.at(r, c);
            float x;
            std::int32_t t;
            if (c == 0) {
              const std::int64_t te = s - r;
              t = (te >= 0 && te < T) ? static_cast<std::int32_t>(te) : -1;
              x = 0;
              if (t >= 0 && row_real) {
                if (df == Dataflow::WS)
                  x = I(te, r0 + r);
                else if (df == Dataflow::IS)
                  x = W(r0 + r, te);
                else
                  x = I(r0 + r, te);
              }
            } else {
              x = reg.west[i - 1];
              t = reg.tag[i - 1];
            }
            const bool col_real = c < cols_used;
            if (df == Dataflow::OS) {
              float w;
              if (r == 0) {
                const std::int64_t te = s - c;
                w = (te >= 0 && te < T && col_real) ? W(te, c0 + c) : 0.0f;
              } else {
                w = reg.north[i - static_cast<size_t>(C)];
              }
              reg.west[i] = x;
              reg.tag[i] = t;
              reg.north[i] = w;
              if (t >= 0) {
                reg.acc[i] += x * w;
                if (row_real && col_real) ++res.mac_ops;
                if (t == T - 1) {  // this PE's output is complete: read it out of its accumulator
                  if (row_real && col_real) O(r0 + r, c0 + c) = reg.acc[i];
                  if (r == R - 1 && c == C - 1) fold_done = true;
                }
              }
            } else {
              const float above = r == 0 ? 0.0f : reg.north[i - static_cast<size_t>(C)];
              const float psum = t >= 0 ? above + x * reg.stationary[i] : 0.0f;
              reg.west[i] = x;
              reg.tag[i] = t;
              reg.north[i] = psum;
              if (t >= 0) {
                if (row_real && col_real) ++res.mac_ops;
                if (r == R - 1) {  // a finished partial sum leaves the bottom of the column
                  if (col_real) {
                    if (df == Dataflow::WS)
                      O(t, c0 + c) += psum;
                    else
                      O(c0 + c, t) += psum;
                  }
                  if (c == C - 1 && t == T - 1) fold_done = true;
                }
              }
            }
          }
        }
        if (fold_done) res.cycles = clock;
      }
      if (progress)
        progress((double(fc) * double(p.row_folds) + double(fr + 1)) /
                 (double(p.col_folds) * double(p.row_folds)));
    }
  }
  return res;
}

}  // namespace mp::systolic
