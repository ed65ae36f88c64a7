#include "testing/simulated_group.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

using std::chrono::milliseconds;

// Runs Barrier(key) on members `who` of `group`, each on its own thread.
std::vector<std::future<Status>> ArriveAsync(SimulatedGroup& group,
                                             const std::vector<int>& who,
                                             const std::string& key,
                                             double timeout_s) {
  std::vector<std::future<Status>> arrivals;
  for (int p : who) {
    arrivals.push_back(std::async(std::launch::async, [&group, p, key, timeout_s] {
      return group.Member(p)->Barrier(key, timeout_s);
    }));
  }
  return arrivals;
}

TEST(SimulatedGroupTest, MembersKnowTheirPlace) {
  SimulatedGroup group(3);
  EXPECT_EQ(group.process_count(), 3);
  for (int p = 0; p < 3; ++p) {
    EXPECT_EQ(group.Member(p)->process_index(), p);
    EXPECT_EQ(group.Member(p)->process_count(), 3);
    EXPECT_EQ(group.Member(p)->is_primary(), p == 0);
    EXPECT_EQ(group.Member(p), group.Member(p));
  }
}

TEST(SimulatedGroupTest, BarrierWaitsForTheLastArrival) {
  SimulatedGroup group(4);
  auto early = ArriveAsync(group, {0, 1, 2}, "k", 10);
  for (auto& arrival : early) {
    EXPECT_EQ(arrival.wait_for(milliseconds(50)), std::future_status::timeout);
  }
  SK_EXPECT_OK(group.Member(3)->Barrier("k", 10));
  for (auto& arrival : early) SK_EXPECT_OK(arrival.get());
}

TEST(SimulatedGroupTest, SingleMemberBarrierIsImmediate) {
  SimulatedGroup group(1);
  SK_EXPECT_OK(group.Member(0)->Barrier("k", 0));
}

TEST(SimulatedGroupTest, TimeoutNamesKeyAndMissingProcesses) {
  SimulatedGroup group(4);
  const auto start = std::chrono::steady_clock::now();
  auto arrivals = ArriveAsync(group, {0, 1}, "save/written", 0.2);
  for (auto& arrival : arrivals) {
    Status status = arrival.get();
    EXPECT_EQ(status.code(), StatusCode::kTimeout) << status.ToString();
    EXPECT_EQ(status.message(),
              "barrier 'save/written' timed out after 0.2 s; processes 2, 3 "
              "did not arrive");
  }
  // Well short of forever; loose, so that a loaded machine stays under it.
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(5000));
  // The barrier failed for the whole group: a latecomer learns it at once.
  Status late = group.Member(2)->Barrier("save/written", 10);
  EXPECT_EQ(late.code(), StatusCode::kTimeout) << late.ToString();
}

TEST(SimulatedGroupTest, OneMissingProcessIsNamedInTheSingular) {
  SimulatedGroup group(2);
  Status status = group.Member(1)->Barrier("k", 0.05);
  EXPECT_EQ(status.message(), "barrier 'k' timed out after 0.05 s; process 0 did not arrive");
}

TEST(SimulatedGroupTest, CompletedKeyCannotBeReused) {
  SimulatedGroup group(2);
  auto arrivals = ArriveAsync(group, {0, 1}, "k", 10);
  for (auto& arrival : arrivals) SK_ASSERT_OK(arrival.get());
  Status again = group.Member(0)->Barrier("k", 10);
  EXPECT_EQ(again.code(), StatusCode::kInvalidArgument) << again.ToString();
  EXPECT_NE(again.message().find("'k'"), std::string::npos) << again.ToString();
}

TEST(SimulatedGroupTest, ArrivingTwiceIsAnError) {
  SimulatedGroup group(2);
  // Process 0 arrives twice at once. Whichever call comes first counts; the
  // other is refused, as arriving twice or, if process 1 has completed the
  // barrier meanwhile, as reusing a spent key.
  auto twice = ArriveAsync(group, {0, 0}, "k", 10);
  SK_EXPECT_OK(group.Member(1)->Barrier("k", 10));
  Status a = twice[0].get(), b = twice[1].get();
  EXPECT_EQ(a.ok() + b.ok(), 1) << a.ToString() << " / " << b.ToString();
  EXPECT_EQ((a.ok() ? b : a).code(), StatusCode::kInvalidArgument);
}

TEST(SimulatedGroupTest, KeyValueStoreIsSharedAndWriteOnce) {
  SimulatedGroup group(2);
  SK_ASSERT_OK(group.Member(0)->KeyValueSet("a", "1"));
  Status again = group.Member(1)->KeyValueSet("a", "2");
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again.ToString();
  SK_ASSERT_OK_AND_ASSIGN(std::string value, group.Member(1)->KeyValueGet("a", 0));
  EXPECT_EQ(value, "1");
  SK_ASSERT_OK_AND_ASSIGN(auto present, group.Member(1)->KeyValueTryGet("a"));
  EXPECT_EQ(present, std::optional<std::string>("1"));
  SK_ASSERT_OK_AND_ASSIGN(auto absent, group.Member(1)->KeyValueTryGet("b"));
  EXPECT_FALSE(absent.has_value());
}

TEST(SimulatedGroupTest, KeysAreListedByPrefixAndDeletedForGood) {
  SimulatedGroup group(2);
  for (const char* key : {"op/arrived/0", "op/arrived/1", "op/verdict", "opx/arrived/0"}) {
    SK_ASSERT_OK(group.Member(0)->KeyValueSet(key, "1"));
  }
  SK_ASSERT_OK_AND_ASSIGN(auto arrived, group.Member(1)->KeyValueList("op/arrived/"));
  EXPECT_EQ(arrived, (std::vector<std::string>{"op/arrived/0", "op/arrived/1"}));
  SK_ASSERT_OK(group.Member(1)->KeyValueDelete("op/arrived/0"));
  SK_ASSERT_OK(group.Member(1)->KeyValueDelete("never/set"));  // not an error
  SK_ASSERT_OK_AND_ASSIGN(arrived, group.Member(0)->KeyValueList("op/arrived/"));
  EXPECT_EQ(arrived, (std::vector<std::string>{"op/arrived/1"}));
  EXPECT_EQ(group.KeyCount(), 3u);
  // A deleted key is gone: it may be set again.
  SK_EXPECT_OK(group.Member(0)->KeyValueSet("op/arrived/0", "2"));
}

TEST(SimulatedGroupTest, KeyValueGetWaitsForTheSet) {
  SimulatedGroup group(2);
  auto get = std::async(std::launch::async,
                        [&] { return group.Member(1)->KeyValueGet("k", 10); });
  EXPECT_EQ(get.wait_for(milliseconds(50)), std::future_status::timeout);
  SK_ASSERT_OK(group.Member(0)->KeyValueSet("k", "v"));
  Result<std::string> value = get.get();
  SK_ASSERT_OK(value.status());
  EXPECT_EQ(*value, "v");
}

TEST(SimulatedGroupTest, KeyValueGetTimesOut) {
  SimulatedGroup group(2);
  Result<std::string> value = group.Member(0)->KeyValueGet("never", 0.05);
  EXPECT_EQ(value.status().code(), StatusCode::kTimeout) << value.status().ToString();
  EXPECT_NE(value.status().message().find("'never'"), std::string::npos);
}

TEST(SimulatedGroupTest, KilledMemberFailsEveryCall) {
  SimulatedGroup group(2);
  group.Kill(1);
  auto dead = group.Member(1);
  EXPECT_EQ(dead->Barrier("k", 10).code(), StatusCode::kCancelled);
  EXPECT_EQ(dead->KeyValueSet("k", "v").code(), StatusCode::kCancelled);
  EXPECT_EQ(dead->KeyValueGet("k", 10).status().code(), StatusCode::kCancelled);
  EXPECT_EQ(dead->KeyValueTryGet("k").status().code(), StatusCode::kCancelled);
  // The survivor still works, and its barrier waits for the dead in vain.
  SK_EXPECT_OK(group.Member(0)->KeyValueSet("k", "v"));
  Status status = group.Member(0)->Barrier("k", 0.05);
  EXPECT_EQ(status.message(), "barrier 'k' timed out after 0.05 s; process 1 did not arrive");
}

TEST(SimulatedGroupTest, KillReleasesBlockedCallsAndWithdrawsArrival) {
  SimulatedGroup group(3);
  auto barrier = ArriveAsync(group, {0, 2}, "k", 0.5);
  auto get = std::async(std::launch::async,
                        [&] { return group.Member(2)->KeyValueGet("x", 10); });
  std::this_thread::sleep_for(milliseconds(50));
  const auto killed_at = std::chrono::steady_clock::now();
  group.Kill(2);
  EXPECT_EQ(get.get().status().code(), StatusCode::kCancelled);
  EXPECT_EQ(barrier[1].get().code(), StatusCode::kCancelled);
  // Released by the kill, not by the get's 10 s timeout (the barrier's own
  // timeout would have answered kTimeout).
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, milliseconds(5000));
  // Process 1 arrives, but process 2's arrival died with it.
  SK_ASSERT_OK(group.Member(1)->KeyValueSet("unrelated", ""));
  Status status = group.Member(1)->Barrier("k", 10);
  EXPECT_EQ(status.code(), StatusCode::kTimeout) << status.ToString();
  EXPECT_NE(status.message().find("process 2 did not arrive"), std::string::npos)
      << status.ToString();
  EXPECT_EQ(barrier[0].get().code(), StatusCode::kTimeout);
}

}  // namespace
}  // namespace shardkeep
