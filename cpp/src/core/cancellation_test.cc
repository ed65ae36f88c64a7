#include "shardkeep/cancellation.h"

#include <gtest/gtest.h>

#include <thread>

namespace shardkeep {
namespace {

TEST(CancellationTest, WithoutAScopeNothingIsCancelled) {
  EXPECT_FALSE(CancellationScope::Current().cancelled());
}

TEST(CancellationTest, CopiesShareTheFlag) {
  CancellationToken token;
  CancellationToken copy = token;
  copy.Cancel();
  EXPECT_TRUE(token.cancelled());
}

TEST(CancellationTest, ScopesNestAndRestoreTheOuterToken) {
  CancellationToken outer, inner;
  CancellationScope outer_scope(outer);
  {
    CancellationScope inner_scope(inner);
    inner.Cancel();
    EXPECT_TRUE(CancellationScope::Current().cancelled());
  }
  EXPECT_FALSE(CancellationScope::Current().cancelled());
  outer.Cancel();
  EXPECT_TRUE(CancellationScope::Current().cancelled());
}

TEST(CancellationTest, AScopeBelongsToItsThread) {
  CancellationToken token;
  token.Cancel();
  CancellationScope scope(token);
  bool other_thread_cancelled = true;
  std::thread([&] { other_thread_cancelled = CancellationScope::Current().cancelled(); })
      .join();
  EXPECT_FALSE(other_thread_cancelled);
}

}  // namespace
}  // namespace shardkeep
