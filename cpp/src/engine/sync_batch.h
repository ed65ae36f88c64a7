// Making many written files and folders durable together.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "shardkeep/storage.h"

namespace shardkeep::internal {

// Files written in full but not synced yet, and folders whose entries
// must become durable. SyncAll() makes them all durable at once, each on a
// thread of its own: a journaling file system (ext4, xfs) commits
// concurrent fsyncs in one journal transaction and the device flushes its
// cache once for them, where one fsync after another would pay a commit
// and a flush each. Nothing orders the items among themselves, so only
// what may become durable in any order goes into one batch.
class SyncBatch {
 public:
  // `file` is complete: no Append follows. SyncAll syncs and closes it.
  void AddFile(std::unique_ptr<WritableFile> file, std::string path);
  // Every entry of `dir` exists already; SyncAll syncs the folder.
  void AddDir(std::string dir);
  // Moves every item of `other` into this batch.
  void Take(SyncBatch&& other);
  bool empty() const { return files_.empty() && dirs_.empty(); }

  // Closes every file without syncing it (a failed save's files need no
  // durability) and forgets the folders.
  void Discard();

  // Syncs (and closes) every file and syncs every folder; the batch is
  // empty afterwards. Returns the first failure, naming the file or
  // folder. Files not synced because of a failure are closed unsynced.
  Status SyncAll(Storage& storage);

 private:
  std::vector<std::unique_ptr<WritableFile>> files_;
  std::vector<std::string> file_paths_;
  std::vector<std::string> dirs_;
};

}  // namespace shardkeep::internal
