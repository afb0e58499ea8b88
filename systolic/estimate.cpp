// Cost estimates of a layer under the analytical memory model and the cycle-level mode, computed from
// the fold plan alone (nothing allocated), so that `metapipe systolic` can refuse an input before it runs.
#include "core/checked.h"
#include "systolic/scalesim.h"
#include "systolic/systolic.h"

namespace mp::systolic {

LayerCost estimate_cost(const Layer& layer, const SimConfig& cfg, bool cycle_mode) {
  const GemmShape g = layer.gemm();
  const FoldPlan p = plan_gemm(g, cfg.array);
  const std::int64_t R = cfg.array.rows, C = cfg.array.cols;
  // The memory model walks every demand line of every fold (one line per array cycle), each of up to
  // R + C operand words; it skips repeated folds, so this is an upper estimate (a 4096^3 GEMM on 32x32,
  // 4.4e9 steps by this count, runs in about 15 s).
  const std::int64_t lines = mul_sat(mul_sat(p.row_folds, p.col_folds), p.cycles_per_fold);
  LayerCost c;
  c.work = mul_sat(lines, R + C);
  const std::int64_t ifmap_space = mul_sat(mul_sat(layer.ifmap_h, layer.ifmap_w), layer.channels);
  const std::int64_t filter_space = mul_sat(g.K, g.N);
  // Address tables: 8 + 4 + 4 bytes per output pixel and per window element; per-word stamps of the read
  // buffers (4 bytes each; with USER bandwidth also the set lists, about 24 bytes a word).
  c.bytes = mul_sat(add_sat(g.M, g.K), 16);
  c.bytes = add_sat(c.bytes, mul_sat(add_sat(ifmap_space, filter_space), cfg.user_bandwidth ? 24 : 4));
  if (cycle_mode) {
    c.work = add_sat(c.work, mul_sat(lines, R * C));
    // fp32 operands and output, the double reference row, five registers per PE.
    const std::int64_t words = add_sat(add_sat(mul_sat(g.M, g.K), mul_sat(g.K, g.N)), mul_sat(g.M, g.N));
    c.bytes = add_sat(c.bytes, add_sat(mul_sat(words, 4), add_sat(mul_sat(g.N, 8), mul_sat(R * C, 20))));
  }
  return c;
}

}  // namespace mp::systolic
