// core/compare: the tolerance check every backend test relies on must catch what it is meant to catch.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/compare.h"
#include "core/random.h"

TEST(Compare, AcceptsWithinToleranceRejectsOutside) {
  std::vector<double> want = {1.0, -2.0, 100.0};
  std::vector<float> close = {1.0f + 1e-7f, -2.0f, 100.0f * (1 + 5e-7f)};
  EXPECT_TRUE(mp::compare(close, want, 1e-5, 1e-6).ok);
  std::vector<float> far = {1.0f, -2.001f, 100.0f};
  auto r = mp::compare(far, want, 1e-5, 1e-6);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.mismatches, 1u);
  EXPECT_EQ(r.worst_index, 1u);
  EXPECT_NE(r.summary().find("FAIL"), std::string::npos);
}

TEST(Compare, NaNIsAMismatch) {
  std::vector<double> want = {0.5, 0.25};
  std::vector<float> got = {0.5f, std::nanf("")};
  auto r = mp::compare(got, want, 1e-2, 1e-2);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.mismatches, 1u);
}

TEST(Random, SeededAndNotConstant) {
  auto a = mp::random_floats(64, 7), b = mp::random_floats(64, 7), c = mp::random_floats(64, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  float lo = 1, hi = -1;
  for (float x : a) lo = std::min(lo, x), hi = std::max(hi, x);
  EXPECT_LT(lo, -0.5f);
  EXPECT_GT(hi, 0.5f);
}
