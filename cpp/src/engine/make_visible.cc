#include "engine/make_visible.h"

#include <chrono>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "format/commit_record.h"
#include "format/hex64.h"

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
  const std::string old = path + kReplacedSuffix;
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

// The commit record at <path>, as a save without rename commits it.
std::string RecordFile(const std::string& path) {
  return path + "/" + format::kCommitFileName;
}

// With `force`: deletes the committed record at the path, returning it
// (nullopt when there is none). From here until the new record is
// created, the path holds no checkpoint; the previous one's data stays
// whole in its folder. An error: the record is (still) there.
Result<std::optional<std::string>> RemoveRecord(Storage& storage, const std::string& path,
                                                const std::string& context) {
  const std::string file = RecordFile(path);
  Result<std::string> previous = storage.ReadAll(file);
  if (previous.status().code() == StatusCode::kNotFound) {
    return std::optional<std::string>();
  }
  SK_RETURN_IF_ERROR(
      previous.status().WithContext(context + ": reading the record it replaces"));
  const Status deleted = storage.DeleteFile(file);
  if (deleted.ok() || deleted.code() == StatusCode::kNotFound) {
    return std::optional<std::string>(std::move(*previous));
  }
  // The deletion may have happened all the same.
  Result<bool> still_there = storage.Exists(file);
  if (still_there.ok() && !*still_there) {
    return std::optional<std::string>(std::move(*previous));
  }
  const std::string removing = context + ": removing the record of the checkpoint it replaces";
  if (still_there.ok()) return deleted.WithContext(removing);
  // Unknown whether it is gone: creating it again either puts it back or
  // finds it still there; either way the previous checkpoint stays.
  const Status restored = storage.WriteIfAbsent(file, *previous);
  if (restored.ok() || restored.code() == StatusCode::kAlreadyExists) {
    return deleted.WithContext(removing);
  }
  return StorageError(removing + " failed (" + deleted.ToString() +
                      "), and neither checking for it (" +
                      still_there.status().ToString() + ") nor putting it back (" +
                      restored.ToString() + ") worked; if " + file +
                      " is gone, nothing is committed at " + path);
}

// The new record could not be created after the previous one was
// removed: puts the previous one back, so the path holds it again.
Status RestoreRecord(Storage& storage, const std::string& path, const std::string& previous,
                     const Status& failure, const std::string& context) {
  const Status restored = storage.WriteIfAbsent(RecordFile(path), previous);
  if (restored.ok() || restored.code() == StatusCode::kAlreadyExists) {
    return failure.WithContext(context + ": nothing was committed; " +
                               (restored.ok() ? "the previous checkpoint is back"
                                              : "another save committed meanwhile"));
  }
  return Status(failure.code(),
                context + " failed (" + failure.ToString() +
                    ") after removing the record of the checkpoint it replaces, and "
                    "putting that record back failed too (" + restored.ToString() +
                    "): nothing is committed at " + path +
                    "; the previous checkpoint's files are still there, without "
                    "a record");
}

// After a commit: every other generation under the path can only lose
// (the record exists), so it is deleted, and with `force` whatever else
// was there (a replaced checkpoint in the layout without generations).
// Best effort: a later commit or the manager's cleanup retries.
void RemoveOtherGenerations(Storage& storage, const std::string& path,
                            const std::string& generation, bool force) {
  Result<std::vector<std::string>> entries = storage.List(path);
  if (!entries.ok()) return;
  for (const std::string& entry : *entries) {
    if (entry == generation || entry == format::kCommitFileName) continue;
    if (format::IsGenerationFolderName(entry)) {
      (void)DiscardGeneration(storage, path, entry);
    } else if (force) {
      (void)storage.DeleteRecursive(path + "/" + entry);
    }
  }
}

}  // namespace

Status DiscardFolder(Storage& storage, const std::string& dir) {
  const Status unrecorded = storage.DeleteFile(dir + "/" + format::kCommitFileName);
  if (!unrecorded.ok() && unrecorded.code() != StatusCode::kNotFound) return unrecorded;
  return storage.DeleteRecursive(dir);
}

Status DiscardGeneration(Storage& storage, const std::string& path,
                         const std::string& generation) {
  const std::string dir = path + "/" + generation;
  SK_ASSIGN_OR_RETURN(const LeaseView lease, ReadLease(storage, dir));
  if (lease.verdict == LeaseVerdict::kLive) {
    return InvalidArgumentError(dir + " is kept: a save in flight holds its lease (" +
                                lease.description + ")");
  }
  Result<std::string> record = storage.ReadAll(RecordFile(path));
  if (record.ok()) {
    Result<format::CommitRecord> decoded =
        format::DecodeCommitRecord(*record, RecordFile(path));
    if (!decoded.ok() || decoded->data_folder == generation) {
      return InvalidArgumentError(dir + " is kept: " +
                                  (decoded.ok() ? "it holds the committed checkpoint"
                                                : "the commit record beside it (" +
                                                      decoded.status().ToString() +
                                                      ") may name it"));
    }
  } else if (record.status().code() != StatusCode::kNotFound) {
    return record.status();
  }
  Result<std::vector<std::string>> names = storage.List(dir);
  if (names.status().code() == StatusCode::kNotFound) return Status::Ok();
  SK_RETURN_IF_ERROR(names.status());
  for (const std::string& name : *names) {
    if (!format::LeaseSequenceOf(name)) continue;
    const Status deleted = storage.DeleteFile(dir + "/" + name);
    if (!deleted.ok() && deleted.code() != StatusCode::kNotFound) return deleted;
  }
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

Status CheckCommitTarget(Storage& storage, const std::string& path, bool force,
                         bool generations, const std::string& force_hint) {
  if (force) return Status::Ok();
  SK_ASSIGN_OR_RETURN(bool committed, storage.Exists(RecordFile(path)));
  if (committed) {
    return AlreadyExistsError("a checkpoint is already committed at " + path + "; " +
                              force_hint);
  }
  Result<std::vector<std::string>> entries = storage.List(path);
  if (entries.status().code() == StatusCode::kNotFound) return Status::Ok();
  SK_RETURN_IF_ERROR(entries.status());
  for (const std::string& entry : *entries) {
    if (generations && format::IsGenerationFolderName(entry)) continue;
    if (generations) {
      return AlreadyExistsError(path + " holds " + entry +
                                " but no _SHARDKEEP, so it is not a shardkeep checkpoint; " +
                                force_hint);
    }
    return AlreadyExistsError(path + " exists, is not empty and is not a shardkeep "
                                     "checkpoint; " + force_hint);
  }
  return Status::Ok();
}

// 64 random bits: two saves to one path drawing the same one is not a
// concern.
std::string NewGenerationName() {
  std::random_device device;
  const uint64_t id = (uint64_t{device()} << 32) ^ device() ^
                      static_cast<uint64_t>(std::chrono::steady_clock::now()
                                                .time_since_epoch()
                                                .count());
  return std::string(format::kGenerationPrefix) + format::Hex64(id);
}

CommitTarget::CommitTarget(Storage& storage, std::string path, std::string context)
    : storage_(storage),
      path_(std::move(path)),
      context_(std::move(context)),
      renames_(storage.features().atomic_rename),
      folder_(renames_ ? TemporaryFolderOf(path_) : "") {}

Status CommitTarget::CheckUsable() const {
  const StorageFeatures features = storage_.features();
  if (features.atomic_rename || features.conditional_create) return Status::Ok();
  return InvalidArgumentError(context_ +
                              ": the storage can neither rename atomically nor create a "
                              "file only if absent, so nothing can be committed there");
}

std::optional<std::string> CommitTarget::data_folder() const {
  if (renames_) return std::nullopt;
  return generation_;
}

Status CommitTarget::Prepare(bool force, const std::string& force_hint) {
  SK_RETURN_IF_ERROR(CheckCommitTarget(storage_, path_, force, !renames_, force_hint)
                         .WithContext(context_));
  if (!renames_) {
    generation_ = NewGenerationName();
    folder_ = path_ + "/" + generation_;
    // The lease is the generation's first object: it never exists without.
    SK_ASSIGN_OR_RETURN(lease_, LeaseHolder::Acquire(storage_, folder_));
    return Status::Ok();
  }
  // The temporary folder exists for a moment before its lease: a collector
  // that looks then may take it (docs/FORMAT.md §7), and the lease's write
  // finds no folder. Rare, so it is simply tried again.
  constexpr int kAttempts = 3;
  for (int attempt = 1;; ++attempt) {
    SK_ASSIGN_OR_RETURN(const LeaseView other, ReadLease(storage_, folder_));
    if (other.verdict == LeaseVerdict::kLive) {
      return AlreadyExistsError(context_ + ": another save of " + path_ +
                                " is in flight: " + folder_ + " is " + other.description);
    }
    SK_RETURN_IF_ERROR(DiscardFolder(storage_, folder_).WithContext(context_));
    SK_RETURN_IF_ERROR(storage_.CreateDir(folder_).WithContext(context_));
    Result<std::unique_ptr<LeaseHolder>> lease = LeaseHolder::Acquire(storage_, folder_);
    if (lease.ok()) {
      lease_ = std::move(*lease);
      return Status::Ok();
    }
    if (lease.status().code() != StatusCode::kNotFound) {
      return lease.status().WithContext(context_);
    }
    if (attempt == kAttempts) {
      return LeaseLostError(context_ + ": another process removed " + folder_ + " " +
                            std::to_string(kAttempts) +
                            " times as this save created it (" + lease.status().ToString() +
                            "); nothing was written");
    }
  }
}

Status CommitTarget::Adopt(const std::string& generation) {
  if (renames_ || !format::IsGenerationFolderName(generation)) {
    return InternalError(context_ + ": '" + generation + "' is not a generation folder name");
  }
  generation_ = generation;
  folder_ = path_ + "/" + generation_;
  return Status::Ok();
}

Status CommitTarget::CheckLease() {
  return lease_ == nullptr ? Status::Ok() : lease_->Check().WithContext(context_);
}

Status CommitTarget::CheckWhole(const std::vector<std::string>& files) {
  std::map<std::string, std::set<std::string>> by_folder;
  for (const std::string& file : files) {
    const size_t slash = file.rfind('/');
    const std::string dir = slash == std::string::npos ? "" : file.substr(0, slash);
    by_folder[dir].insert(file.substr(slash + 1));
  }
  std::vector<std::string> missing;
  for (const auto& [dir, names] : by_folder) {
    Result<std::vector<std::string>> present =
        storage_.List(dir.empty() ? folder_ : folder_ + "/" + dir);
    if (!present.ok() && present.status().code() != StatusCode::kNotFound) {
      return present.status().WithContext(context_ + ": checking its folder before the commit");
    }
    const std::set<std::string> found =
        present.ok() ? std::set<std::string>(present->begin(), present->end())
                     : std::set<std::string>();
    for (const std::string& name : names) {
      if (!found.contains(name)) missing.push_back(dir.empty() ? name : dir + "/" + name);
    }
  }
  if (missing.empty()) return Status::Ok();
  std::string list;
  for (size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", " : "") + missing[i];
  if (missing.size() > 5) list += " and " + std::to_string(missing.size() - 5) + " more";
  return LeaseLostError(context_ + ": " + folder_ + " lost files before the commit (" + list +
                        "): another process removed them; nothing was committed");
}

Status CommitTarget::Commit(const std::string& record, bool force,
                            const std::vector<std::string>& files) {
  Status checked = CheckLease();
  if (checked.ok()) checked = CheckWhole(files);
  if (!checked.ok()) {
    ReleaseLease(folder_);
    return checked;
  }
  Status committed =
      renames_ ? MakeVisible(storage_, folder_, path_).WithContext(context_)
               : CommitGeneration(storage_, path_, generation_, record, force, context_);
  // Renamed, the lease file now lies in the checkpoint; a crash before its
  // deletion leaves it there, where nothing reads it.
  ReleaseLease(renames_ && committed.ok() ? path_ : folder_);
  return committed;
}

void CommitTarget::ReleaseLease(const std::string& folder_now) {
  if (lease_ == nullptr) return;
  lease_->Release(folder_now);
  lease_.reset();
}

void CommitTarget::Discard() {
  // Renewing no more first, so that no renewal writes into what is
  // deleted; the lease file goes with the folder (one request fewer on a
  // store that may be failing).
  if (lease_ != nullptr) {
    lease_->StopRenewing();
    lease_.reset();
  }
  if (renames_) {
    (void)DiscardFolder(storage_, folder_);
  } else if (!generation_.empty()) {
    // A generation never holds a commit record: no order to keep.
    (void)storage_.DeleteRecursive(folder_);
  }
}

Status CommitGeneration(Storage& storage, const std::string& path,
                        const std::string& generation, const std::string& record,
                        bool force, const std::string& context) {
  std::optional<std::string> replaced;
  if (force) {
    SK_ASSIGN_OR_RETURN(replaced, RemoveRecord(storage, path, context));
  }
  const std::string file = RecordFile(path);
  const Status created = storage.WriteIfAbsent(file, record);
  if (created.ok()) {
    RemoveOtherGenerations(storage, path, generation, force);
    return Status::Ok();
  }
  if (created.code() == StatusCode::kAlreadyExists) {
    return AlreadyExistsError(context + ": another save committed " + path + " first (" +
                              created.ToString() + ")");
  }
  // The request failed, but the record may have been stored all the same
  // (a reply lost on the way back): the record says.
  Result<std::string> stored = storage.ReadAll(file);
  if (stored.ok() && *stored == record) {
    RemoveOtherGenerations(storage, path, generation, force);
    return Status::Ok();
  }
  if (stored.ok()) {
    return AlreadyExistsError(context + ": another save committed " + path +
                              " first (writing _SHARDKEEP: " + created.ToString() + ")");
  }
  if (stored.status().code() != StatusCode::kNotFound) {
    return CommitStateUnknownError(
        context + ": writing " + file + " failed (" + created.ToString() +
        ") and reading it back failed too (" + stored.status().ToString() +
        "); the checkpoint may or may not be committed: check it before relying on it");
  }
  if (!replaced) return created.WithContext(context + ": nothing was committed");
  return RestoreRecord(storage, path, *replaced, created, context);
}

}  // namespace shardkeep::internal
