#include "shardkeep/checkpoint_root.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "format/commit_record.h"
#include "shardkeep/checkpoint.h"
#include "storage/fault_injection.h"
#include "testing/status_matchers.h"
#include "testing/storage_conformance.h"
#include "testing/versions.h"

namespace shardkeep {
namespace {

std::string Record(int64_t step, int version = format::kFormatVersion) {
  format::CommitRecord record;
  record.step = step;
  record.version = version;
  record.metrics = {{"loss", 0.5}};
  return format::EncodeCommitRecord(record);
}

// Runs every test on the memory and the file backend: the manager must
// behave alike on both.
class CheckpointRootTest : public ::testing::TestWithParam<StorageTestBackend> {
 protected:
  void SetUp() override {
    StorageLocation location = GetParam().make();
    storage_ = location.storage;
    base_ = location.path;
    root_ = base_ + "/run";
  }
  void TearDown() override { SK_EXPECT_OK(storage_->DeleteRecursive(base_)); }
  void Commit(const std::string& name, const std::string& record) {
    SK_ASSERT_OK(storage_->CreateDir(root_ + "/" + name + "/state/data"));
    SK_ASSERT_OK(storage_->WriteAll(root_ + "/" + name + "/state/data/p0-0.bin",
                                    "bytes", false));
    SK_ASSERT_OK(storage_->WriteAll(root_ + "/" + name + "/_SHARDKEEP", record,
                                    false));
  }
  bool Exists(const std::string& name) {
    Result<bool> exists = storage_->Exists(root_ + "/" + name);
    EXPECT_TRUE(exists.ok()) << exists.status().ToString();
    return exists.ok() && *exists;
  }

  std::shared_ptr<Storage> storage_;
  std::string base_;
  std::string root_;
};

TEST_P(CheckpointRootTest, ClassifiesEveryEntry) {
  Commit("0001", Record(1));
  Commit("0002", Record(2, format::kFormatVersion + 1));  // from a newer shardkeep
  Commit("0003", "{\"format\": \"shardkeep\", \"vers");    // cut short
  Commit("0004.shardkeep-tmp", Record(4));  // complete, but never renamed
  SK_ASSERT_OK(storage_->CreateDir(root_ + "/0005.shardkeep-deleting"));
  SK_ASSERT_OK(storage_->CreateDir(root_ + "/0001.shardkeep-old"));
  // Forced replacements cut short between their renames: nothing, or no
  // checkpoint this build reads, at the base.
  SK_ASSERT_OK(storage_->CreateDir(root_ + "/0002.shardkeep-old"));
  SK_ASSERT_OK(storage_->CreateDir(root_ + "/0007.shardkeep-old"));
  SK_ASSERT_OK(storage_->CreateDir(root_ + "/0006/state"));  // being copied in
  SK_ASSERT_OK(storage_->WriteAll(root_ + "/notes", "a file", false));

  SK_ASSERT_OK_AND_ASSIGN(std::vector<RootEntry> entries,
                          ListCheckpoints(*storage_, root_));
  std::vector<std::string> seen;
  for (const RootEntry& e : entries) {
    seen.push_back(e.name + ":" + EntryStateName(e.state));
  }
  EXPECT_EQ(seen, (std::vector<std::string>{
                      "0001:committed", "0001.shardkeep-old:replaced",
                      "0002:rejected", "0002.shardkeep-old:only-copy",
                      "0003:rejected", "0004.shardkeep-tmp:temporary",
                      "0005.shardkeep-deleting:being-deleted", "0006:other",
                      "0007.shardkeep-old:only-copy", "notes:other"}));
  EXPECT_EQ(entries[0].step, 1);
  EXPECT_EQ(entries[0].commit_json, Record(1));
  EXPECT_EQ(entries[2].problem.code(), StatusCode::kIncompatible);
  EXPECT_NE(entries[2].problem.message().find("0002/_SHARDKEEP"), std::string::npos)
      << entries[2].problem.message();
  EXPECT_EQ(entries[4].problem.code(), StatusCode::kCorruption);
  for (const RootEntry& e : entries) {
    EXPECT_EQ(IsLeftover(e.state),
              e.state == EntryState::kReplaced || e.state == EntryState::kTemporary ||
                  e.state == EntryState::kBeingDeleted)
        << e.name;
  }
}

TEST_P(CheckpointRootTest, AMissingRootHoldsNothing) {
  SK_ASSERT_OK_AND_ASSIGN(std::vector<RootEntry> entries,
                          ListCheckpoints(*storage_, root_ + "/nowhere"));
  EXPECT_TRUE(entries.empty());
}

TEST_P(CheckpointRootTest, ReadCommitRecordRefusesWhatTheReaderRefuses) {
  Commit("0001", Record(1));
  Commit("0002", Record(2, format::kFormatVersion + 1));
  SK_ASSERT_OK_AND_ASSIGN(std::string record,
                          ReadCommitRecord(*storage_, root_ + "/0001"));
  EXPECT_EQ(record, Record(1));
  EXPECT_EQ(ReadCommitRecord(*storage_, root_ + "/0002").status().code(),
            StatusCode::kIncompatible);
  const Status missing = ReadCommitRecord(*storage_, root_ + "/0003").status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("0003"), std::string::npos);
}

TEST_P(CheckpointRootTest, DeleteRemovesTheCheckpointAndAnEarlierLeftover) {
  Commit("0001", Record(1));
  // An earlier deletion of the same name was cut short.
  SK_ASSERT_OK(storage_->CreateDir(root_ + "/0001.shardkeep-deleting"));
  SK_ASSERT_OK(storage_->WriteAll(root_ + "/0001.shardkeep-deleting/x", "x", false));
  SK_ASSERT_OK(DeleteCheckpoint(*storage_, root_ + "/0001"));
  EXPECT_FALSE(Exists("0001"));
  EXPECT_FALSE(Exists("0001.shardkeep-deleting"));
  const Status again = DeleteCheckpoint(*storage_, root_ + "/0001");
  EXPECT_EQ(again.code(), StatusCode::kNotFound);
  EXPECT_NE(again.message().find("0001"), std::string::npos);
}

TEST_P(CheckpointRootTest, RemoveLeftoverOnlyRemovesLeftovers) {
  Commit("0001", Record(1));
  Commit("0002.shardkeep-tmp", Record(2));
  SK_ASSERT_OK(RemoveLeftover(*storage_, root_ + "/0002.shardkeep-tmp"));
  EXPECT_FALSE(Exists("0002.shardkeep-tmp"));
  SK_ASSERT_OK(RemoveLeftover(*storage_, root_ + "/0003.shardkeep-old"));  // absent
  const Status refused = RemoveLeftover(*storage_, root_ + "/0001");
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Exists("0001"));
}

TEST_P(CheckpointRootTest, RemoveLeftoverRefusesAnOnlyCopy) {
  Commit("0002.shardkeep-old", Record(2));
  const Status refused = RemoveLeftover(*storage_, root_ + "/0002.shardkeep-old");
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("only copy of " + root_ + "/0002"), std::string::npos)
      << refused.ToString();
  EXPECT_NE(refused.message().find("rename " + root_ + "/0002.shardkeep-old back to " +
                                   root_ + "/0002"),
            std::string::npos)
      << refused.ToString();
  EXPECT_TRUE(Exists("0002.shardkeep-old/_SHARDKEEP"));
  // Once its replacement is committed, it is a leftover like any other.
  Commit("0002", Record(2));
  SK_ASSERT_OK(RemoveLeftover(*storage_, root_ + "/0002.shardkeep-old"));
  EXPECT_FALSE(Exists("0002.shardkeep-old"));
}

TEST_P(CheckpointRootTest, CollectLeftoversRemovesLeftoversOnly) {
  Commit("0001", Record(1));
  Commit("0001.shardkeep-old", Record(1));
  Commit("0002.shardkeep-old", Record(2));  // only copy
  Commit("0003", Record(3, format::kFormatVersion + 1));
  Commit("0004.shardkeep-tmp", Record(4));
  SK_ASSERT_OK(storage_->CreateDir(root_ + "/0005.shardkeep-deleting"));
  SK_ASSERT_OK(storage_->CreateDir(root_ + "/notes"));
  using Outcome = CollectedEntry::Outcome;
  auto collect = [&](const CollectOptions& options) {
    Result<std::vector<RootEntry>> entries = ListCheckpoints(*storage_, root_);
    EXPECT_TRUE(entries.ok()) << entries.status().ToString();
    std::vector<std::string> report;
    for (const CollectedEntry& c : CollectLeftovers(*storage_, root_, *entries, options)) {
      report.push_back(c.name + ":" + std::to_string(static_cast<int>(c.outcome)));
    }
    return report;
  };
  auto line = [](const std::string& name, Outcome outcome) {
    return name + ":" + std::to_string(static_cast<int>(outcome));
  };

  // An hour's minimum age: ages come from the caller, unknown ones keep.
  CollectOptions aged;
  aged.min_age_s = 3600;
  aged.modified_ns = [](const std::string& name) -> std::optional<int64_t> {
    if (name == "0004.shardkeep-tmp") return std::nullopt;
    if (name == "0001.shardkeep-old") return 0;  // 1970: old enough
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  aged.dry_run = true;
  const std::vector<std::string> expected_aged = {
      line("0001.shardkeep-old", Outcome::kRemoved),
      line("0002.shardkeep-old", Outcome::kNotLeftover),
      line("0003", Outcome::kNotLeftover),
      line("0004.shardkeep-tmp", Outcome::kAgeUnknown),
      line("0005.shardkeep-deleting", Outcome::kTooRecent)};
  EXPECT_EQ(collect(aged), expected_aged);
  EXPECT_TRUE(Exists("0001.shardkeep-old"));  // a dry run
  aged.dry_run = false;
  EXPECT_EQ(collect(aged), expected_aged);
  EXPECT_FALSE(Exists("0001.shardkeep-old"));
  EXPECT_TRUE(Exists("0004.shardkeep-tmp"));

  // No minimum age: every leftover goes, never a checkpoint or an only copy.
  EXPECT_EQ(collect(CollectOptions()),
            (std::vector<std::string>{line("0002.shardkeep-old", Outcome::kNotLeftover),
                                      line("0003", Outcome::kNotLeftover),
                                      line("0004.shardkeep-tmp", Outcome::kRemoved),
                                      line("0005.shardkeep-deleting", Outcome::kRemoved)}));
  EXPECT_TRUE(Exists("0001/_SHARDKEEP"));
  EXPECT_TRUE(Exists("0002.shardkeep-old/_SHARDKEEP"));
  EXPECT_TRUE(Exists("0003/_SHARDKEEP"));
  EXPECT_TRUE(Exists("notes"));
  EXPECT_FALSE(Exists("0004.shardkeep-tmp"));
  EXPECT_FALSE(Exists("0005.shardkeep-deleting"));
}

// A folder holding only generation folders is removed whole: not left
// behind empty, where a listing would still show it.
TEST_P(CheckpointRootTest, RemoveLeftoverOfGenerationsLeavesNoEmptyFolder) {
  const std::string generation = root_ + "/0005/.shardkeep-g0123456789abcdef/state";
  SK_ASSERT_OK(storage_->CreateDir(generation));
  SK_ASSERT_OK(storage_->WriteAll(generation + "/meta.json", "{}", false));
  SK_ASSERT_OK(RemoveLeftover(*storage_, root_ + "/0005"));
  EXPECT_FALSE(Exists("0005"));
}

TEST_P(CheckpointRootTest, AnUnreadableRecordFailsTheListingNamingIt) {
  Commit("0001", Record(1));
  auto faulty = std::make_shared<FaultInjectionStorage>(storage_);
  faulty->FailOn([](std::string_view op, const std::string& path) {
    return op == "ReadAll" ? StorageError("read " + path + ": I/O error") : Status::Ok();
  });
  const Status status = ListCheckpoints(*faulty, root_).status();
  EXPECT_EQ(status.code(), StatusCode::kStorage);
  EXPECT_NE(status.message().find("listing checkpoints under " + root_), std::string::npos);
  EXPECT_NE(status.message().find("0001/_SHARDKEEP: I/O error"), std::string::npos)
      << status.message();
}

// On an object store, saves leave generation folders inside the step's
// folder, and nothing can be renamed.
class ObjectStoreRootTest : public ::testing::Test {
 protected:
  static constexpr char kRoot[] = "bucket/run";
  static constexpr char kGeneration[] = ".shardkeep-g0123456789abcdef";
  static constexpr char kOtherGeneration[] = ".shardkeep-gfedcba9876543210";

  // A step committed the way object-store saves commit.
  void CommitStep(const std::string& name) {
    format::CommitRecord record;
    record.step = std::stoll(name);
    record.data_folder = kGeneration;
    Leave(name + "/" + kGeneration);
    SK_ASSERT_OK(storage_->WriteIfAbsent(Path(name) + "/_SHARDKEEP",
                                         format::EncodeCommitRecord(record)));
  }
  // Files of a generation that did not commit.
  void Leave(const std::string& folder) {
    SK_ASSERT_OK(storage_->WriteAll(Path(folder) + "/state/data/p0-0.bin", "x", false));
  }
  std::string Path(const std::string& name) const { return std::string(kRoot) + "/" + name; }
  bool Exists(const std::string& name) {
    Result<bool> exists = storage_->Exists(Path(name));
    EXPECT_TRUE(exists.ok()) << exists.status().ToString();
    return exists.ok() && *exists;
  }
  std::vector<std::string> States() {
    Result<std::vector<RootEntry>> entries = ListCheckpoints(*storage_, kRoot);
    EXPECT_TRUE(entries.ok()) << entries.status().ToString();
    std::vector<std::string> seen;
    for (const RootEntry& e : entries.ok() ? *entries : std::vector<RootEntry>()) {
      seen.push_back(e.name + ":" + EntryStateName(e.state));
    }
    return seen;
  }

  std::shared_ptr<Storage> storage_ = NewMemoryStorage(MemoryStorageMode::kObjectStore);
};

TEST_F(ObjectStoreRootTest, AFolderOfGenerationsWithoutARecordIsUnfinished) {
  CommitStep("0001");
  Leave(std::string("0001/") + kOtherGeneration);  // a failed forced save
  Leave(std::string("0002/") + kGeneration);       // a failed save
  Leave(std::string("0002/") + kOtherGeneration);
  Leave(std::string("0003/") + kGeneration);  // a generation, and someone's data
  SK_ASSERT_OK(storage_->WriteAll(Path("0003/notes"), "mine", false));
  SK_ASSERT_OK(storage_->WriteAll(Path("0004/state/meta.json"), "{}", false));
  EXPECT_EQ(States(), (std::vector<std::string>{"0001:committed", "0002:unfinished",
                                                "0003:other", "0004:other"}));
}

TEST_F(ObjectStoreRootTest, RemoveLeftoverRemovesOnlyUnfinishedSaves) {
  CommitStep("0001");
  Leave(std::string("0002/") + kGeneration);
  Leave(std::string("0002/") + kOtherGeneration);
  Leave(std::string("0003/") + kGeneration);
  SK_ASSERT_OK(storage_->WriteAll(Path("0003/notes"), "mine", false));

  SK_ASSERT_OK(RemoveLeftover(*storage_, Path("0002")));
  EXPECT_FALSE(Exists("0002"));
  SK_ASSERT_OK(RemoveLeftover(*storage_, Path("0002")));  // absent: done already

  const Status foreign = RemoveLeftover(*storage_, Path("0003"));
  EXPECT_EQ(foreign.code(), StatusCode::kInvalidArgument) << foreign.ToString();
  EXPECT_NE(foreign.message().find("notes"), std::string::npos) << foreign.ToString();
  EXPECT_TRUE(Exists(std::string("0003/") + kGeneration));

  const Status committed = RemoveLeftover(*storage_, Path("0001"));
  EXPECT_EQ(committed.code(), StatusCode::kInvalidArgument) << committed.ToString();
  EXPECT_EQ(States(), (std::vector<std::string>{"0001:committed", "0003:other"}));
}

TEST_F(ObjectStoreRootTest, DeleteRemovesTheRecordFirst) {
  CommitStep("0001");
  CommitStep("0002");
  SK_ASSERT_OK(DeleteCheckpoint(*storage_, Path("0001")));
  EXPECT_FALSE(Exists("0001"));
  EXPECT_EQ(DeleteCheckpoint(*storage_, Path("0001")).code(), StatusCode::kNotFound);

  // A deletion cut short after the record: what is left is unfinished, and
  // the manager's cleanup removes it.
  auto faulty = std::make_shared<FaultInjectionStorage>(storage_);
  faulty->FailOn([](std::string_view op, const std::string& path) {
    return op == "DeleteRecursive" ? StorageError("crashed deleting " + path) : Status::Ok();
  });
  EXPECT_EQ(DeleteCheckpoint(*faulty, Path("0002")).code(), StatusCode::kStorage);
  EXPECT_EQ(States(), std::vector<std::string>{"0002:unfinished"});
  SK_ASSERT_OK(RemoveLeftover(*storage_, Path("0002")));
  EXPECT_EQ(States(), std::vector<std::string>{});
}

// A forced save on a file system that cannot exchange (NFS) replaces by
// two renames; killed between them, the previous checkpoint's only copy is
// <path>.shardkeep-old. Nothing may delete it, and renamed back it loads.
TEST(OnlyCopyTest, AForcedSaveKilledBetweenItsRenamesKeepsItsOnlyCopy) {
  const std::string root = MakeTempDir();
  const std::string path = root + "/ckpt";
  auto storage = std::make_shared<FaultInjectionStorage>(NewFileStorage());
  storage->OverrideFeatures({.atomic_rename = true, .durable_sync = true});
  auto save = [&](float version) { return testdata::SaveVersion(storage, path, version); };
  SK_ASSERT_OK(save(1));
  // The kill: every call after the first rename (<path> to <path>.shardkeep-old).
  std::atomic<bool> killed{false};
  storage->FailOn([&](std::string_view op, const std::string& from) {
    if (killed) return StorageError("killed before " + std::string(op) + " " + from);
    if (op == "Rename" && from == path) killed = true;
    return Status::Ok();
  });
  EXPECT_FALSE(save(2).ok());
  ASSERT_TRUE(killed);
  storage->FailOn(nullptr);

  SK_ASSERT_OK_AND_ASSIGN(std::vector<RootEntry> entries, ListCheckpoints(*storage, root));
  std::vector<std::string> seen;
  for (const RootEntry& e : entries) seen.push_back(e.name + ":" + EntryStateName(e.state));
  EXPECT_EQ(seen, (std::vector<std::string>{"ckpt.shardkeep-old:only-copy",
                                            "ckpt.shardkeep-tmp:temporary"}));
  EXPECT_FALSE(IsLeftover(EntryState::kOnlyCopy));

  // Collected with no minimum age (the manager's, `gc --older-than 0`).
  const std::vector<CollectedEntry> collected =
      CollectLeftovers(*storage, root, entries, CollectOptions());
  ASSERT_EQ(collected.size(), 2u);
  EXPECT_EQ(collected[0].outcome, CollectedEntry::Outcome::kNotLeftover);
  EXPECT_NE(collected[0].problem.message().find("rename " + path + ".shardkeep-old back to"),
            std::string::npos)
      << collected[0].problem.ToString();
  EXPECT_EQ(collected[1].outcome, CollectedEntry::Outcome::kRemoved);
  EXPECT_EQ(RemoveLeftover(*storage, path + ".shardkeep-old").code(),
            StatusCode::kInvalidArgument);

  SK_ASSERT_OK(storage->Rename(path + ".shardkeep-old", path));
  EXPECT_EQ(testdata::CommittedVersion(storage, path), 1.f);
  SK_EXPECT_OK(storage->DeleteRecursive(root));
}

INSTANTIATE_TEST_SUITE_P(
    Backends, CheckpointRootTest,
    ::testing::Values(
        StorageTestBackend{"memory",
                           [] { return StorageLocation{NewMemoryStorage(), "root"}; }},
        StorageTestBackend{"file",
                           [] { return StorageLocation{NewFileStorage(), MakeTempDir()}; }}),
    StorageTestBackendName);

}  // namespace
}  // namespace shardkeep
