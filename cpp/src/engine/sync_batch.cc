#include "engine/sync_batch.h"

#include <algorithm>

#include "engine/parallel.h"

namespace shardkeep::internal {
namespace {

// More threads than this take several items each: past a few dozen
// concurrent fsyncs the device is saturated anyway.
constexpr int kMaxSyncThreads = 64;

}  // namespace

void SyncBatch::AddFile(std::unique_ptr<WritableFile> file, std::string path) {
  files_.push_back(std::move(file));
  file_paths_.push_back(std::move(path));
}

void SyncBatch::AddDir(std::string dir) { dirs_.push_back(std::move(dir)); }

void SyncBatch::Take(SyncBatch&& other) {
  for (size_t i = 0; i < other.files_.size(); ++i) {
    AddFile(std::move(other.files_[i]), std::move(other.file_paths_[i]));
  }
  for (std::string& dir : other.dirs_) AddDir(std::move(dir));
  other.files_.clear();
  other.file_paths_.clear();
  other.dirs_.clear();
}

void SyncBatch::Discard() {
  for (std::unique_ptr<WritableFile>& file : files_) (void)file->Close();
  files_.clear();
  file_paths_.clear();
  dirs_.clear();
}

Status SyncBatch::SyncAll(Storage& storage) {
  std::vector<std::unique_ptr<WritableFile>> files = std::move(files_);
  std::vector<std::string> file_paths = std::move(file_paths_);
  std::vector<std::string> dirs = std::move(dirs_);
  files_.clear();
  file_paths_.clear();
  dirs_.clear();
  const size_t count = files.size() + dirs.size();
  const int threads = static_cast<int>(std::min<size_t>(count, kMaxSyncThreads));
  return ParallelFor(count, threads, [&](size_t i) -> Status {
    if (i >= files.size()) return storage.SyncDir(dirs[i - files.size()]);
    WritableFile& file = *files[i];
    Status status = file.Sync();
    // Closed whatever the sync said, so no descriptor outlives the batch.
    const Status closed = file.Close();
    if (status.ok()) status = closed;
    if (status.ok() || status.message().find(file_paths[i]) != std::string::npos) {
      return status;
    }
    return status.WithContext(file_paths[i]);
  }, "sync");
}

}  // namespace shardkeep::internal
