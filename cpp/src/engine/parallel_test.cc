#include "engine/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <new>
#include <stdexcept>
#include <vector>

#include "shardkeep/cancellation.h"
#include "testing/status_matchers.h"

namespace shardkeep::internal {
namespace {

TEST(ParallelForTest, RunsEveryItemOnce) {
  std::vector<std::atomic<int>> calls(100);
  SK_ASSERT_OK(ParallelFor(calls.size(), 4, [&](size_t i) {
    calls[i]++;
    return Status::Ok();
  }));
  for (auto& n : calls) EXPECT_EQ(n.load(), 1);
}

TEST(ParallelForTest, AnExceptionInAWorkerBecomesAnInternalErrorNamingTheItem) {
  Status status = ParallelFor(
      8, 4,
      [](size_t i) -> Status {
        if (i == 5) throw std::runtime_error("callback failed");
        return Status::Ok();
      },
      "copy of leaf 'w'");
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_NE(status.message().find("copy of leaf 'w' 5"), std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("callback failed"), std::string::npos)
      << status.message();
}

TEST(ParallelForTest, BadAllocBecomesResourceExhausted) {
  Status status = ParallelFor(3, 3, [](size_t i) -> Status {
    if (i == 2) throw std::bad_alloc();
    return Status::Ok();
  });
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.ToString();
}

TEST(ParallelForTest, UnknownExceptionsAreCaughtToo) {
  Status status = ParallelFor(2, 2, [](size_t) -> Status { throw 42; });
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_NE(status.message().find("unknown type"), std::string::npos);
}

// A buffer far larger than any machine's memory, as a corrupt size or a
// huge chunk would ask for. (Sanitizers abort on such a request instead of
// throwing; scripts/sanitize.sh leaves this test out.)
TEST(ParallelForTest, HugeAllocationFailsWithResourceExhausted) {
  Status status = ParallelFor(2, 2, [](size_t i) -> Status {
    if (i == 1) {
      std::vector<uint8_t> buffer;
      buffer.resize(uint64_t{1} << 60);
    }
    return Status::Ok();
  });
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.ToString();
  EXPECT_NE(status.message().find("out of memory"), std::string::npos);
}

TEST(ParallelForTest, CancellationStopsNewItemsOnEveryThread) {
  CancellationToken token;
  CancellationScope scope(token);
  std::atomic<int> started{0};
  Status status = ParallelFor(1000, 4, [&](size_t) {
    if (++started == 10) token.Cancel();
    return Status::Ok();
  });
  EXPECT_EQ(status.code(), StatusCode::kCancelled) << status.ToString();
  // At most one item per thread starts after the cancel.
  EXPECT_LE(started.load(), 10 + 4);
}

TEST(ParallelForTest, HelperThreadsInheritTheCancellationScope) {
  CancellationToken token;
  CancellationScope scope(token);
  std::mutex mu;
  std::vector<CancellationToken> seen;
  std::set<std::thread::id> threads;
  SK_ASSERT_OK(ParallelFor(64, 4, [&](size_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(CancellationScope::Current());
    threads.insert(std::this_thread::get_id());
    return Status::Ok();
  }));
  EXPECT_GT(threads.size(), 1u);
  token.Cancel();
  for (const CancellationToken& t : seen) EXPECT_TRUE(t.cancelled());
}

}  // namespace
}  // namespace shardkeep::internal
