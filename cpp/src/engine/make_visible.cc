#include "engine/make_visible.h"

#include "format/commit_record.h"

namespace shardkeep::internal {
namespace {

std::string ParentDir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// `failure` happened, and `undo_failure` while putting things back.
Status CommitStateUnknown(const std::string& path, const Status& failure,
                          const Status& undo_failure,
                          const std::string& whereabouts) {
  return CommitStateUnknownError(
      "commit of " + path + " in an unknown state: " + failure.ToString() +
      ", then undoing it failed: " + undo_failure.ToString() + "; " +
      whereabouts + ". Check " + path + " before relying on it");
}

// Nothing at `path`: one rename.
Status MoveIntoPlace(Storage& storage, const std::string& tmp,
                     const std::string& path) {
  SK_RETURN_IF_ERROR(storage.Rename(tmp, path));
  const Status synced = storage.SyncDir(ParentDir(path));
  if (synced.ok()) return Status::Ok();
  // Not durable, so not committed: take it back.
  const Status undone = storage.Rename(path, tmp);
  if (!undone.ok()) {
    return CommitStateUnknown(path, synced, undone,
                              "the new checkpoint is at " + path +
                                  " but may not survive a crash");
  }
  return synced;
}

// After Exchange(tmp, path): the new checkpoint at `path`, the previous one
// at `tmp`.
Status SettleExchange(Storage& storage, const std::string& tmp,
                      const std::string& path) {
  const Status synced = storage.SyncDir(ParentDir(path));
  if (synced.ok()) {
    (void)DiscardFolder(storage, tmp);
    return Status::Ok();
  }
  Result<bool> swapped_back = storage.Exchange(tmp, path);
  if (swapped_back.ok() && *swapped_back) return synced;
  const Status undone =
      swapped_back.ok() ? StorageError("the backend refused the exchange back")
                        : swapped_back.status();
  return CommitStateUnknown(path, synced, undone,
                            "the new checkpoint is at " + path +
                                " but may not survive a crash; the previous one "
                                "is at " + tmp);
}

// The fallback where the backend cannot exchange.
Status ReplaceByTwoRenames(Storage& storage, const std::string& tmp,
                           const std::string& path) {
  const std::string old = path + kOldSuffix;
  SK_RETURN_IF_ERROR(DiscardFolder(storage, old));
  SK_RETURN_IF_ERROR(storage.Rename(path, old));
  const Status renamed = storage.Rename(tmp, path);
  const Status synced =
      renamed.ok() ? storage.SyncDir(ParentDir(path)) : renamed;
  if (synced.ok()) {
    (void)DiscardFolder(storage, old);
    return Status::Ok();
  }
  if (renamed.ok()) {
    const Status undone = storage.Rename(path, tmp);
    if (!undone.ok()) {
      return CommitStateUnknown(path, synced, undone,
                                "the new checkpoint is at " + path +
                                    " but may not survive a crash; the "
                                    "previous one is at " + old);
    }
  }
  const Status restored = storage.Rename(old, path);
  if (!restored.ok()) {
    return CommitStateUnknown(path, synced, restored,
                              "nothing is at " + path + "; the previous "
                              "checkpoint is whole at " + old +
                                  " and the new one at " + tmp);
  }
  return synced;
}

}  // namespace

Status DiscardFolder(Storage& storage, const std::string& dir) {
  const Status unrecorded = storage.DeleteFile(dir + "/" + format::kCommitFileName);
  if (!unrecorded.ok() && unrecorded.code() != StatusCode::kNotFound) return unrecorded;
  return storage.DeleteRecursive(dir);
}

Status MakeVisible(Storage& storage, const std::string& tmp,
                   const std::string& path) {
  SK_ASSIGN_OR_RETURN(const bool replacing, storage.Exists(path));
  if (!replacing) return MoveIntoPlace(storage, tmp, path);
  if (storage.features().atomic_exchange) {
    SK_ASSIGN_OR_RETURN(const bool swapped, storage.Exchange(tmp, path));
    if (swapped) return SettleExchange(storage, tmp, path);
  }
  return ReplaceByTwoRenames(storage, tmp, path);
}

}  // namespace shardkeep::internal
