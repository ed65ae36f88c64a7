// The commit protocol on storage without rename (object stores), on the
// memory backend's object-store mode: saves write a generation folder
// <path>/.shardkeep-g<id>/ and commit by creating <path>/_SHARDKEEP only if
// absent. Single- and multi-process saves, two jobs racing for one path,
// replacement with `force`, leftovers, and a fault at every storage call.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "testing/simulated_group.h"
#include "format/commit_record.h"
#include "shardkeep/checkpoint.h"
#include "storage/fault_injection.h"
#include "testing/payloads.h"
#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

constexpr uint64_t kRows = 8, kCols = 4;
constexpr char kPath[] = "bucket/run/ckpt";
constexpr char kRecord[] = "bucket/run/ckpt/_SHARDKEEP";

std::shared_ptr<Storage> NewObjectStore() {
  return NewMemoryStorage(MemoryStorageMode::kObjectStore);
}

// Version v of the state: "w", kRows x kCols float32 holding v, v+1, ...,
// split in row blocks over the processes; "dataset" bytes naming v.
struct State {
  explicit State(float version) : w(kRows * kCols) {
    for (size_t i = 0; i < w.size(); ++i) w[i] = version + static_cast<float>(i);
  }
  std::vector<float> w;
};

std::string NextOperationId() {
  static std::atomic<int> next{0};
  return "objstore-test-" + std::to_string(next++);
}

SaveRequest RequestOf(int p, int processes, const State& state, bool force,
                      const std::string& operation_id) {
  SaveRequest request;
  request.path = kPath;
  request.force = force;
  request.operation_id = operation_id;
  request.step = 7;
  CheckpointablePayload part =
      testdata::PytreePayload("state", {{"w", "float32", {kRows, kCols}}});
  const uint64_t rows = kRows / processes, row = p * rows;
  part.shards.push_back({0, DType::kFloat32, Box{{row, 0}, {rows, kCols}},
                         reinterpret_cast<const uint8_t*>(state.w.data() + row * kCols)});
  request.parts.push_back(std::move(part));
  request.parts.push_back(
      testdata::BytesPayload("dataset", "position-" + std::to_string(state.w[0])));
  return request;
}

Options TestOptions() {
  Options options;
  // Several chunks and data files per process; one writer thread keeps a
  // process's calls in a fixed order, so "the k-th call" means one thing.
  options.chunk_bytes = kCols * sizeof(float);
  options.data_file_bytes = 2 * options.chunk_bytes;
  options.io_threads = 1;
  options.timeout_s = 20;
  return options;
}

// One job of `processes` simulated processes saving version `version`,
// process p through storage_of(p).
std::vector<Status> SaveJobWith(const std::function<std::shared_ptr<Storage>(int)>& storage_of,
                                int processes, float version, bool force) {
  const State state(version);
  const std::string operation_id = NextOperationId();
  SimulatedGroup group(processes);
  std::vector<Status> statuses(processes);
  std::vector<std::thread> threads;
  for (int p = 0; p < processes; ++p) {
    threads.emplace_back([&, p] {
      statuses[p] = Save(storage_of(p), group.Member(p),
                         RequestOf(p, processes, state, force, operation_id),
                         TestOptions());
    });
  }
  for (std::thread& thread : threads) thread.join();
  return statuses;
}

std::vector<Status> SaveJob(std::shared_ptr<Storage> storage, int processes,
                            float version, bool force = false) {
  return SaveJobWith([&](int) { return storage; }, processes, version, force);
}

Status SaveVersion(std::shared_ptr<Storage> storage, float version, bool force = false) {
  return SaveJob(std::move(storage), 1, version, force)[0];
}

// The version of the whole checkpoint committed at `path`; nullopt when none
// opens or it is not one version's whole data.
std::optional<float> CommittedVersion(const std::shared_ptr<Storage>& storage,
                                      const std::string& path = kPath) {
  auto reader = CheckpointReader::Open(storage, path);
  if (!reader.ok()) return std::nullopt;
  std::vector<float> w(kRows * kCols);
  const Status read = (*reader)->Read(
      "state",
      {{0, DType::kFloat32, Box{{0, 0}, {kRows, kCols}}, reinterpret_cast<uint8_t*>(w.data())}},
      Options());
  if (!read.ok()) return std::nullopt;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] != w[0] + static_cast<float>(i)) return std::nullopt;
  }
  Result<std::string> dataset = (*reader)->ReadValue("dataset");
  if (!dataset.ok() || *dataset != "position-" + std::to_string(w[0])) return std::nullopt;
  return w[0];
}

// The entries directly under the checkpoint's path.
std::vector<std::string> EntriesAtPath(Storage& storage) {
  Result<std::vector<std::string>> names = storage.List(kPath);
  if (names.status().code() == StatusCode::kNotFound) return {};
  EXPECT_TRUE(names.ok()) << names.status().ToString();
  return names.ok() ? *names : std::vector<std::string>();
}

std::vector<std::string> Generations(Storage& storage) {
  std::vector<std::string> generations;
  for (const std::string& name : EntriesAtPath(storage)) {
    if (format::IsGenerationFolderName(name)) generations.push_back(name);
  }
  return generations;
}

// The generation the committed record names ("" when none is committed).
std::string CommittedGeneration(Storage& storage) {
  Result<std::string> bytes = storage.ReadAll(kRecord);
  if (!bytes.ok()) return "";
  Result<format::CommitRecord> record = format::DecodeCommitRecord(*bytes, kRecord);
  EXPECT_TRUE(record.ok()) << record.status().ToString();
  return record.ok() ? record->data_folder.value_or("") : "";
}

TEST(ObjectStoreSaveTest, SingleProcessSaveCommitsIntoAGeneration) {
  auto base = NewObjectStore();
  auto storage = std::make_shared<FaultInjectionStorage>(base);
  SK_ASSERT_OK(SaveVersion(storage, 1));
  EXPECT_EQ(CommittedVersion(base), 1.f);

  const std::string generation = CommittedGeneration(*base);
  ASSERT_TRUE(format::IsGenerationFolderName(generation)) << generation;
  EXPECT_EQ(EntriesAtPath(*base), (std::vector<std::string>{generation, "_SHARDKEEP"}));
  const std::string folder = std::string(kPath) + "/" + generation;
  for (const char* file : {"/state/meta.json", "/state/index/p0.idx",
                           "/state/data/p0-0.bin", "/dataset/value.bin"}) {
    SK_ASSERT_OK_AND_ASSIGN(bool exists, base->Exists(folder + file));
    EXPECT_TRUE(exists) << folder + file;
  }
  // Nothing beside the path: no temporary folder, and nothing renamed.
  SK_ASSERT_OK_AND_ASSIGN(std::vector<std::string> run, base->List("bucket/run"));
  EXPECT_EQ(run, std::vector<std::string>{"ckpt"});
  EXPECT_EQ(storage->Count("Rename"), 0);
  EXPECT_EQ(storage->Count("Exchange"), 0);
  EXPECT_EQ(storage->Count("SyncDir"), 0);
  EXPECT_EQ(storage->Count("WriteIfAbsent"), 1);

  // The S3 backend's features: durable writes, still nothing to sync.
  storage->OverrideFeatures({.atomic_rename = false, .durable_sync = true,
                             .atomic_exchange = false, .conditional_create = true});
  SK_ASSERT_OK(SaveVersion(storage, 2, /*force=*/true));
  EXPECT_EQ(CommittedVersion(base), 2.f);
  EXPECT_EQ(storage->Count("Rename") + storage->Count("Exchange") + storage->Count("SyncDir"),
            0);
}

TEST(ObjectStoreSaveTest, MultiProcessSaveCommitsAndLoads) {
  auto storage = NewObjectStore();
  for (const Status& status : SaveJob(storage, 4, 1)) SK_EXPECT_OK(status);
  EXPECT_EQ(CommittedVersion(storage), 1.f);
  const std::string generation = CommittedGeneration(*storage);
  EXPECT_EQ(Generations(*storage), std::vector<std::string>{generation});
  for (int p = 0; p < 4; ++p) {
    const std::string index = std::string(kPath) + "/" + generation + "/state/index/p" +
                              std::to_string(p) + ".idx";
    SK_ASSERT_OK_AND_ASSIGN(bool exists, storage->Exists(index));
    EXPECT_TRUE(exists) << index;
  }
}

TEST(ObjectStoreSaveTest, ACommittedCheckpointIsRefusedWithoutForce) {
  auto storage = NewObjectStore();
  SK_ASSERT_OK(SaveVersion(storage, 1));
  const Status again = SaveVersion(storage, 2);
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again.ToString();
  EXPECT_EQ(CommittedVersion(storage), 1.f);
  EXPECT_EQ(Generations(*storage).size(), 1u);
}

// Holds every caller of Wait() until `count` callers are waiting (or a
// deadline passes), so that two jobs reach their commit together.
class Rendezvous {
 public:
  explicit Rendezvous(int count) : remaining_(count) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (--remaining_ <= 0) cv_.notify_all();
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return remaining_ <= 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int remaining_;
};

// Two jobs of four processes, each with its own coordinator group, save to
// the same path at once; both pass the checks of the blocking phase before
// either commits.
TEST(ObjectStoreSaveTest, TwoJobsRacingForOnePathHaveOneWinner) {
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto base = NewObjectStore();
    Rendezvous both_committing(2);
    auto job_storage = [&] {
      auto storage = std::make_shared<FaultInjectionStorage>(base);
      storage->FailOn([&](std::string_view op, const std::string&) {
        if (op == "WriteIfAbsent") both_committing.Wait();
        return Status::Ok();
      });
      return storage;
    };
    auto a_storage = job_storage(), b_storage = job_storage();
    std::vector<Status> a, b;
    std::thread job_a([&] { a = SaveJob(a_storage, 4, 100); });
    std::thread job_b([&] { b = SaveJob(b_storage, 4, 200); });
    job_a.join();
    job_b.join();

    const bool a_won = a[0].ok();
    const std::vector<Status>& winner = a_won ? a : b;
    const std::vector<Status>& loser = a_won ? b : a;
    for (const Status& status : winner) SK_EXPECT_OK(status);
    for (const Status& status : loser) {
      EXPECT_EQ(status.code(), StatusCode::kAlreadyExists) << status.ToString();
      EXPECT_NE(status.message().find("another save committed " + std::string(kPath) +
                                      " first"),
                std::string::npos)
          << status.ToString();
    }
    EXPECT_EQ(CommittedVersion(base), a_won ? 100.f : 200.f);
    // The loser's generation is gone: only the winner's is left.
    EXPECT_EQ(Generations(*base), std::vector<std::string>{CommittedGeneration(*base)});
  }
}

// A save still writing when another one commits the path loses its files to
// the winner's cleanup; it must report the lost race, not the missing files.
TEST(ObjectStoreSaveTest, ASaveOvertakenWhileWritingFailsWithAlreadyExists) {
  auto base = NewObjectStore();
  std::mutex mu;
  std::condition_variable cv;
  bool slow_writing = false, fast_done = false;
  auto slow_storage = std::make_shared<FaultInjectionStorage>(base);
  slow_storage->FailOn([&](std::string_view op, const std::string&) {
    if (op != "Append") return Status::Ok();
    std::unique_lock<std::mutex> lock(mu);
    if (!slow_writing) {  // its first write: wait for the other save
      slow_writing = true;
      cv.notify_all();
      cv.wait_for(lock, std::chrono::seconds(10), [&] { return fast_done; });
    }
    return Status::Ok();
  });
  Status slow;
  std::thread slow_job([&] { slow = SaveJob(slow_storage, 2, 100)[0]; });
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return slow_writing; }));
  }
  SK_EXPECT_OK(SaveVersion(base, 200));
  {
    std::lock_guard<std::mutex> lock(mu);
    fast_done = true;
  }
  cv.notify_all();
  slow_job.join();

  EXPECT_EQ(slow.code(), StatusCode::kAlreadyExists) << slow.ToString();
  EXPECT_NE(slow.message().find("another save committed " + std::string(kPath) + " first"),
            std::string::npos)
      << slow.ToString();
  EXPECT_EQ(CommittedVersion(base), 200.f);
  EXPECT_EQ(Generations(*base), std::vector<std::string>{CommittedGeneration(*base)});
}

TEST(ObjectStoreSaveTest, ForceReplacesAndRemovesTheOldGeneration) {
  auto storage = NewObjectStore();
  for (const Status& status : SaveJob(storage, 2, 1)) SK_EXPECT_OK(status);
  const std::string old_generation = CommittedGeneration(*storage);
  for (const Status& status : SaveJob(storage, 2, 2, /*force=*/true)) SK_EXPECT_OK(status);
  EXPECT_EQ(CommittedVersion(storage), 2.f);
  const std::string generation = CommittedGeneration(*storage);
  EXPECT_NE(generation, old_generation);
  EXPECT_EQ(EntriesAtPath(*storage), (std::vector<std::string>{generation, "_SHARDKEEP"}));
}

TEST(ObjectStoreSaveTest, ALeftoverGenerationDoesNotBlockAndIsRemovedAfterTheCommit) {
  auto storage = NewObjectStore();
  const std::string leftover = std::string(kPath) + "/.shardkeep-g00000000deadbeef";
  SK_ASSERT_OK(storage->WriteAll(leftover + "/state/data/p0-0.bin", "partial", false));
  SK_ASSERT_OK(SaveVersion(storage, 1));
  EXPECT_EQ(CommittedVersion(storage), 1.f);
  SK_ASSERT_OK_AND_ASSIGN(bool left, storage->Exists(leftover));
  EXPECT_FALSE(left);
  EXPECT_EQ(Generations(*storage), std::vector<std::string>{CommittedGeneration(*storage)});
}

TEST(ObjectStoreSaveTest, OtherObjectsAtThePathAreRefusedUnlessForced) {
  auto storage = NewObjectStore();
  const std::string notes = std::string(kPath) + "/notes.txt";
  SK_ASSERT_OK(storage->WriteAll(notes, "someone's data", false));
  const Status refused = SaveVersion(storage, 1);
  EXPECT_EQ(refused.code(), StatusCode::kAlreadyExists) << refused.ToString();
  EXPECT_NE(refused.message().find("not a shardkeep checkpoint"), std::string::npos)
      << refused.ToString();
  EXPECT_EQ(EntriesAtPath(*storage), std::vector<std::string>{"notes.txt"});
  // force replaces whatever is there.
  SK_ASSERT_OK(SaveVersion(storage, 1, /*force=*/true));
  EXPECT_EQ(CommittedVersion(storage), 1.f);
  EXPECT_EQ(EntriesAtPath(*storage),
            (std::vector<std::string>{CommittedGeneration(*storage), "_SHARDKEEP"}));
}

// Copies every key below `path` of `from` to `to`.
void CopyTree(Storage& from, Storage& to, const std::string& path) {
  Result<std::vector<std::string>> names = from.List(path);
  if (!names.ok()) {
    SK_ASSERT_OK_AND_ASSIGN(std::string bytes, from.ReadAll(path));
    SK_ASSERT_OK(to.WriteAll(path, bytes, false));
    return;
  }
  for (const std::string& name : *names) CopyTree(from, to, path + "/" + name);
}

TEST(ObjectStoreSaveTest, ACheckpointCopiedFromAFileSystemLoadsAndCanBeReplaced) {
  auto posix = NewMemoryStorage();
  SK_ASSERT_OK(SaveVersion(posix, 1));
  auto objects = NewObjectStore();
  CopyTree(*posix, *objects, kPath);
  EXPECT_EQ(CommittedGeneration(*objects), "");  // the layout without generations
  EXPECT_EQ(CommittedVersion(objects), 1.f);

  SK_ASSERT_OK(SaveVersion(objects, 2, /*force=*/true));
  EXPECT_EQ(CommittedVersion(objects), 2.f);
  // The replaced checkpoint's folders are gone too.
  EXPECT_EQ(EntriesAtPath(*objects),
            (std::vector<std::string>{CommittedGeneration(*objects), "_SHARDKEEP"}));
}

TEST(ObjectStoreSaveTest, AFailedSaveLeavesNoGeneration) {
  auto base = NewObjectStore();
  auto storage = std::make_shared<FaultInjectionStorage>(base);
  // One process's data write fails: the whole job fails.
  std::atomic<int> writes{0};
  storage->FailOn([&](std::string_view op, const std::string& path) {
    if (op == "Append" && path.find("/p2-") != std::string::npos && ++writes == 1) {
      return StorageError("injected write failure at " + path);
    }
    return Status::Ok();
  });
  for (const Status& status : SaveJob(storage, 4, 1)) EXPECT_FALSE(status.ok());
  EXPECT_EQ(EntriesAtPath(*base), std::vector<std::string>{});

  // The commit record cannot be created: nothing is committed, and the
  // generation is deleted.
  storage->FailOn([](std::string_view op, const std::string& path) {
    if (op == "WriteIfAbsent") return StorageError("injected failure creating " + path);
    return Status::Ok();
  });
  const std::vector<Status> statuses = SaveJob(storage, 4, 1);
  for (const Status& status : statuses) {
    EXPECT_FALSE(status.ok());
    EXPECT_NE(status.code(), StatusCode::kCommitStateUnknown) << status.ToString();
  }
  EXPECT_NE(statuses[0].message().find("nothing was committed"), std::string::npos)
      << statuses[0].ToString();
  EXPECT_EQ(EntriesAtPath(*base), std::vector<std::string>{});
}

// The reply to the conditional PUT is lost after the record was stored:
// reading the record back shows the save committed.
TEST(ObjectStoreSaveTest, ALostReplyToTheCommitIsSettledByReadingTheRecord) {
  auto base = NewObjectStore();
  auto storage = std::make_shared<FaultInjectionStorage>(base);
  storage->LoseAnswerOn([](std::string_view op, const std::string&) {
    if (op == "WriteIfAbsent") return StorageError("connection reset");
    return Status::Ok();
  });
  SK_ASSERT_OK(SaveVersion(storage, 1));
  EXPECT_EQ(CommittedVersion(base), 1.f);
  // Also when replacing: the old record's deletion and the new record's
  // creation both lose their replies.
  storage->LoseAnswerOn([](std::string_view op, const std::string&) {
    if (op == "WriteIfAbsent" || op == "DeleteFile") return StorageError("connection reset");
    return Status::Ok();
  });
  SK_ASSERT_OK(SaveVersion(storage, 2, /*force=*/true));
  EXPECT_EQ(CommittedVersion(base), 2.f);
  EXPECT_EQ(Generations(*base), std::vector<std::string>{CommittedGeneration(*base)});
}

// Replacing: the old record's deletion answers a failure after deleting
// it, and checking for it fails too. The save puts the record back and
// fails, and the previous checkpoint is committed again.
TEST(ObjectStoreSaveTest, AnUncertainDeletionOfTheOldRecordPutsItBack) {
  auto base = NewObjectStore();
  SK_ASSERT_OK(SaveVersion(base, 1));
  auto storage = std::make_shared<FaultInjectionStorage>(base);
  std::atomic<bool> deleted{false};
  storage->LoseAnswerOn([&](std::string_view op, const std::string&) {
    if (op != "DeleteFile") return Status::Ok();
    deleted = true;
    return StorageError("connection reset");
  });
  storage->FailOn([&](std::string_view op, const std::string& path) {
    return deleted && op == "Exists" && path == kRecord ? StorageError("timed out")
                                                        : Status::Ok();
  });
  const Status status = SaveVersion(storage, 2, /*force=*/true);
  EXPECT_EQ(status.code(), StatusCode::kStorage) << status.ToString();
  EXPECT_NE(status.message().find("removing the record of the checkpoint it replaces"),
            std::string::npos)
      << status.ToString();
  EXPECT_EQ(CommittedVersion(base), 1.f);
  EXPECT_EQ(Generations(*base), std::vector<std::string>{CommittedGeneration(*base)});
}

// Neither a lost reply nor a readable record: the outcome cannot be known.
TEST(ObjectStoreSaveTest, AnUnreadableRecordAfterAFailedCommitIsCommitStateUnknown) {
  auto base = NewObjectStore();
  auto storage = std::make_shared<FaultInjectionStorage>(base);
  std::atomic<bool> committing{false};
  storage->FailOn([&](std::string_view op, const std::string& path) {
    if (op == "WriteIfAbsent") {
      committing = true;
      return StorageError("timed out creating " + path);
    }
    if (committing && op == "ReadAll") return StorageError("timed out reading " + path);
    return Status::Ok();
  });
  const Status status = SaveVersion(storage, 1);
  EXPECT_EQ(status.code(), StatusCode::kCommitStateUnknown) << status.ToString();
  // Nothing is deleted in that state: the generation stays.
  EXPECT_EQ(Generations(*base).size(), 1u);
}

TEST(ObjectStoreSaveTest, StorageThatCanNeitherRenameNorCreateConditionallyIsRefused) {
  auto base = NewObjectStore();
  auto storage = std::make_shared<FaultInjectionStorage>(base);
  storage->OverrideFeatures({});
  const Status status = SaveVersion(storage, 1);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  EXPECT_NE(status.message().find("neither rename atomically nor create a file only if absent"),
            std::string::npos)
      << status.ToString();
  EXPECT_EQ(EntriesAtPath(*base), std::vector<std::string>{});
}

// The reader takes every file from the record's data folder, and its
// errors name them there.
TEST(ObjectStoreSaveTest, ReaderErrorsNameFilesInTheGeneration) {
  auto storage = NewObjectStore();
  SK_ASSERT_OK(SaveVersion(storage, 1));
  const std::string index =
      std::string(kPath) + "/" + CommittedGeneration(*storage) + "/state/index/p0.idx";
  SK_ASSERT_OK(storage->DeleteFile(index));
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage, kPath));
  std::vector<float> w(kRows * kCols);
  const Status read = reader->Read(
      "state",
      {{0, DType::kFloat32, Box{{0, 0}, {kRows, kCols}}, reinterpret_cast<uint8_t*>(w.data())}},
      Options());
  EXPECT_EQ(read.code(), StatusCode::kCorruption) << read.ToString();
  EXPECT_NE(read.message().find(index), std::string::npos) << read.ToString();
}

TEST(ObjectStoreSaveTest, AHostileDataFolderIsRefusedByTheReader) {
  auto storage = NewObjectStore();
  SK_ASSERT_OK(SaveVersion(storage, 1));
  SK_ASSERT_OK_AND_ASSIGN(std::string record, storage->ReadAll(kRecord));
  const std::string generation = CommittedGeneration(*storage);
  for (const std::string& hostile : {std::string("../x"), std::string("/etc"),
                                     generation + "/..", std::string("state")}) {
    SCOPED_TRACE(hostile);
    std::string forged = record;
    forged.replace(forged.find(generation), generation.size(), hostile);
    format::SealCommitRecord(forged);  // as a forger would
    SK_ASSERT_OK(storage->WriteAll(kRecord, forged, false));
    const Status opened = CheckpointReader::Open(storage, kPath).status();
    EXPECT_EQ(opened.code(), StatusCode::kCorruption) << opened.ToString();
    EXPECT_NE(opened.message().find("data_folder"), std::string::npos) << opened.ToString();
  }
}

// --- A fault at every storage call -------------------------------------

// How many storage calls a save makes (force: replacing version 1).
int CallsOfASave(bool force) {
  auto base = NewObjectStore();
  if (force) EXPECT_TRUE(SaveVersion(base, 1).ok());
  auto storage = std::make_shared<FaultInjectionStorage>(base);
  std::atomic<int> calls{0};
  storage->FailOn([&](std::string_view, const std::string&) {
    ++calls;
    return Status::Ok();
  });
  EXPECT_TRUE(SaveVersion(storage, 2, force).ok());
  return calls;
}

class ObjectStoreFaultTest : public ::testing::TestWithParam<bool> {};

INSTANTIATE_TEST_SUITE_P(Modes, ObjectStoreFaultTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Force" : "Fresh"; });

// Only call k fails. A save that fails leaves the previous checkpoint (or
// none) and no generation of its own; one that succeeds leaves only its own.
TEST_P(ObjectStoreFaultTest, FailureAtAnyCallLeavesTheOldOrTheNewCheckpoint) {
  const bool force = GetParam();
  const int calls = CallsOfASave(force);
  ASSERT_GT(calls, 10);
  for (int k = 1; k <= calls; ++k) {
    SCOPED_TRACE("failure at call " + std::to_string(k));
    auto base = NewObjectStore();
    if (force) ASSERT_TRUE(SaveVersion(base, 1).ok());
    const std::vector<std::string> before = Generations(*base);
    auto storage = std::make_shared<FaultInjectionStorage>(base);
    std::atomic<int> seen{0};
    std::string failed_op;
    storage->FailOn([&](std::string_view op, const std::string& path) {
      if (++seen != k) return Status::Ok();
      failed_op = op;
      return StorageError("injected " + std::string(op) + " failure at " + path);
    });
    const Status status = SaveVersion(storage, 2, force);
    EXPECT_NE(status.code(), StatusCode::kCommitStateUnknown) << status.ToString();
    const std::optional<float> previous =
        force ? std::optional<float>(1.f) : std::optional<float>();
    EXPECT_EQ(CommittedVersion(base), status.ok() ? std::optional<float>(2.f) : previous)
        << status.ToString();
    // Cleaning up is best effort: only a failed deletion or listing may
    // leave a generation behind, or, after the commit, a failed read of the
    // lease or the record that decides whether another generation may go.
    const bool cleanup_failed = failed_op == "DeleteRecursive" || failed_op == "List" ||
                                failed_op == "DeleteFile" ||
                                (status.ok() && failed_op == "ReadAll");
    if (!cleanup_failed) {
      EXPECT_EQ(Generations(*base),
                status.ok() ? std::vector<std::string>{CommittedGeneration(*base)} : before)
          << failed_op << ": " << status.ToString();
    }
    // The next save succeeds and leaves one generation.
    storage->FailOn(nullptr);
    SK_EXPECT_OK(SaveVersion(storage, 3, /*force=*/true));
    EXPECT_EQ(CommittedVersion(base), 3.f);
    EXPECT_EQ(Generations(*base), std::vector<std::string>{CommittedGeneration(*base)});
  }
}

// A crash at call k: that call and every later one fail. The path holds
// the previous checkpoint or the new one, never a mix; with force, one
// crash point leaves none (the window between deleting the old record and
// creating the new), and the previous checkpoint's files are still whole.
TEST_P(ObjectStoreFaultTest, CrashAtAnyCallNeverLeavesAMix) {
  const bool force = GetParam();
  const int calls = CallsOfASave(force);
  int gaps = 0;
  for (int k = 1; k <= calls; ++k) {
    SCOPED_TRACE("crash at call " + std::to_string(k));
    auto base = NewObjectStore();
    if (force) ASSERT_TRUE(SaveVersion(base, 1).ok());
    SK_ASSERT_OK_AND_ASSIGN(std::string old_record,
                            force ? base->ReadAll(kRecord) : Result<std::string>(""));
    auto storage = std::make_shared<FaultInjectionStorage>(base);
    std::atomic<int> seen{0};
    storage->FailOn([&](std::string_view op, const std::string& path) {
      if (++seen < k) return Status::Ok();
      return StorageError("crashed before " + std::string(op) + " " + path);
    });
    const Status status = SaveVersion(storage, 2, force);
    const std::optional<float> version = CommittedVersion(base);
    if (status.ok()) EXPECT_EQ(version, 2.f);
    if (version) {
      EXPECT_TRUE(version == 2.f || (force && version == 1.f)) << status.ToString();
    } else {
      SK_ASSERT_OK_AND_ASSIGN(bool recorded, base->Exists(kRecord));
      EXPECT_FALSE(recorded) << "a record that does not load: " << status.ToString();
      if (force) {
        ++gaps;
        // Putting the old record back brings the old checkpoint back whole.
        SK_ASSERT_OK(base->WriteIfAbsent(kRecord, old_record));
        EXPECT_EQ(CommittedVersion(base), 1.f);
      }
    }
    storage->FailOn(nullptr);
    SK_EXPECT_OK(SaveVersion(storage, 3, /*force=*/true));
    EXPECT_EQ(CommittedVersion(base), 3.f);
    EXPECT_EQ(Generations(*base), std::vector<std::string>{CommittedGeneration(*base)});
  }
  if (force) EXPECT_EQ(gaps, 1) << "the force window is one call wide";
}

// Four processes replace version 1 with force; the k-th storage call of
// process p fails (p = 0, the primary, and p = 2). Every process reports
// the same outcome, the path holds version 1 or 2 whole, and a failed
// save leaves no generation of its own.
TEST(ObjectStoreMultiProcessFaultTest, FailureAtAnyCallOfAnyProcess) {
  constexpr int kProcesses = 4;
  for (int faulty : {0, 2}) {
    // How many calls that process makes in a forced save.
    int calls = 0;
    {
      auto base = NewObjectStore();
      ASSERT_TRUE(SaveJob(base, kProcesses, 1)[0].ok());
      auto counted = std::make_shared<FaultInjectionStorage>(base);
      std::atomic<int> seen{0};
      counted->FailOn([&](std::string_view, const std::string&) {
        ++seen;
        return Status::Ok();
      });
      for (const Status& status : SaveJobWith(
               [&](int p) { return p == faulty ? counted : base; }, kProcesses, 2, true)) {
        SK_ASSERT_OK(status);
      }
      calls = seen;
    }
    ASSERT_GT(calls, 3);
    for (int k = 1; k <= calls; ++k) {
      SCOPED_TRACE("process " + std::to_string(faulty) + ", failure at call " +
                   std::to_string(k));
      auto base = NewObjectStore();
      ASSERT_TRUE(SaveJob(base, kProcesses, 1)[0].ok());
      const std::vector<std::string> before = Generations(*base);
      auto storage = std::make_shared<FaultInjectionStorage>(base);
      std::atomic<int> seen{0};
      std::string failed_op;
      storage->FailOn([&](std::string_view op, const std::string& path) {
        if (++seen != k) return Status::Ok();
        failed_op = op;
        return StorageError("injected " + std::string(op) + " failure at " + path);
      });
      const std::vector<Status> statuses = SaveJobWith(
          [&](int p) { return p == faulty ? storage : base; }, kProcesses, 2, true);
      const bool committed = statuses[0].ok();
      for (const Status& status : statuses) {
        EXPECT_EQ(status.ok(), committed) << status.ToString();
        EXPECT_NE(status.code(), StatusCode::kCommitStateUnknown) << status.ToString();
      }
      EXPECT_EQ(CommittedVersion(base), committed ? 2.f : 1.f) << statuses[0].ToString();
      const bool cleanup_failed = failed_op == "DeleteRecursive" || failed_op == "List" ||
                                  (committed && failed_op == "ReadAll");
      if (!cleanup_failed) {
        EXPECT_EQ(Generations(*base),
                  committed ? std::vector<std::string>{CommittedGeneration(*base)} : before)
            << failed_op;
      }
    }
  }
}

}  // namespace
}  // namespace shardkeep
