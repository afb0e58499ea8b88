// The demo row the CLI frame carries itself: a cache-blocked CPU matmul checked against an fp64 triple loop.
// Capabilities add their own rows in their cmd_*.cpp files.
#include <chrono>

#include "core/compare.h"
#include "core/random.h"
#include "tools/metapipe/cli.h"

namespace mp::cli {
namespace {

std::vector<DemoRow> blocked_matmul_row(const DemoContext& ctx) {
  if (!ctx.wants("cpu")) return {};
  const int n = ctx.quick ? 96 : 256, blk = 32;
  auto seed = fresh_seed();
  auto A = random_floats(size_t(n) * n, seed), B = random_floats(size_t(n) * n, seed + 1);
  std::vector<float> C(size_t(n) * n, std::nanf(""));
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) C[size_t(i) * n + j] = 0.f;
  for (int i0 = 0; i0 < n; i0 += blk)
    for (int k0 = 0; k0 < n; k0 += blk)
      for (int j0 = 0; j0 < n; j0 += blk)
        for (int i = i0; i < std::min(n, i0 + blk); ++i)
          for (int k = k0; k < std::min(n, k0 + blk); ++k) {
            float a = A[size_t(i) * n + k];
            for (int j = j0; j < std::min(n, j0 + blk); ++j) C[size_t(i) * n + j] += a * B[size_t(k) * n + j];
          }
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::vector<double> ref(size_t(n) * n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < n; ++k)
      for (int j = 0; j < n; ++j) ref[size_t(i) * n + j] += double(A[size_t(i) * n + k]) * B[size_t(k) * n + j];
  auto cmp = compare(C, ref, 1e-5, 1e-5);
  return {{"matmul-blocked " + std::to_string(n) + "^3 f32", "cpu", cmp.summary(), format_ms(ms), cmp.ok}};
}

MP_REGISTER_DEMO("matmul-blocked", 0, blocked_matmul_row);

}  // namespace
}  // namespace mp::cli
