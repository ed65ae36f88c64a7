#include "engine/lease.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "engine/make_visible.h"
#include "format/commit_record.h"
#include "shardkeep/checkpoint_root.h"
#include "testing/status_matchers.h"
#include "testing/storage_conformance.h"
#include "testing/test_files.h"

namespace shardkeep::internal {
namespace {

constexpr int64_t kSecond = 1'000'000'000;

format::LeaseRecord OnAnotherMachine(int64_t renewed_ns) {
  format::LeaseRecord lease;
  lease.owner = "0123456789abcdef";
  lease.host = "elsewhere";
  lease.boot_id = "another-boot";
  lease.pid_namespace = "pid:[1]";
  lease.pid = 42;
  lease.renewed_ns = renewed_ns;
  lease.duration_s = 30;
  return lease;
}

std::vector<std::string> LeaseFiles(Storage& storage, const std::string& folder) {
  std::vector<std::string> files;
  Result<std::vector<std::string>> names = storage.List(folder);
  if (!names.ok()) return files;
  for (const std::string& name : *names) {
    if (format::LeaseSequenceOf(name)) files.push_back(name);
  }
  return files;
}

// A fast lease, so that renewals happen within a test.
constexpr LeaseTiming kFast{.duration_s = 5, .renew_every_s = 0.02, .clock_allowance_s = 0};

TEST(LeaseFormatTest, RoundTripsAndRefusesWhatIsNotALease) {
  format::LeaseRecord lease = OnAnotherMachine(123);
  lease.sequence = 7;
  lease.pid_start = 99;
  SK_ASSERT_OK_AND_ASSIGN(format::LeaseRecord back,
                          format::DecodeLease(format::EncodeLease(lease), "f"));
  EXPECT_EQ(back.owner, lease.owner);
  EXPECT_EQ(back.sequence, 7u);
  EXPECT_EQ(back.pid_start, 99u);
  EXPECT_EQ(back.renewed_ns, 123);
  EXPECT_EQ(format::DecodeLease("", "f").status().code(), StatusCode::kCorruption);
  EXPECT_EQ(format::DecodeLease(R"({"format":"shardkeep-lease","version":1})", "f")
                .status()
                .code(),
            StatusCode::kCorruption);
  EXPECT_EQ(format::LeaseSequenceOf(format::LeaseFileName(0x1f)), 0x1fu);
  EXPECT_EQ(format::LeaseSequenceOf(".shardkeep-lease-1f"), std::nullopt);
  EXPECT_EQ(format::LeaseSequenceOf(".shardkeep-lease-000000000000001F"), std::nullopt);
}

// The format is stable: a lease written by this version (the golden file)
// is read the same by every later one.
TEST(LeaseFormatTest, ReadsTheGoldenLease) {
  const std::string golden = testdata::Read("format/lease-v1.json");
  ASSERT_FALSE(golden.empty());
  SK_ASSERT_OK_AND_ASSIGN(format::LeaseRecord lease, format::DecodeLease(golden, "golden"));
  EXPECT_EQ(lease.owner, "5f0c2a9e81d34b7a");
  EXPECT_EQ(lease.host, "trainer-0");
  EXPECT_EQ(lease.pid, 4242);
  EXPECT_EQ(lease.pid_start, 1234567u);
  EXPECT_EQ(lease.sequence, 3u);
  EXPECT_EQ(lease.renewed_ns, 1796000000000000000);
  EXPECT_EQ(lease.duration_s, 30.0);
  EXPECT_EQ(format::EncodeLease(lease), golden);
}

// Another machine's lease: judged by the clock, with the allowance for
// clocks that disagree, so a clock a minute ahead does not expire it.
TEST(JudgeLeaseTest, AnotherMachinesLeaseExpiresAfterItsDurationAndTheAllowance) {
  const format::LeaseRecord judge = ThisProcess();
  const int64_t renewed = 1000 * kSecond;
  const format::LeaseRecord lease = OnAnotherMachine(renewed);
  EXPECT_EQ(JudgeLease(lease, renewed + 60 * kSecond, judge, 120).verdict,
            LeaseVerdict::kLive);
  EXPECT_EQ(JudgeLease(lease, renewed + 149 * kSecond, judge, 120).verdict,
            LeaseVerdict::kLive);
  const LeaseView expired = JudgeLease(lease, renewed + 151 * kSecond, judge, 120);
  EXPECT_EQ(expired.verdict, LeaseVerdict::kExpired);
  EXPECT_NE(expired.description.find("pid 42 on host elsewhere"), std::string::npos)
      << expired.description;
  // A judge whose clock is behind the holder's sees a lease from the future:
  // live.
  EXPECT_EQ(JudgeLease(lease, renewed - 300 * kSecond, judge, 120).verdict,
            LeaseVerdict::kLive);
}

// On the holder's own machine no clock is needed: the lease lives exactly
// as long as its holder's process (and a reused pid is not the holder).
TEST(JudgeLeaseTest, OnThisMachineALeaseDiesWithItsProcess) {
  const format::LeaseRecord judge = ThisProcess();
  ASSERT_FALSE(judge.boot_id.empty());
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  format::LeaseRecord lease = judge;
  lease.owner = "fedcba9876543210";
  lease.pid = child;
  lease.renewed_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  lease.duration_s = 3600;
  const LeaseView gone = JudgeLease(lease, lease.renewed_ns, judge, 120);
  EXPECT_EQ(gone.verdict, LeaseVerdict::kExpired) << gone.description;
  EXPECT_NE(gone.description.find("which is gone"), std::string::npos);

  format::LeaseRecord parent = lease;
  parent.pid = getppid();
  parent.pid_start = 1;  // not the start time of the process running there
  EXPECT_EQ(JudgeLease(parent, lease.renewed_ns, judge, 120).verdict,
            LeaseVerdict::kExpired);
}

class LeaseHolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    storage_ = NewFileStorage();
    folder_ = MakeTempDir() + "/ckpt.shardkeep-tmp";
    SK_ASSERT_OK(storage_->CreateDir(folder_));
  }
  std::shared_ptr<Storage> storage_;
  std::string folder_;
};

TEST_F(LeaseHolderTest, RenewsByReplacingItsOneFileAndDiesWithItsHolder) {
  SK_ASSERT_OK_AND_ASSIGN(auto holder, LeaseHolder::Acquire(*storage_, folder_, kFast));
  SK_ASSERT_OK_AND_ASSIGN(LeaseView view, ReadLease(*storage_, folder_));
  EXPECT_EQ(view.verdict, LeaseVerdict::kLive) << view.description;
  for (int i = 0; i < 500 && ReadLease(*storage_, folder_)->newest->sequence < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(ReadLease(*storage_, folder_)->newest->sequence, 3u);
  EXPECT_LE(LeaseFiles(*storage_, folder_).size(), 2u);  // at most mid-renewal
  SK_EXPECT_OK(holder->Check());
  holder.reset();  // a save that ended without releasing (its deletion failed)
  SK_ASSERT_OK_AND_ASSIGN(view, ReadLease(*storage_, folder_));
  EXPECT_EQ(view.verdict, LeaseVerdict::kExpired) << view.description;
}

TEST_F(LeaseHolderTest, ReleaseDeletesTheLease) {
  SK_ASSERT_OK_AND_ASSIGN(auto holder, LeaseHolder::Acquire(*storage_, folder_, kFast));
  holder->Release(folder_);
  EXPECT_EQ(LeaseFiles(*storage_, folder_), std::vector<std::string>{});
  EXPECT_EQ(ReadLease(*storage_, folder_)->verdict, LeaseVerdict::kNone);
}

TEST_F(LeaseHolderTest, ALeaseRemovedOrTakenOverIsLost) {
  SK_ASSERT_OK_AND_ASSIGN(auto holder, LeaseHolder::Acquire(*storage_, folder_));
  for (const std::string& name : LeaseFiles(*storage_, folder_)) {
    SK_ASSERT_OK(storage_->DeleteFile(folder_ + "/" + name));
  }
  Status lost = holder->Check();
  EXPECT_EQ(lost.code(), StatusCode::kLeaseLost);
  EXPECT_NE(lost.message().find("was removed"), std::string::npos) << lost.ToString();

  SK_ASSERT_OK_AND_ASSIGN(auto second, LeaseHolder::Acquire(*storage_, folder_));
  format::LeaseRecord other = OnAnotherMachine(0);
  other.sequence = 1000;
  SK_ASSERT_OK(storage_->WriteAll(folder_ + "/" + format::LeaseFileName(1000),
                                  format::EncodeLease(other), false));
  lost = second->Check();
  EXPECT_EQ(lost.code(), StatusCode::kLeaseLost);
  EXPECT_NE(lost.message().find("taken over by pid 42 on host elsewhere"), std::string::npos)
      << lost.ToString();
}

// A crash while a renewal writes its file leaves it unreadable beside the
// previous one, which still decides.
TEST_F(LeaseHolderTest, AnUnreadableNewestLeaseFileIsSkipped) {
  SK_ASSERT_OK_AND_ASSIGN(auto holder, LeaseHolder::Acquire(*storage_, folder_));
  SK_ASSERT_OK(storage_->WriteAll(folder_ + "/" + format::LeaseFileName(9), "{\"for", false));
  SK_ASSERT_OK_AND_ASSIGN(LeaseView view, ReadLease(*storage_, folder_));
  EXPECT_EQ(view.verdict, LeaseVerdict::kLive);
  EXPECT_EQ(view.newest->sequence, 0u);
  SK_EXPECT_OK(holder->Check());
}

// Every collector keeps a folder a live lease covers and removes it once
// the lease is gone.
TEST_F(LeaseHolderTest, CollectorsKeepALeasedTemporaryFolder) {
  const std::string root = folder_.substr(0, folder_.rfind('/'));
  SK_ASSERT_OK_AND_ASSIGN(auto holder, LeaseHolder::Acquire(*storage_, folder_));
  const Status kept = RemoveLeftover(*storage_, folder_);
  EXPECT_EQ(kept.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(kept.message().find("a save in flight holds its lease"), std::string::npos)
      << kept.ToString();
  SK_ASSERT_OK_AND_ASSIGN(std::vector<RootEntry> entries, ListCheckpoints(*storage_, root));
  std::vector<CollectedEntry> collected =
      CollectLeftovers(*storage_, root, entries, CollectOptions());
  ASSERT_EQ(collected.size(), 1u);
  EXPECT_EQ(collected[0].outcome, CollectedEntry::Outcome::kInUse);
  EXPECT_TRUE(*storage_->Exists(folder_));

  holder.reset();
  collected = CollectLeftovers(*storage_, root, entries, CollectOptions());
  ASSERT_EQ(collected.size(), 1u);
  EXPECT_EQ(collected[0].outcome, CollectedEntry::Outcome::kRemoved)
      << collected[0].problem.ToString();
  EXPECT_FALSE(*storage_->Exists(folder_));
}

// On an object store: the generations of saves in flight stay, whatever
// else removes the folder they are in (gc, retention deleting the
// checkpoint at that path).
TEST(ObjectStoreLeaseTest, GenerationsInFlightSurviveCollectionAndDeletion) {
  auto storage = NewMemoryStorage(MemoryStorageMode::kObjectStore);
  const std::string path = "run/0001";
  const std::string dead = path + "/" + NewGenerationName();
  const std::string alive = path + "/" + NewGenerationName();
  {
    SK_ASSERT_OK_AND_ASSIGN(auto gone, LeaseHolder::Acquire(*storage, dead));
    SK_ASSERT_OK(storage->WriteAll(dead + "/state/data/p0-0.bin", "x", false));
  }
  SK_ASSERT_OK_AND_ASSIGN(auto holder, LeaseHolder::Acquire(*storage, alive));
  SK_ASSERT_OK(storage->WriteAll(alive + "/state/data/p0-0.bin", "y", false));

  const Status kept = RemoveLeftover(*storage, path);
  EXPECT_EQ(kept.code(), StatusCode::kInvalidArgument) << kept.ToString();
  EXPECT_FALSE(*storage->Exists(dead));
  EXPECT_TRUE(*storage->Exists(alive + "/state/data/p0-0.bin"));

  // A committed checkpoint at the path, deleted while a forced save to the
  // same path is in flight.
  format::CommitRecord record;
  record.data_folder = dead.substr(path.size() + 1);
  SK_ASSERT_OK(storage->WriteIfAbsent(path + "/_SHARDKEEP", format::EncodeCommitRecord(record)));
  SK_ASSERT_OK(DeleteCheckpoint(*storage, path));
  EXPECT_FALSE(*storage->Exists(path + "/_SHARDKEEP"));
  EXPECT_TRUE(*storage->Exists(alive + "/state/data/p0-0.bin"));

  holder->Release(alive);
  SK_ASSERT_OK(RemoveLeftover(*storage, path));
  EXPECT_FALSE(*storage->Exists(path));
}

// A generation the commit record names is never deleted as a leftover,
// even once its lease is gone: the record is read after the lease.
TEST(ObjectStoreLeaseTest, TheCommittedGenerationIsNeverDiscarded) {
  auto storage = NewMemoryStorage(MemoryStorageMode::kObjectStore);
  const std::string path = "run/0001";
  const std::string generation = NewGenerationName();
  SK_ASSERT_OK(storage->WriteAll(path + "/" + generation + "/state/meta.json", "{}", false));
  format::CommitRecord record;
  record.data_folder = generation;
  SK_ASSERT_OK(storage->WriteIfAbsent(path + "/_SHARDKEEP", format::EncodeCommitRecord(record)));
  const Status kept = DiscardGeneration(*storage, path, generation);
  EXPECT_EQ(kept.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(kept.message().find("holds the committed checkpoint"), std::string::npos);
  EXPECT_TRUE(*storage->Exists(path + "/" + generation + "/state/meta.json"));
}

// The check before the commit: files removed from the folder (by a
// collector that took it for a leftover) fail the commit with LeaseLost
// naming them, and nothing is committed.
TEST(CommitTargetLeaseTest, ACommitWhoseFolderLostFilesFails) {
  for (MemoryStorageMode mode : {MemoryStorageMode::kFileSystem, MemoryStorageMode::kObjectStore}) {
    auto storage = NewMemoryStorage(mode);
    CommitTarget target(*storage, "run/0001", "save of run/0001");
    SK_ASSERT_OK(target.Prepare(false, "force it"));
    const std::vector<std::string> files = {"state/meta.json", "state/index/p0.idx"};
    for (const std::string& file : files) {
      SK_ASSERT_OK(storage->WriteAll(target.folder() + "/" + file, "x", true));
    }
    SK_ASSERT_OK(storage->DeleteFile(target.folder() + "/state/index/p0.idx"));
    std::vector<std::string> committed = files;
    if (target.renames()) {
      SK_ASSERT_OK(storage->WriteAll(target.folder() + "/_SHARDKEEP", "{}", true));
      committed.push_back("_SHARDKEEP");
    }
    format::CommitRecord record;
    record.data_folder = target.data_folder();
    const Status status = target.Commit(format::EncodeCommitRecord(record), false, committed);
    EXPECT_EQ(status.code(), StatusCode::kLeaseLost) << status.ToString();
    EXPECT_NE(status.message().find("state/index/p0.idx"), std::string::npos)
        << status.ToString();
    EXPECT_FALSE(*storage->Exists("run/0001/_SHARDKEEP"));
  }
}

}  // namespace
}  // namespace shardkeep::internal
