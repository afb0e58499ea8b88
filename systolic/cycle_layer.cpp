// Cycle-level mode for a topology layer: the PE array computes the layer's GEMM on random operands.
#include <cmath>

#include "core/checked.h"
#include "core/error.h"
#include "core/random.h"
#include "systolic/scalesim.h"

namespace mp::systolic {

CycleCheck simulate_layer_cycle_level(const Layer& layer, const SimConfig& cfg, std::uint64_t seed,
                                      const std::function<void(double)>& progress) {
  const GemmShape g = layer.gemm();
  // The caller checks estimate_cost against its limits; this bound keeps direct callers from overflowing
  // the operand sizes below.
  constexpr std::int64_t kMaxMacs = std::int64_t{1} << 40;
  const std::int64_t macs = mul_sat(mul_sat(g.M, g.K), g.N);
  MP_USER_CHECK(macs <= kMaxMacs, "cycle-level mode for layer '", layer.name, "' with ", macs,
                " multiply-accumulates (limit 2^40); use --mode analytical");
  const auto I = random_floats(static_cast<size_t>(g.M * g.K), seed);
  const auto W = random_floats(static_cast<size_t>(g.K * g.N), seed + 1);
  const CycleResult sim = simulate_gemm(g, cfg.array, I, W, progress);
  // Reference product in double, k outermost per row so the inner loop is contiguous.
  std::vector<double> ref(static_cast<size_t>(g.N));
  CycleCheck out;
  out.cycles = sim.cycles;
  out.product_ok = sim.mac_ops == g.M * g.K * g.N;
  for (std::int64_t m = 0; m < g.M; ++m) {
    std::fill(ref.begin(), ref.end(), 0.0);
    for (std::int64_t k = 0; k < g.K; ++k) {
      const double a = I[static_cast<size_t>(m * g.K + k)];
      const float* w = &W[static_cast<size_t>(k * g.N)];
      for (std::int64_t n = 0; n < g.N; ++n) ref[static_cast<size_t>(n)] += a * w[n];
    }
    for (std::int64_t n = 0; n < g.N; ++n) {
      const double got = sim.output[static_cast<size_t>(m * g.N + n)], want = ref[static_cast<size_t>(n)];
      const double err = std::abs(got - want);
      out.max_abs_err = std::max(out.max_abs_err, err);
      // fp32 accumulation over K terms of magnitude < 1: allow K * 2^-23 growth.
      if (!(err <= 1e-5 + 1.2e-7 * static_cast<double>(g.K) * (1 + std::abs(want)))) out.product_ok = false;
    }
  }
  return out;
}

}  // namespace mp::systolic
