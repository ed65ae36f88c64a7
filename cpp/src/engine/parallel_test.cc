#include "engine/parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
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

// The threads of one call are kept for the next: once the first call's
// helpers are idle again, a second call runs on threads that ran items
// before (a fresh thread would start with the thread-local count at 0).
TEST(ParallelForTest, HelperThreadsAreReusedAcrossCalls) {
  static thread_local int items_on_this_thread = 0;
  auto call = [](size_t items) {
    std::atomic<size_t> arrived{0};
    std::atomic<int> on_used_threads{0};
    EXPECT_TRUE(ParallelFor(items, static_cast<int>(items), [&](size_t) {
      // Every item waits for the others, so `items` threads run them.
      arrived++;
      while (arrived.load() < items) std::this_thread::yield();
      if (items_on_this_thread++ > 0) on_used_threads++;
      return Status::Ok();
    }).ok());
    return on_used_threads.load();
  };
  // The first call runs an item on every thread idle now (earlier tests
  // leave some, and which idle thread takes an item is the pool's choice),
  // so that any idle thread the second call gets has run one. Its helpers
  // are back among the idle threads only after it returns; wait for them
  // (by count, not by a fixed sleep, so a loaded machine does not fail it).
  const size_t first_items = std::max<size_t>(IdlePoolThreads() + 1, 4);
  call(first_items);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (IdlePoolThreads() < first_items - 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // A thread an earlier test leaves idle meanwhile has run none, so the
  // check asks for reuse, not for all four: a pool that started fresh
  // helpers for each call would give the caller's item alone.
  EXPECT_GE(call(4), 2);
}

#ifdef __linux__
int ThisThreadsNice() {
  return getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
}

// Every item waits for the others, so four threads run them; returns the
// nice values they ran at.
std::set<int> NiceValuesOfHelpers() {
  std::mutex mu;
  std::set<int> seen;
  std::atomic<int> arrived{0};
  EXPECT_TRUE(ParallelFor(4, 4, [&](size_t) {
    arrived++;
    while (arrived.load() < 4) std::this_thread::yield();
    std::lock_guard<std::mutex> lock(mu);
    seen.insert(ThisThreadsNice());
    return Status::Ok();
  }).ok());
  return seen;
}

// Helpers started for a lower-priority caller (a background save) never
// work for a caller at normal priority, which could not raise them back.
TEST(ParallelForTest, HelpersRunAtTheCallersPriority) {
  const int normal = ThisThreadsNice();
  EXPECT_EQ(NiceValuesOfHelpers(), std::set<int>{normal});
  std::set<int> lowered;
  std::thread background([&] {
    ASSERT_EQ(setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), normal + 5), 0);
    lowered = NiceValuesOfHelpers();
  });
  background.join();
  EXPECT_EQ(lowered, std::set<int>{normal + 5});
  EXPECT_EQ(NiceValuesOfHelpers(), std::set<int>{normal});  // idle low ones not taken
}
#endif

// A call inside an item of another call gets threads of its own at once,
// even when the outer call holds every idle thread: no deadlock.
TEST(ParallelForTest, CallsNest) {
  std::atomic<int> inner_items{0};
  SK_ASSERT_OK(ParallelFor(8, 8, [&](size_t) {
    return ParallelFor(8, 8, [&](size_t) {
      inner_items++;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return Status::Ok();
    });
  }));
  EXPECT_EQ(inner_items.load(), 64);
}

// A forked child has none of its parent's pooled threads and starts its
// own.
TEST(ParallelForTest, WorksInAForkedChild) {
  SK_ASSERT_OK(ParallelFor(4, 4, [](size_t) { return Status::Ok(); }));
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::atomic<int> items{0};
    const Status status = ParallelFor(16, 4, [&](size_t) {
      items++;
      return Status::Ok();
    });
    ::_exit(status.ok() && items.load() == 16 ? 0 : 1);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 0);
}

#ifdef __linux__
// The pool keeps the job's thread and hands it the next job: no thread per
// job. Run from a thread at a nice value no other test uses, so the pool it
// gets holds only the threads this test starts (an earlier test's helpers,
// still finishing, would otherwise go idle in between and take a job).
TEST(RunOnPoolTest, RunsTheJobOnAnotherThreadThatThePoolKeeps) {
  std::vector<std::thread::id> ran_on;
  std::thread::id caller;
  std::thread isolated([&] {
    caller = std::this_thread::get_id();
    ASSERT_EQ(setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)),
                          ThisThreadsNice() + 11),
              0);
    // Zero, or the threads a repeat of this test left idle.
    const size_t idle_before = std::max<size_t>(IdlePoolThreads(), 1);
    std::mutex mu;
    std::condition_variable cv;
    for (size_t i = 1; i <= 3; ++i) {
      ASSERT_TRUE(RunOnPool([&] {
        std::lock_guard<std::mutex> lock(mu);
        ran_on.push_back(std::this_thread::get_id());
        cv.notify_all();
      }));
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return ran_on.size() == i; });
      lock.unlock();
      // Waited for, not slept on: a busy machine may take long to get the
      // job's thread back to idle.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (IdlePoolThreads() < idle_before) {
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the job's thread never idled";
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  });
  isolated.join();
  ASSERT_EQ(ran_on.size(), 3u);
  EXPECT_EQ(std::count(ran_on.begin(), ran_on.end(), caller), 0);
  EXPECT_EQ(std::set<std::thread::id>(ran_on.begin(), ran_on.end()).size(), 1u);
}
#endif

}  // namespace
}  // namespace shardkeep::internal
