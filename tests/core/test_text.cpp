// core/text: the escapes and number formatting every report uses.
#include <gtest/gtest.h>

#include <climits>

#include "core/text.h"

TEST(Text, Thousands) {
  EXPECT_EQ(mp::thousands(0), "0");
  EXPECT_EQ(mp::thousands(999), "999");
  EXPECT_EQ(mp::thousands(42255), "42,255");
  EXPECT_EQ(mp::thousands(-1234567), "-1,234,567");
  EXPECT_EQ(mp::thousands(LLONG_MIN), "-9,223,372,036,854,775,808");
}

TEST(Text, Escapes) {
  EXPECT_EQ(mp::json_escape("a\"b\\c\nd\x01"), "a\\\"b\\\\c\\nd\\u0001");
  EXPECT_EQ(mp::xml_escape("<a & \"b\">"), "&lt;a &amp; &quot;b&quot;&gt;");
}
