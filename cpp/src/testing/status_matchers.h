// Test helpers shared by every C++ test.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "shardkeep/status.h"

namespace shardkeep::testing {

// True when `text` contains `part`; the failure message shows both.
inline ::testing::AssertionResult Has(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' lacks '" << part << "'";
}

}  // namespace shardkeep::testing

#define SK_ASSERT_OK(expr)                                  \
  do {                                                      \
    const ::shardkeep::Status sk_s_ = (expr);               \
    ASSERT_TRUE(sk_s_.ok()) << sk_s_.ToString();            \
  } while (0)
#define SK_EXPECT_OK(expr)                                  \
  do {                                                      \
    const ::shardkeep::Status sk_s_ = (expr);               \
    EXPECT_TRUE(sk_s_.ok()) << sk_s_.ToString();            \
  } while (0)

// SK_ASSERT_OK_AND_ASSIGN(auto x, FunctionReturningResult());
#define SK_ASSERT_OK_AND_ASSIGN(lhs, expr)                              \
  auto SK_CONCAT_(sk_r_, __LINE__) = (expr);                            \
  ASSERT_TRUE(SK_CONCAT_(sk_r_, __LINE__).ok())                         \
      << SK_CONCAT_(sk_r_, __LINE__).status().ToString();               \
  lhs = std::move(SK_CONCAT_(sk_r_, __LINE__)).value()
