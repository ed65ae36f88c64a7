#include "shardkeep/status.h"

#include <gtest/gtest.h>

#include <string>

namespace shardkeep {
namespace {

Result<int> Half(int n) {
  if (n % 2) return InvalidArgumentError(std::to_string(n) + " is odd");
  return n / 2;
}

TEST(ResultTest, HoldsAValueOrAnError) {
  Result<int> even = Half(8);
  ASSERT_TRUE(even.ok());
  EXPECT_EQ(even.value(), 4);
  EXPECT_EQ(*even, 4);
  Result<int> odd = Half(3);
  EXPECT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().code(), StatusCode::kInvalidArgument);
}

TEST(ResultTest, AnOkStatusIsNotAValue) {
  Result<int> wrong{Status::Ok()};
  EXPECT_EQ(wrong.status().code(), StatusCode::kInternal);
}

TEST(ResultDeathTest, ValueOfAnErrorEndsTheProcessNamingTheError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Result<int> odd = Half(3);
  EXPECT_DEATH((void)odd.value(), "value\\(\\) called on an error: InvalidArgument: 3 is odd");
  EXPECT_DEATH((void)*Half(5), "5 is odd");
  Result<std::string> missing{NotFoundError("no such leaf")};
  EXPECT_DEATH((void)missing->size(), "no such leaf");
}

}  // namespace
}  // namespace shardkeep
