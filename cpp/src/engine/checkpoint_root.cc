#include "shardkeep/checkpoint_root.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <string_view>

#include "engine/checked_read.h"
#include "engine/lease.h"
#include "engine/make_visible.h"
#include "format/commit_record.h"

namespace shardkeep {
namespace {

std::string Join(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

std::string ParentOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// `name` without kReplacedSuffix. REQUIRES: it ends in it.
std::string_view BaseOfReplaced(std::string_view name) {
  return name.substr(0, name.size() - std::string_view(kReplacedSuffix).size());
}

// The state a name's suffix alone decides, if any (a replaced name's state
// also depends on its base, see ListCheckpoints).
std::optional<EntryState> StateOfSuffix(std::string_view name) {
  if (name.ends_with(kTemporarySuffix)) return EntryState::kTemporary;
  if (name.ends_with(kReplacedSuffix)) return EntryState::kReplaced;
  if (name.ends_with(kDeletingSuffix)) return EntryState::kBeingDeleted;
  return std::nullopt;
}

// Whether `path` holds generation folders (at least one) and nothing else.
// False when it does not exist (or is a file).
Result<bool> HoldsOnlyGenerations(Storage& storage, const std::string& path) {
  Result<std::vector<std::string>> names = storage.List(path);
  if (names.status().code() == StatusCode::kNotFound) return false;
  SK_RETURN_IF_ERROR(names.status());
  if (names->empty()) return false;
  return std::all_of(names->begin(), names->end(), [](const std::string& name) {
    return format::IsGenerationFolderName(name);
  });
}

// Reads and decodes the commit record `file` (twice on remote storage when
// the first copy fails its checks: engine/checked_read.h); the decoded
// record goes to `record` when it is accepted.
Result<internal::CheckedBytes> ReadRecord(Storage& storage, const std::string& file,
                                          std::optional<format::CommitRecord>& record) {
  return internal::ReadAllChecked(storage, file, [&](const std::string& bytes) {
    Result<format::CommitRecord> decoded = format::DecodeCommitRecord(bytes, file);
    if (decoded.ok()) record = std::move(*decoded);
    return decoded.status();
  });
}

// Reads and decodes <path>/_SHARDKEEP; fills `entry` as committed, rejected,
// unfinished or other. Only an I/O error is returned.
Status Classify(Storage& storage, const std::string& path, RootEntry& entry) {
  const std::string file = Join(path, format::kCommitFileName);
  // Exists() first: on a file system, a plain file at `path` makes the read
  // fail with "not a directory", which is no commit record either.
  SK_ASSIGN_OR_RETURN(const bool exists, storage.Exists(file));
  if (!exists) {
    // Only saves on storage without rename write generations; elsewhere a
    // listing would cost a List per entry (and fail on plain files).
    if (storage.features().atomic_rename) return Status::Ok();
    SK_ASSIGN_OR_RETURN(const bool unfinished, HoldsOnlyGenerations(storage, path));
    if (unfinished) entry.state = EntryState::kUnfinished;
    return Status::Ok();
  }
  std::optional<format::CommitRecord> record;
  Result<internal::CheckedBytes> read = ReadRecord(storage, file, record);
  // Gone since Exists(): deleted (or renamed away) meanwhile.
  if (read.status().code() == StatusCode::kNotFound) return Status::Ok();
  SK_RETURN_IF_ERROR(read.status());
  if (!read->check.ok()) {
    entry.state = EntryState::kRejected;
    entry.problem = read->check;
    return Status::Ok();
  }
  entry.state = EntryState::kCommitted;
  entry.step = record->step;
  entry.commit_json = std::move(read->bytes);
  return Status::Ok();
}

}  // namespace

const char* EntryStateName(EntryState state) {
  switch (state) {
    case EntryState::kCommitted: return "committed";
    case EntryState::kRejected: return "rejected";
    case EntryState::kTemporary: return "temporary";
    case EntryState::kReplaced: return "replaced";
    case EntryState::kOnlyCopy: return "only-copy";
    case EntryState::kBeingDeleted: return "being-deleted";
    case EntryState::kUnfinished: return "unfinished";
    case EntryState::kOther: return "other";
  }
  return "other";
}

bool IsLeftover(EntryState state) {
  switch (state) {
    case EntryState::kTemporary:
    case EntryState::kReplaced:
    case EntryState::kBeingDeleted:
    case EntryState::kUnfinished:
      return true;
    default:
      return false;
  }
}

std::string OnlyCopyAdvice(const std::string& path) {
  const std::string base(BaseOfReplaced(path));
  return "it holds the only copy of " + base + " (a forced save that replaces by two "
         "renames was cut short between them, and " + base + " holds no committed "
         "checkpoint); rename " + path + " back to " + base + " to recover it";
}

Result<std::vector<RootEntry>> ListCheckpoints(Storage& storage,
                                               const std::string& root) {
  Result<std::vector<std::string>> names = storage.List(root);
  if (names.status().code() == StatusCode::kNotFound) {
    return std::vector<RootEntry>();
  }
  SK_RETURN_IF_ERROR(names.status().WithContext("listing checkpoints under " + root));
  std::vector<RootEntry> entries;
  entries.reserve(names->size());
  for (std::string& name : *names) {
    RootEntry entry;
    entry.name = std::move(name);
    if (std::optional<EntryState> state = StateOfSuffix(entry.name)) {
      entry.state = *state;
    } else {
      SK_RETURN_IF_ERROR(Classify(storage, Join(root, entry.name), entry)
                             .WithContext("listing checkpoints under " + root));
    }
    entries.push_back(std::move(entry));
  }
  // A replaced folder whose base is not committed is all that is left of
  // that checkpoint.
  std::set<std::string_view> committed;
  for (const RootEntry& entry : entries) {
    if (entry.state == EntryState::kCommitted) committed.insert(entry.name);
  }
  for (RootEntry& entry : entries) {
    if (entry.state == EntryState::kReplaced &&
        !committed.contains(BaseOfReplaced(entry.name))) {
      entry.state = EntryState::kOnlyCopy;
    }
  }
  return entries;
}

Result<std::string> ReadCommitRecord(Storage& storage, const std::string& path) {
  const std::string file = Join(path, format::kCommitFileName);
  std::optional<format::CommitRecord> record;
  Result<internal::CheckedBytes> read = ReadRecord(storage, file, record);
  if (read.status().code() == StatusCode::kNotFound) {
    return NotFoundError("no committed checkpoint at " + path + ": " + file +
                         " does not exist");
  }
  SK_RETURN_IF_ERROR(read.status());
  SK_RETURN_IF_ERROR(read->check);
  return std::move(read->bytes);
}

namespace {

// Storage without rename: deletes the record first, so the checkpoint stops
// existing before any of its files does, then everything else but the
// generations of saves in flight (internal::DiscardGeneration keeps them).
Status DeleteInPlace(Storage& storage, const std::string& path) {
  const std::string record = Join(path, format::kCommitFileName);
  const Status unrecorded = storage.DeleteFile(record);
  if (!unrecorded.ok() && unrecorded.code() != StatusCode::kNotFound) return unrecorded;
  Result<std::vector<std::string>> names = storage.List(path);
  if (names.status().code() == StatusCode::kNotFound) return Status::Ok();
  SK_RETURN_IF_ERROR(names.status());
  bool kept = false;
  for (const std::string& name : *names) {
    if (!format::IsGenerationFolderName(name)) {
      SK_RETURN_IF_ERROR(storage.DeleteRecursive(Join(path, name)));
      continue;
    }
    const Status discarded = internal::DiscardGeneration(storage, path, name);
    if (discarded.code() == StatusCode::kInvalidArgument) {
      kept = true;  // a save in flight's
      continue;
    }
    SK_RETURN_IF_ERROR(discarded);
  }
  // The folder itself, where the store keeps folder entries (SeaweedFS).
  return kept ? Status::Ok() : storage.DeleteRecursive(path);
}

}  // namespace

Status DeleteCheckpoint(Storage& storage, const std::string& path) {
  const std::string doomed = path + kDeletingSuffix;
  const std::string context = "deleting checkpoint " + path;
  SK_ASSIGN_OR_RETURN(const bool exists, storage.Exists(path));
  if (!exists) return NotFoundError(context + ": nothing is there");
  if (!storage.features().atomic_rename) {
    return DeleteInPlace(storage, path).WithContext(context);
  }
  // A deletion of the same name cut short earlier would block the rename.
  SK_RETURN_IF_ERROR(storage.DeleteRecursive(doomed).WithContext(context));
  SK_RETURN_IF_ERROR(storage.Rename(path, doomed).WithContext(context));
  // Durable before anything is removed: otherwise a power loss could bring
  // the name back over a half-deleted folder.
  SK_RETURN_IF_ERROR(storage.SyncDir(ParentOf(path)).WithContext(context));
  return storage.DeleteRecursive(doomed).WithContext(context);
}

namespace {

// A temporary folder: unless a save in flight holds its lease, renamed to
// <path>.shardkeep-deleting before it is deleted. The rename is atomic
// against the save that owns the name: if that save was only starting
// (its lease not yet written when this looked), either its commit renames
// the folder first and this rename finds nothing, or this one wins and
// the save fails with LeaseLost; no deletion is ever half done under a
// name a save commits.
Status RemoveTemporary(Storage& storage, const std::string& path,
                       const std::string& context) {
  SK_ASSIGN_OR_RETURN(const internal::LeaseView lease, internal::ReadLease(storage, path));
  if (lease.verdict == internal::LeaseVerdict::kLive) {
    return InvalidArgumentError(context + ": a save in flight holds its lease (" +
                                lease.description + ")");
  }
  if (!storage.features().atomic_rename) {
    return internal::DiscardFolder(storage, path).WithContext(context);
  }
  const std::string doomed = path + kDeletingSuffix;
  SK_RETURN_IF_ERROR(storage.DeleteRecursive(doomed).WithContext(context));
  const Status renamed = storage.Rename(path, doomed);
  if (renamed.code() == StatusCode::kNotFound) return Status::Ok();
  SK_RETURN_IF_ERROR(renamed.WithContext(context));
  return storage.DeleteRecursive(doomed).WithContext(context);
}

// Why a leftover in `state` at `path` is a save in flight: the
// description of a live lease on it (a temporary folder) or on one of its
// generations (an unfinished folder); nullopt when none is live.
Result<std::optional<std::string>> LiveLeaseIn(Storage& storage, const std::string& path,
                                               EntryState state) {
  std::vector<std::string> folders;
  if (state == EntryState::kTemporary) folders.push_back(path);
  if (state == EntryState::kUnfinished) {
    Result<std::vector<std::string>> names = storage.List(path);
    if (names.status().code() == StatusCode::kNotFound) return std::optional<std::string>();
    SK_RETURN_IF_ERROR(names.status());
    for (const std::string& name : *names) folders.push_back(Join(path, name));
  }
  for (const std::string& folder : folders) {
    SK_ASSIGN_OR_RETURN(const internal::LeaseView lease, internal::ReadLease(storage, folder));
    if (lease.verdict == internal::LeaseVerdict::kLive) {
      return std::optional<std::string>("a save in flight holds the lease of " + folder +
                                        " (" + lease.description + ")");
    }
  }
  return std::optional<std::string>();
}

}  // namespace

Status RemoveLeftover(Storage& storage, const std::string& path) {
  const std::string context = "removing leftover " + path;
  if (std::string_view(path).ends_with(kReplacedSuffix)) {
    const std::string base(BaseOfReplaced(path));
    Result<std::string> replacement = ReadCommitRecord(storage, base);
    const StatusCode code = replacement.status().code();
    if (code == StatusCode::kNotFound || code == StatusCode::kCorruption ||
        code == StatusCode::kIncompatible) {
      SK_ASSIGN_OR_RETURN(const bool exists, storage.Exists(path));
      if (!exists) return Status::Ok();
      return InvalidArgumentError(context + ": " + OnlyCopyAdvice(path));
    }
    SK_RETURN_IF_ERROR(replacement.status().WithContext(context));
  }
  if (std::string_view(path).ends_with(kTemporarySuffix)) {
    return RemoveTemporary(storage, path, context);
  }
  if (StateOfSuffix(path)) {
    return internal::DiscardFolder(storage, path).WithContext(context);
  }
  SK_ASSIGN_OR_RETURN(const bool committed,
                      storage.Exists(Join(path, format::kCommitFileName)));
  if (committed) {
    return InvalidArgumentError(context + ": it is a committed checkpoint");
  }
  Result<std::vector<std::string>> names = storage.List(path);
  if (names.status().code() == StatusCode::kNotFound) return Status::Ok();
  SK_RETURN_IF_ERROR(names.status().WithContext(context));
  for (const std::string& name : *names) {
    if (!format::IsGenerationFolderName(name)) {
      return InvalidArgumentError(
          context + ": it holds " + name + ", so it is neither a " + kTemporarySuffix +
          ", " + kReplacedSuffix + " or " + kDeletingSuffix +
          " folder nor the folder of a save that never committed");
    }
  }
  std::vector<std::string> kept;
  for (const std::string& name : *names) {
    const Status discarded = internal::DiscardGeneration(storage, path, name);
    if (discarded.code() == StatusCode::kInvalidArgument) {
      kept.push_back(discarded.message());
      continue;
    }
    SK_RETURN_IF_ERROR(discarded.WithContext(context));
  }
  if (!kept.empty()) {
    std::string why;
    for (const std::string& k : kept) why += (why.empty() ? "" : "; ") + k;
    return InvalidArgumentError(context + ": " + why);
  }
  // The folder itself, now empty: a file system keeps empty directories,
  // and so do object stores that keep folder entries (SeaweedFS), whose
  // listings would still show the name. Only when nothing new appeared
  // below it meanwhile.
  Result<std::vector<std::string>> left = storage.List(path);
  if (left.status().code() == StatusCode::kNotFound || (left.ok() && left->empty())) {
    SK_RETURN_IF_ERROR(storage.DeleteRecursive(path).WithContext(context));
  } else {
    SK_RETURN_IF_ERROR(left.status().WithContext(context));
  }
  return Status::Ok();
}

std::vector<CollectedEntry> CollectLeftovers(Storage& storage, const std::string& root,
                                             const std::vector<RootEntry>& entries,
                                             const CollectOptions& options) {
  using Outcome = CollectedEntry::Outcome;
  const int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  std::vector<CollectedEntry> report;
  for (const RootEntry& entry : entries) {
    const bool leftover = IsLeftover(entry.state);
    if (!leftover && entry.state != EntryState::kOnlyCopy &&
        entry.state != EntryState::kRejected) {
      continue;
    }
    CollectedEntry& done = report.emplace_back();
    done.name = entry.name;
    done.state = entry.state;
    if (!leftover) {
      done.outcome = Outcome::kNotLeftover;
      if (entry.state == EntryState::kOnlyCopy) {
        const std::string path = Join(root, entry.name);
        done.problem =
            InvalidArgumentError("kept " + path + ": " + OnlyCopyAdvice(path));
      }
      continue;
    }
    if (options.min_age_s > 0) {
      const std::optional<int64_t> modified =
          options.modified_ns ? options.modified_ns(entry.name) : std::nullopt;
      if (!modified) {
        done.outcome = Outcome::kAgeUnknown;
        continue;
      }
      done.age_s = static_cast<double>(now_ns - *modified) / 1e9;
      if (*done.age_s < options.min_age_s) {
        done.outcome = Outcome::kTooRecent;
        continue;
      }
    }
    const std::string path = Join(root, entry.name);
    Result<std::optional<std::string>> leased = LiveLeaseIn(storage, path, entry.state);
    if (leased.ok() && *leased) {
      done.outcome = Outcome::kInUse;
      done.problem = InvalidArgumentError("kept " + path + ": " + **leased);
      continue;
    }
    if (options.dry_run) continue;
    done.problem = leased.ok() ? RemoveLeftover(storage, path) : leased.status();
    if (done.problem.code() == StatusCode::kInvalidArgument) {
      done.outcome = Outcome::kInUse;  // a lease taken or a commit made meanwhile
    } else if (!done.problem.ok()) {
      done.outcome = Outcome::kFailed;
    }
  }
  return report;
}

}  // namespace shardkeep
