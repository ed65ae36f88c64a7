// The durability the rename commit promises, checked on the order of a
// save's storage calls: before the rename, every file of the temporary
// folder is synced after its last write and every folder is synced after
// its last entry was created; after it, the parent folder is synced. The
// syncs may run in any order and at once (engine/sync_batch.h), so each
// call is recorded twice, when it starts and when it returns.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "testing/simulated_group.h"
#include "shardkeep/checkpoint.h"
#include "shardkeep/checkpoint_root.h"
#include "testing/payloads.h"
#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

struct Event {
  std::string op;    // "WriteAll", "Append", "Sync", "SyncDir", ...
  std::string path;  // the file's or folder's path (Rename: its source)
  bool end;          // the call returned (false: it started)
  bool sync = false; // WriteAll with sync
};

class Log {
 public:
  size_t Add(Event event) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(event));
    return events_.size() - 1;
  }
  std::vector<Event> events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Event> events_;
};

class RecordingFile final : public WritableFile {
 public:
  RecordingFile(std::unique_ptr<WritableFile> base, std::shared_ptr<Log> log,
                std::string path)
      : base_(std::move(base)), log_(std::move(log)), path_(std::move(path)) {}
  Status Append(const void* data, size_t size) override {
    return Record("Append", [&] { return base_->Append(data, size); });
  }
  Status Sync() override {
    return Record("Sync", [&] { return base_->Sync(); });
  }
  Status Close() override {
    return Record("Close", [&] { return base_->Close(); });
  }

 private:
  template <typename F>
  Status Record(const char* op, F call) {
    log_->Add({op, path_, false});
    Status status = call();
    log_->Add({op, path_, true});
    return status;
  }
  std::unique_ptr<WritableFile> base_;
  std::shared_ptr<Log> log_;
  std::string path_;
};

// Forwards to a memory store that behaves like a file system, recording
// the calls that write or sync.
class RecordingStorage final : public Storage {
 public:
  RecordingStorage() : base_(NewMemoryStorage()), log_(std::make_shared<Log>()) {}
  std::vector<Event> events() const { return log_->events(); }

  StorageFeatures features() const override {
    StorageFeatures features = base_->features();
    features.durable_sync = true;  // what the commit is checked against
    return features;
  }
  Status ReadAt(const std::string& path, uint64_t offset, uint64_t size,
                void* dst) override {
    return base_->ReadAt(path, offset, size, dst);
  }
  Result<std::string> ReadAll(const std::string& path) override {
    return base_->ReadAll(path);
  }
  Result<uint64_t> FileSize(const std::string& path) override {
    return base_->FileSize(path);
  }
  Status WriteAll(const std::string& path, std::string_view data, bool sync) override {
    log_->Add({"WriteAll", path, false, sync});
    Status status = base_->WriteAll(path, data, sync);
    log_->Add({"WriteAll", path, true, sync});
    return status;
  }
  Result<std::unique_ptr<WritableFile>> OpenForAppend(const std::string& path) override {
    log_->Add({"OpenForAppend", path, false});
    Result<std::unique_ptr<WritableFile>> file = base_->OpenForAppend(path);
    log_->Add({"OpenForAppend", path, true});
    SK_RETURN_IF_ERROR(file.status());
    return std::unique_ptr<WritableFile>(
        std::make_unique<RecordingFile>(std::move(*file), log_, path));
  }
  Result<bool> Exists(const std::string& path) override { return base_->Exists(path); }
  Result<std::vector<std::string>> List(const std::string& dir) override {
    return base_->List(dir);
  }
  Status CreateDir(const std::string& dir) override {
    return Record("CreateDir", dir, [&] { return base_->CreateDir(dir); });
  }
  Status DeleteFile(const std::string& path) override {
    return Record("DeleteFile", path, [&] { return base_->DeleteFile(path); });
  }
  Status DeleteRecursive(const std::string& path) override {
    return Record("DeleteRecursive", path, [&] { return base_->DeleteRecursive(path); });
  }
  Status Rename(const std::string& from, const std::string& to) override {
    return Record("Rename", from, [&] { return base_->Rename(from, to); });
  }
  Status SyncDir(const std::string& dir) override {
    return Record("SyncDir", dir, [&] { return base_->SyncDir(dir); });
  }
  Result<bool> Exchange(const std::string& a, const std::string& b) override {
    log_->Add({"Exchange", a, false});
    Result<bool> swapped = base_->Exchange(a, b);
    log_->Add({"Exchange", a, true});
    return swapped;
  }

 private:
  template <typename F>
  Status Record(const char* op, const std::string& path, F call) {
    log_->Add({op, path, false});
    Status status = call();
    log_->Add({op, path, true});
    return status;
  }
  std::shared_ptr<Storage> base_;
  std::shared_ptr<Log> log_;
};

std::string Parent(const std::string& path) { return path.substr(0, path.rfind('/')); }

bool Under(const std::string& path, const std::string& dir) {
  return path == dir || path.starts_with(dir + "/");
}

// Checks the order of `events` for the save that committed `path` by
// renaming <path>.shardkeep-tmp; every violation is a test failure naming
// the file or folder.
void ExpectDurableBeforeRename(const std::vector<Event>& events, const std::string& path) {
  const std::string tmp = path + ".shardkeep-tmp";
  std::optional<size_t> rename_begin, rename_end;
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if ((e.op == "Rename" || e.op == "Exchange") && e.path == tmp) {
      (e.end ? rename_end : rename_begin) = i;
    }
  }
  ASSERT_TRUE(rename_begin && rename_end) << "no rename of " << tmp;

  // Per file: when its last write returned, and when its syncs ran.
  std::map<std::string, size_t> last_write;
  std::map<std::string, std::vector<std::pair<size_t, size_t>>> file_syncs, dir_syncs;
  std::map<std::string, size_t> sync_begin;  // open sync calls, by op and path
  // Per folder: when its last entry was created.
  std::map<std::string, size_t> last_entry;
  for (size_t i = 0; i < *rename_begin; ++i) {
    const Event& e = events[i];
    if (!Under(e.path, tmp)) continue;
    const std::string key = e.op + " " + e.path;
    if (!e.end) {
      sync_begin[key] = i;
      continue;
    }
    // A lease file is not part of the checkpoint: deleted after the commit,
    // and nothing reads one left in a checkpoint by a crash.
    if (e.path.find(kLeaseFilePrefix) != std::string::npos) continue;
    if (e.op == "WriteAll" || e.op == "Append" || e.op == "OpenForAppend") {
      last_write[e.path] = i;
      last_entry[Parent(e.path)] = i;
      if (e.op == "WriteAll" && e.sync) file_syncs[e.path].push_back({i, i});
    } else if (e.op == "CreateDir") {
      // Creates the missing folders above it too.
      for (std::string dir = e.path; Under(dir, tmp); dir = Parent(dir)) {
        last_entry[dir] = std::max(last_entry[dir], i);
        if (dir != tmp) last_entry[Parent(dir)] = i;
      }
    } else if (e.op == "Sync") {
      file_syncs[e.path].push_back({sync_begin[key], i});
    } else if (e.op == "SyncDir") {
      dir_syncs[e.path].push_back({sync_begin[key], i});
    }
  }
  ASSERT_FALSE(last_write.empty());
  for (const auto& [file, written] : last_write) {
    bool durable = false;
    for (const auto& [begin, end] : file_syncs[file]) {
      durable |= begin >= written || (begin == end && end == written);
    }
    EXPECT_TRUE(durable) << file << " is not synced after its last write before the rename";
  }
  for (const auto& [dir, created] : last_entry) {
    if (dir == Parent(tmp)) continue;
    bool durable = false;
    for (const auto& [begin, end] : dir_syncs[dir]) durable |= begin > created;
    EXPECT_TRUE(durable) << "folder " << dir
                         << " is not synced after its last entry before the rename";
  }
  bool parent_synced = false;
  for (size_t i = *rename_end; i < events.size(); ++i) {
    const Event& e = events[i];
    parent_synced |= e.op == "SyncDir" && !e.end && e.path == Parent(path);
  }
  EXPECT_TRUE(parent_synced) << Parent(path) << " is not synced after the rename";
}

struct State {
  std::vector<float> w = std::vector<float>(64 * 32, 1.5f);
  std::vector<int32_t> step = {7};
};

// A pytree of two leaves in many chunks, a bytes value and another pytree.
SaveRequest RequestFor(const State& state, const std::string& path) {
  SaveRequest request;
  request.path = path;
  CheckpointablePayload tree = testdata::PytreePayload(
      "state", {{"w", "float32", {64, 32}}, {"step", "int32", {}}});
  tree.shards.push_back({0, DType::kFloat32, Box{{0, 0}, {64, 32}},
                         reinterpret_cast<const uint8_t*>(state.w.data())});
  tree.shards.push_back({1, DType::kInt32, Box{{}, {}},
                         reinterpret_cast<const uint8_t*>(state.step.data())});
  request.parts.push_back(std::move(tree));
  request.parts.push_back(testdata::BytesPayload("dataset", "position 42"));
  CheckpointablePayload other =
      testdata::PytreePayload("ema", {{"w", "float32", {64, 32}}});
  other.shards.push_back({0, DType::kFloat32, Box{{0, 0}, {64, 32}},
                          reinterpret_cast<const uint8_t*>(state.w.data())});
  request.parts.push_back(std::move(other));
  return request;
}

Options ManyFiles() {
  Options options;
  options.chunk_bytes = 32 * 4 * 4;             // four rows of w per chunk
  options.data_file_bytes = 3 * options.chunk_bytes;  // files roll
  options.io_threads = 4;
  return options;
}

TEST(SaveDurabilityTest, EverythingIsDurableBeforeTheRename) {
  auto storage = std::make_shared<RecordingStorage>();
  State state;
  SK_ASSERT_OK(Save(storage, NewSingleProcessCoordinator(),
                    RequestFor(state, "root/ckpt"), ManyFiles()));
  ExpectDurableBeforeRename(storage->events(), "root/ckpt");
}

TEST(SaveDurabilityTest, ReplacingIsDurableBeforeTheExchange) {
  auto storage = std::make_shared<RecordingStorage>();
  State state;
  SK_ASSERT_OK(Save(storage, NewSingleProcessCoordinator(),
                    RequestFor(state, "root/ckpt"), ManyFiles()));
  SaveRequest again = RequestFor(state, "root/ckpt");
  again.force = true;
  const size_t before = storage->events().size();
  SK_ASSERT_OK(Save(storage, NewSingleProcessCoordinator(), again, ManyFiles()));
  std::vector<Event> events = storage->events();
  events.erase(events.begin(), events.begin() + before);
  ExpectDurableBeforeRename(events, "root/ckpt");
}

TEST(SaveDurabilityTest, EveryProcessFilesAreDurableBeforeTheRename) {
  constexpr int kProcesses = 3;
  auto storage = std::make_shared<RecordingStorage>();
  State state;
  SimulatedGroup group(kProcesses);
  std::vector<Status> statuses(kProcesses);
  std::vector<std::thread> threads;
  for (int p = 0; p < kProcesses; ++p) {
    threads.emplace_back([&, p] {
      SaveRequest request = RequestFor(state, "root/ckpt");
      request.operation_id = "durability";
      // Each process writes a third of w's rows; the primary also the step.
      for (CheckpointablePayload& part : request.parts) {
        if (part.kind != "pytree") continue;
        std::vector<ShardData> mine;
        for (ShardData shard : part.shards) {
          if (shard.box.shape.empty()) {
            if (p == 0) mine.push_back(shard);
            continue;
          }
          const uint64_t rows = 64 / kProcesses + (p < 64 % kProcesses ? 1 : 0);
          const uint64_t first = p * (64 / kProcesses) + std::min<uint64_t>(p, 64 % kProcesses);
          shard.data += first * 32 * sizeof(float);
          shard.box = Box{{first, 0}, {rows, 32}};
          mine.push_back(shard);
        }
        part.shards = std::move(mine);
      }
      statuses[p] = Save(storage, group.Member(p), std::move(request), ManyFiles());
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int p = 0; p < kProcesses; ++p) {
    SK_ASSERT_OK(statuses[p]);
  }
  ExpectDurableBeforeRename(storage->events(), "root/ckpt");
  const std::vector<Event> events = storage->events();
  std::set<std::string> index_files;
  for (const Event& e : events) {
    if (e.path.find("/index/p") != std::string::npos) index_files.insert(e.path);
  }
  EXPECT_EQ(index_files.size(), 2u * kProcesses);  // two pytrees, one index each
}

}  // namespace
}  // namespace shardkeep
