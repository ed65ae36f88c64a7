// SaveQueue: starts in call order on one thread, ends seen without polling,
// uncollected failures logged once, cancels before and after the start.
#include "engine/save_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "shardkeep/cancellation.h"
#include "shardkeep/storage.h"
#include "storage/fault_injection.h"
#include "testing/payloads.h"
#include "testing/status_matchers.h"

namespace shardkeep::internal {
namespace {

struct Logged {
  std::mutex mu;
  std::vector<std::string> lines;
  void Add(const std::string& path, const std::string& failure) {
    std::lock_guard<std::mutex> lock(mu);
    lines.push_back(path + ": " + failure);
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return lines.size();
  }
};

class SaveQueueTest : public ::testing::Test {
 protected:
  SaveQueue::Hooks Hooks() {
    SaveQueue::Hooks hooks;
    hooks.log_failure = [this](const std::string& path, const std::string& failure) {
      logged_.Add(path, failure);
    };
    return hooks;
  }

  // A start that saves `values` to `path` on the memory storage (or on
  // `storage`, a wrapper of it).
  QueuedSave::Start StartOf(const std::string& path,
                            std::shared_ptr<Storage> storage = nullptr) {
    if (storage == nullptr) storage = storage_;
    return [this, path, storage]() {
      SaveRequest request;
      request.path = path;
      CheckpointablePayload part = testdata::PytreePayload("state", {{"x", "int32", {100}}});
      part.shards.push_back({0, DType::kInt32, Box{{0}, {100}},
                             reinterpret_cast<const uint8_t*>(values_.data())});
      request.parts.push_back(std::move(part));
      Options options;
      options.timeout_s = 5;
      return StartSave(storage, NewSingleProcessCoordinator(), std::move(request), options);
    };
  }

  bool Committed(const std::string& path) {
    Result<bool> exists = storage_->Exists(path + "/_SHARDKEEP");
    return exists.ok() && *exists;
  }

  std::vector<int32_t> values_ = std::vector<int32_t>(100, 3);
  std::shared_ptr<Storage> storage_ = NewMemoryStorage();
  Logged logged_;
};

TEST_F(SaveQueueTest, StartsRunInCallOrderAndOnFinishedRunsBeforeTheOutcomeIsSeen) {
  SaveQueue queue(Hooks());
  std::mutex mu;
  std::vector<int> order;
  std::atomic<int> finished{0};
  std::vector<std::shared_ptr<QueuedSave>> saves;
  for (int i = 0; i < 5; ++i) {
    QueuedSave::Start save_it = StartOf("ckpt/" + std::to_string(i));
    saves.push_back(queue.Enqueue(
        "ckpt/" + std::to_string(i), 5,
        [&, i, save_it] {
          {
            std::lock_guard<std::mutex> lock(mu);
            order.push_back(i);
          }
          return save_it();
        },
        [&](const QueuedSave::End& end) {
          finished += end.outcome.ok() ? 1 : 100;
          return false;
        }));
  }
  for (int i = 0; i < 5; ++i) {
    std::optional<Status> outcome = saves[i]->Wait(-1);
    ASSERT_TRUE(outcome.has_value());
    SK_EXPECT_OK(*outcome);
    EXPECT_TRUE(saves[i]->Done());
    EXPECT_TRUE(Committed("ckpt/" + std::to_string(i)));
  }
  EXPECT_EQ(finished.load(), 5);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(queue.WaitForUninterrupted(5));
  EXPECT_TRUE(queue.Running().empty());
  EXPECT_EQ(logged_.size(), 0u);
}

TEST_F(SaveQueueTest, AFailureNobodyCollectedIsLoggedOnceNamingThePath) {
  SaveQueue queue(Hooks());
  auto failing = [] { return Result<std::unique_ptr<SaveHandle>>(StorageError("disk gone")); };
  std::shared_ptr<QueuedSave> dropped = queue.Enqueue("dropped", 5, failing, nullptr);
  ASSERT_TRUE(queue.WaitForUninterrupted(5));
  ASSERT_EQ(logged_.size(), 1u);
  EXPECT_EQ(logged_.lines[0], "dropped: disk gone");

  // A wait under way collects the failure: nothing more is logged.
  std::atomic<bool> release{false};
  std::shared_ptr<QueuedSave> awaited = queue.Enqueue(
      "awaited", 5,
      [&] {
        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        return Result<std::unique_ptr<SaveHandle>>(StorageError("disk gone"));
      },
      nullptr);
  awaited->StartAwaiting();
  release = true;
  std::optional<Status> outcome = awaited->Wait(-1);
  EXPECT_TRUE(awaited->StopAwaiting());
  awaited->MarkCollected();
  EXPECT_EQ(outcome->code(), StatusCode::kStorage);
  ASSERT_TRUE(queue.WaitForUninterrupted(5));
  EXPECT_EQ(logged_.size(), 1u);
}

// A manager keeps its record of steps in on_finished: it needs the
// commit's created_ns there, and raises the failures it reports itself.
TEST_F(SaveQueueTest, OnFinishedGetsTheCommitAndCanReportTheFailureItself) {
  SaveQueue queue(Hooks());
  std::optional<QueuedSave::End> seen;
  std::shared_ptr<QueuedSave> save =
      queue.Enqueue("ckpt", 5, StartOf("ckpt"), [&](const QueuedSave::End& end) {
        seen = end;
        return true;  // ignored: the save committed
      });
  ASSERT_TRUE(save->Wait(-1).has_value());
  ASSERT_TRUE(seen.has_value());
  SK_EXPECT_OK(seen->outcome);
  EXPECT_GT(seen->created_ns, 0);
  EXPECT_EQ(save->CommittedCreatedNs(), std::optional<int64_t>(seen->created_ns));

  auto failing = [] { return Result<std::unique_ptr<SaveHandle>>(StorageError("disk gone")); };
  std::string reported_failure;
  queue.Enqueue("reported", 5, failing, [&](const QueuedSave::End& end) {
    reported_failure = end.outcome.message();
    EXPECT_EQ(end.created_ns, 0);
    return true;
  });
  queue.Enqueue("unreported", 5, failing, [](const QueuedSave::End&) { return false; });
  ASSERT_TRUE(queue.WaitForUninterrupted(5));
  EXPECT_EQ(reported_failure, "disk gone");
  ASSERT_EQ(logged_.size(), 1u) << "only the failure on_finished did not report is logged";
  EXPECT_EQ(logged_.lines[0], "unreported: disk gone");
}

TEST_F(SaveQueueTest, ASaveCancelledBeforeItsTurnNeverStarts) {
  SaveQueue queue(Hooks());
  std::atomic<bool> release{false};
  std::shared_ptr<QueuedSave> slow = queue.Enqueue(
      "slow", 5,
      [&] {
        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        return Result<std::unique_ptr<SaveHandle>>(StorageError("the slow start"));
      },
      nullptr);
  std::atomic<bool> ran{false};
  std::shared_ptr<QueuedSave> queued = queue.Enqueue(
      "ckpt", 5, [&] { ran = true; return StartOf("ckpt")(); }, nullptr);
  EXPECT_FALSE(queued->Wait(0.05).has_value());  // behind the slow start
  SK_EXPECT_OK(queued->Cancel());
  EXPECT_TRUE(queued->interrupted());
  EXPECT_FALSE(queue.WaitForUninterrupted(0.01));  // the slow one still runs
  SK_EXPECT_OK(slow->Cancel());
  EXPECT_EQ(queue.Running().size(), 2u);
  EXPECT_TRUE(queue.WaitForUninterrupted(0)) << "exit does not wait for cancelled saves";
  release = true;
  std::optional<Status> outcome = queued->Wait(-1);
  EXPECT_EQ(outcome->code(), StatusCode::kCancelled);
  EXPECT_NE(outcome->message().find("cancelled before it started"), std::string::npos);
  EXPECT_FALSE(ran.load());
  EXPECT_FALSE(Committed("ckpt"));
  slow->Wait(-1);
  EXPECT_EQ(logged_.size(), 0u) << "the failures of cancelled saves are not logged";
}

TEST_F(SaveQueueTest, ACancelWhileTheStartRunsStopsTheSaveOnceStarted) {
  SaveQueue queue(Hooks());
  std::atomic<bool> in_start{false}, release{false};
  // The save's background phase (every thread but the starter's) waits for
  // its cancel: a save this small could otherwise commit between its start
  // returning and the starter cancelling it, on a busy machine.
  std::atomic<std::thread::id> starter;
  auto gated = std::make_shared<FaultInjectionStorage>(storage_);
  gated->FailOn([&starter](std::string_view, const std::string&) -> Status {
    if (std::this_thread::get_id() == starter.load()) return Status::Ok();
    const CancellationToken token = CancellationScope::Current();
    for (int ms = 0; ms < 10000 && !token.cancelled(); ++ms) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return Status::Ok();
  });
  QueuedSave::Start save_it = StartOf("ckpt", gated);
  std::shared_ptr<QueuedSave> save = queue.Enqueue(
      "ckpt", 5,
      [&] {
        starter = std::this_thread::get_id();
        in_start = true;
        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        return save_it();
      },
      nullptr);
  while (!in_start) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  SK_EXPECT_OK(save->Cancel());
  release = true;
  std::optional<Status> outcome = save->Wait(-1);
  EXPECT_FALSE(outcome->ok());
  EXPECT_FALSE(Committed("ckpt"));
  EXPECT_EQ(logged_.size(), 0u);
}

TEST_F(SaveQueueTest, DestroyingTheQueueWaitsForItsSaves) {
  std::atomic<bool> finished{false};
  {
    SaveQueue queue(Hooks());
    queue.Enqueue("ckpt", 5, StartOf("ckpt"), [&](const QueuedSave::End&) {
      finished = true;
      return false;
    });
  }
  EXPECT_TRUE(finished.load());
  EXPECT_TRUE(Committed("ckpt"));
}

}  // namespace
}  // namespace shardkeep::internal
