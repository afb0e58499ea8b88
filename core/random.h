// Reproducible random inputs for checks and tests: every check uses fresh random data, never zeros.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace mp {

// Uniform values in [lo, hi) from a seeded generator (std::mt19937_64; the seed is printed by callers that
// want a failing case to be repeatable).
inline std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// A seed that differs from run to run (for "fresh" inputs); callers print it.
inline uint64_t fresh_seed() { return std::random_device{}() * 0x9E3779B97F4A7C15ull ^ std::random_device{}(); }

}  // namespace mp
