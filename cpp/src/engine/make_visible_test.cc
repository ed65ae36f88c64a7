// A forced save replacing a committed checkpoint, with a failure or a
// crash injected at every storage call it makes: the path must always hold
// one whole committed checkpoint, the old or the new (with the atomic
// exchange), and a failed undo must say the commit state is unknown.
#include "engine/make_visible.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <optional>

#include "shardkeep/checkpoint.h"
#include "storage/fault_injection.h"
#include "testing/status_matchers.h"
#include "testing/storage_conformance.h"
#include "testing/versions.h"

namespace shardkeep {
namespace {

using testdata::CommittedVersion;
using testdata::SaveVersion;

constexpr char kPath[] = "r/ckpt";
constexpr char kTmp[] = "r/ckpt.shardkeep-tmp";
constexpr char kOld[] = "r/ckpt.shardkeep-old";

// Memory storage holding version 1 at kPath, seen through a fault injector
// that can pretend not to support Exchange.
struct Fixture {
  explicit Fixture(bool exchange)
      : inner(NewMemoryStorage()),
        storage(std::make_shared<FaultInjectionStorage>(inner)) {
    if (!exchange) storage->OverrideFeatures({.atomic_rename = true});
    EXPECT_TRUE(SaveVersion(storage, kPath, 1).ok());
  }
  std::shared_ptr<Storage> inner;
  std::shared_ptr<FaultInjectionStorage> storage;
};

// How many storage calls a forced replacement makes.
int CallsOfAForcedSave(bool exchange) {
  Fixture fixture(exchange);
  std::atomic<int> calls{0};
  fixture.storage->FailOn([&](std::string_view, const std::string&) {
    ++calls;
    return Status::Ok();
  });
  EXPECT_TRUE(SaveVersion(fixture.storage, kPath, 2).ok());
  return calls;
}

class ForcedReplaceTest : public ::testing::TestWithParam<bool> {};

INSTANTIATE_TEST_SUITE_P(Modes, ForcedReplaceTest, ::testing::Values(true, false),
                         [](const auto& info) {
                           return info.param ? "Exchange" : "TwoRenames";
                         });

// A crash at call k: that call and every later one fail, undo included.
TEST_P(ForcedReplaceTest, CrashAtAnyCallLeavesACommittedCheckpoint) {
  const bool exchange = GetParam();
  const int calls = CallsOfAForcedSave(exchange);
  ASSERT_GT(calls, 5);
  int gaps = 0;
  for (int k = 1; k <= calls; ++k) {
    SCOPED_TRACE("crash at call " + std::to_string(k));
    Fixture fixture(exchange);
    std::atomic<int> seen{0};
    fixture.storage->FailOn([&](std::string_view op, const std::string& path) {
      if (++seen < k) return Status::Ok();
      return StorageError("crashed before " + std::string(op) + " " + path);
    });
    const Status status = SaveVersion(fixture.storage, kPath, 2);
    const std::optional<float> version = CommittedVersion(fixture.inner, kPath);
    if (status.ok()) EXPECT_EQ(version, 2.f);
    if (exchange) {
      EXPECT_TRUE(version == 1.f || version == 2.f) << status.ToString();
    } else if (!version) {
      // The fallback's window between its two renames: the previous
      // checkpoint is whole beside the path.
      ++gaps;
      EXPECT_EQ(CommittedVersion(fixture.inner, kOld), 1.f) << status.ToString();
    }
    // The process restarts: its next save succeeds.
    fixture.storage->FailOn(nullptr);
    SK_EXPECT_OK(SaveVersion(fixture.storage, kPath, 3));
    EXPECT_EQ(CommittedVersion(fixture.inner, kPath), 3.f);
  }
  if (!exchange) EXPECT_EQ(gaps, 1) << "the fallback's window is one call wide";
}

// Only call k fails; undoing works: a failed save leaves the previous
// checkpoint, and reports no unknown state.
TEST_P(ForcedReplaceTest, FailureAtAnyCallLeavesTheOldOrTheNewCheckpoint) {
  const bool exchange = GetParam();
  const int calls = CallsOfAForcedSave(exchange);
  for (int k = 1; k <= calls; ++k) {
    SCOPED_TRACE("failure at call " + std::to_string(k));
    Fixture fixture(exchange);
    std::atomic<int> seen{0};
    std::string failed_op;
    fixture.storage->FailOn([&](std::string_view op, const std::string& path) {
      if (++seen != k) return Status::Ok();
      failed_op = op;
      return StorageError("injected " + std::string(op) + " failure at " + path);
    });
    const Status status = SaveVersion(fixture.storage, kPath, 2);
    EXPECT_NE(status.code(), StatusCode::kCommitStateUnknown) << status.ToString();
    EXPECT_EQ(CommittedVersion(fixture.inner, kPath), status.ok() ? 2.f : 1.f)
        << status.ToString();
    if (!status.ok()) {
      // A failed save leaves nothing of its own behind (unless removing it
      // was the call that failed).
      SK_ASSERT_OK_AND_ASSIGN(bool tmp_left, fixture.inner->Exists(kTmp));
      if (tmp_left) EXPECT_TRUE(failed_op == "DeleteRecursive" || failed_op == "DeleteFile");
    }
  }
}

TEST_P(ForcedReplaceTest, FailedUndoIsReportedAsCommitStateUnknown) {
  const bool exchange = GetParam();
  Fixture fixture(exchange);
  std::atomic<int> exchanges{0};
  fixture.storage->FailOn([&](std::string_view op, const std::string& path) {
    // Not durable: the parent's fsync after the swap fails...
    if (op == "SyncDir" && path == "r") return StorageError("injected fsync failure");
    // ... and so does putting the previous checkpoint back.
    if (exchange && op == "Exchange" && ++exchanges == 2) {
      return StorageError("injected failure swapping back");
    }
    if (!exchange && op == "Rename" && path == kOld) {
      return StorageError("injected failure renaming back");
    }
    return Status::Ok();
  });
  const Status status = SaveVersion(fixture.storage, kPath, 2);
  EXPECT_EQ(status.code(), StatusCode::kCommitStateUnknown) << status.ToString();
  EXPECT_NE(status.message().find("injected fsync failure"), std::string::npos)
      << status.ToString();
  EXPECT_NE(status.message().find(exchange ? "swapping back" : "renaming back"),
            std::string::npos)
      << status.ToString();
  // Nothing is lost, and the message says where each checkpoint is.
  if (exchange) {
    EXPECT_EQ(CommittedVersion(fixture.inner, kPath), 2.f);
    EXPECT_EQ(CommittedVersion(fixture.inner, kTmp), 1.f);
    EXPECT_NE(status.message().find(std::string("previous one is at ") + kTmp),
              std::string::npos)
        << status.ToString();
  } else {
    EXPECT_EQ(CommittedVersion(fixture.inner, kOld), 1.f);
    EXPECT_NE(status.message().find(std::string("whole at ") + kOld), std::string::npos)
        << status.ToString();
  }
}

// On a real file system that supports it, a forced save swaps in one step:
// no second rename, no <path>.shardkeep-old.
TEST(ForcedReplaceFileTest, ReplacesByExchangeWhereTheFileSystemCan) {
  const std::string root = MakeTempDir();
  const std::string path = root + "/ckpt";
  auto storage = std::make_shared<FaultInjectionStorage>(NewFileStorage());
  SK_ASSERT_OK(SaveVersion(storage, path, 1));
  SK_ASSERT_OK(SaveVersion(storage, path, 2));
  const int renames = storage->Count("Rename");
  EXPECT_EQ(CommittedVersion(storage, path), 2.f);
  SK_ASSERT_OK_AND_ASSIGN(bool old_left, storage->Exists(path + ".shardkeep-old"));
  EXPECT_FALSE(old_left);
  SK_ASSERT_OK_AND_ASSIGN(bool tmp_left, storage->Exists(path + ".shardkeep-tmp"));
  EXPECT_FALSE(tmp_left);
  // The first save renamed; the second exchanged, unless this file system
  // cannot (then it fell back to two renames).
  EXPECT_EQ(storage->Count("Exchange"), 1);
  EXPECT_TRUE(renames == 1 || renames == 3) << renames;
  SK_EXPECT_OK(storage->DeleteRecursive(root));
}

// A folder being discarded may hold a whole checkpoint (the previous one
// after a replacement, a stale temporary folder). Its record goes first, so
// a deletion cut short (a crash inside DeleteRecursive, simulated here by
// its failure) never leaves a record that decodes over missing data files.
TEST(DiscardFolderTest, TheCommitRecordGoesFirst) {
  Fixture fixture(true);
  fixture.storage->FailOn([](std::string_view op, const std::string&) {
    return op == "DeleteRecursive" ? StorageError("crashed while deleting") : Status::Ok();
  });
  EXPECT_FALSE(internal::DiscardFolder(*fixture.storage, kPath).ok());
  SK_ASSERT_OK_AND_ASSIGN(bool recorded,
                          fixture.inner->Exists(std::string(kPath) + "/_SHARDKEEP"));
  EXPECT_FALSE(recorded);
  EXPECT_EQ(CheckpointReader::Open(fixture.inner, kPath).status().code(),
            StatusCode::kNotFound);
  fixture.storage->FailOn(nullptr);
  SK_EXPECT_OK(internal::DiscardFolder(*fixture.storage, kPath));
  SK_ASSERT_OK_AND_ASSIGN(bool left, fixture.inner->Exists(kPath));
  EXPECT_FALSE(left);
}

}  // namespace
}  // namespace shardkeep
