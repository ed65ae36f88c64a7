#include "core/decimal.h"

#include <gtest/gtest.h>

#include <limits>

namespace shardkeep {
namespace {

TEST(DecimalValueTest, ReadsPlainDigitsUpToTheBound) {
  EXPECT_EQ(DecimalValue("0", 10), 0);
  EXPECT_EQ(DecimalValue("007", 10), 7);  // callers that forbid zeros check them
  EXPECT_EQ(DecimalValue("10", 10), 10);
  EXPECT_EQ(DecimalValue("9223372036854775807", std::numeric_limits<int64_t>::max()),
            std::numeric_limits<int64_t>::max());
}

TEST(DecimalValueTest, RefusesAnythingElseWithoutThrowing) {
  for (const char* text : {"", "-1", "+1", " 1", "1 ", "1a", "0x10", "1.0"}) {
    EXPECT_EQ(DecimalValue(text, 100), std::nullopt) << text;
  }
  EXPECT_EQ(DecimalValue("11", 10), std::nullopt);
  EXPECT_EQ(DecimalValue("2147483648", std::numeric_limits<int>::max()), std::nullopt);
  EXPECT_EQ(DecimalValue("99999999999999999999999", std::numeric_limits<int64_t>::max()),
            std::nullopt);
}

}  // namespace
}  // namespace shardkeep
