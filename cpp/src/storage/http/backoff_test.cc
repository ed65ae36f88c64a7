#include "storage/http/backoff.h"

#include <gtest/gtest.h>

#include <vector>

namespace shardkeep::http {
namespace {

TEST(BackoffTest, DoublesUpToTheCapWithFullJitter) {
  const BackoffPolicy policy{0.05, 5.0};
  auto almost_one = [] { return 0.999999; };
  std::vector<double> ceilings;
  for (int retry = 1; retry <= 10; ++retry) {
    ceilings.push_back(*BackoffBeforeRetry(policy, retry, 1e9, almost_one));
  }
  const double expected[] = {0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5, 5, 5};
  for (int i = 0; i < 10; ++i) {
    EXPECT_NEAR(ceilings[i], expected[i] * 0.999999, 1e-12) << i;
  }
  EXPECT_EQ(*BackoffBeforeRetry(policy, 3, 1e9, [] { return 0.0; }), 0.0);
  EXPECT_DOUBLE_EQ(*BackoffBeforeRetry(policy, 3, 1e9, [] { return 0.25; }),
                   0.05);
  // Huge retry counts stay at the cap.
  EXPECT_NEAR(*BackoffBeforeRetry(policy, 100000, 1e9, almost_one), 5.0, 1e-5);
}

TEST(BackoffTest, GivesUpWhenTheWaitWouldPassTheDeadline) {
  const BackoffPolicy policy{0.05, 5.0};
  auto half = [] { return 0.5; };
  // Retry 8: ceiling 5 s, wait 2.5 s.
  EXPECT_DOUBLE_EQ(*BackoffBeforeRetry(policy, 8, 2.6, half), 2.5);
  EXPECT_FALSE(BackoffBeforeRetry(policy, 8, 2.5, half).has_value());
  EXPECT_FALSE(BackoffBeforeRetry(policy, 1, 0.0, half).has_value());
  EXPECT_FALSE(BackoffBeforeRetry(policy, 1, -1.0, half).has_value());
}

TEST(BackoffTest, IsDeterministicUnderASeededSource) {
  auto schedule = [](unsigned seed) {
    std::vector<double> waits;
    unsigned state = seed;
    auto lcg = [&state] {
      state = state * 1103515245u + 12345u;
      return (state >> 8) / double(1u << 24);
    };
    for (int retry = 1; retry <= 6; ++retry) {
      waits.push_back(*BackoffBeforeRetry({}, retry, 100.0, lcg));
    }
    return waits;
  };
  EXPECT_EQ(schedule(7), schedule(7));
  EXPECT_NE(schedule(7), schedule(8));
}

}  // namespace
}  // namespace shardkeep::http
