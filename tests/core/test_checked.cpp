// core/checked.h: overflow-safe products and sums, and the --max-work / --max-memory syntax.
#include <gtest/gtest.h>

#include "core/checked.h"

namespace {

TEST(Checked, MulAndAddDetectOverflow) {
  EXPECT_EQ(mp::checked_mul(1 << 20, 1 << 20), int64_t{1} << 40);
  EXPECT_FALSE(mp::checked_mul(int64_t{1} << 32, int64_t{1} << 31).has_value());
  EXPECT_FALSE(mp::checked_mul(mp::kInt64Max, 2).has_value());
  EXPECT_EQ(mp::checked_add(mp::kInt64Max - 1, 1), mp::kInt64Max);
  EXPECT_FALSE(mp::checked_add(mp::kInt64Max, 1).has_value());
  EXPECT_EQ(mp::mul_sat(int64_t{1} << 40, int64_t{1} << 40), mp::kInt64Max);
  EXPECT_EQ(mp::add_sat(mp::kInt64Max, 5), mp::kInt64Max);
  EXPECT_EQ(mp::mul_sat(3, 4), 12);
}

TEST(Checked, MulOrFailNamesTheInput) {
  EXPECT_EQ(mp::mul_or_fail(6, 7, "a x b"), 42);
  try {
    mp::mul_or_fail(int64_t{3000000000}, int64_t{4000000000} * 1000, "grid.rows x grid.cols");
    FAIL() << "no error";
  } catch (const mp::user_error& e) {
    EXPECT_STREQ(e.what(), "grid.rows x grid.cols overflows 64-bit integers (3000000000 x 4000000000000)");
  }
}

TEST(Checked, ParseLimit) {
  EXPECT_EQ(mp::parse_limit("1000"), 1000);
  EXPECT_EQ(mp::parse_limit("20G"), int64_t{20} * 1000 * 1000 * 1000);
  EXPECT_EQ(mp::parse_limit("8GiB"), int64_t{8} << 30);
  EXPECT_EQ(mp::parse_limit("512Mi"), int64_t{512} << 20);
  EXPECT_EQ(mp::parse_limit("1k"), 1000);
  EXPECT_EQ(mp::parse_limit("2TB"), int64_t{2} * 1000 * 1000 * 1000 * 1000);
  for (const char* bad : {"", "0", "-5", "lots", "1x", "1GG", "2e9", "9223372036854775807T", "1 G"})
    EXPECT_FALSE(mp::parse_limit(bad).has_value()) << bad;
}

TEST(Checked, Formats) {
  EXPECT_EQ(mp::format_bytes(1024), "1.0 KiB");
  EXPECT_EQ(mp::format_bytes(int64_t{8} << 30), "8.0 GiB");
  EXPECT_EQ(mp::format_bytes(512), "512 B");
  EXPECT_EQ(mp::short_count(1000), "1000");
  EXPECT_EQ(mp::short_count(20000000000), "2e+10");
}

}  // namespace
