// The checkpoints under one root folder: listing them, telling committed
// from unfinished, and deleting them, all through the Storage interface.
// Tools that manage many checkpoints (the Python CheckpointManager, the
// command line) use these calls instead of walking folders themselves, so
// they work on every backend and call a checkpoint committed exactly when a
// reader would open it: its _SHARDKEEP exists and the core's decoder
// accepts it (right format, a version this build reads, well formed).
//
// Every function is safe to call from many threads at once; none keeps
// state between calls.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardkeep/status.h"
#include "shardkeep/storage.h"

namespace shardkeep {

// Suffixes of the names a checkpoint's folder takes while it is being
// written, replaced or deleted; each sits beside <name> in the same folder.
// (Storage without rename, such as object stores, uses none of them: a save
// writes a generation folder inside <name>, see kUnfinished.)
inline constexpr char kTemporarySuffix[] = ".shardkeep-tmp";   // a save
inline constexpr char kReplacedSuffix[] = ".shardkeep-old";    // force=True
inline constexpr char kDeletingSuffix[] = ".shardkeep-deleting";

enum class EntryState {
  kCommitted,     // <name>/_SHARDKEEP exists and decodes
  kRejected,      // <name>/_SHARDKEEP exists but the decoder refuses it
  kTemporary,     // <name> ends in kTemporarySuffix
  kReplaced,      // <name> ends in kReplacedSuffix
  kBeingDeleted,  // <name> ends in kDeletingSuffix
  // Storage without atomic rename only: <name> has no _SHARDKEEP and holds
  // nothing but generation folders (.shardkeep-g<id>), the files of saves
  // that failed, crashed or are under way, or of a deletion cut short.
  kUnfinished,
  kOther,         // anything else: a file, a folder without a commit record
};

// "committed", "rejected", "temporary", "replaced", "being-deleted",
// "unfinished", "other".
const char* EntryStateName(EntryState state);

struct RootEntry {
  std::string name;  // the child's name under the root (not a path)
  EntryState state = EntryState::kOther;
  // kCommitted: the commit record as stored, and its "step" (absent when
  // the record's step is null).
  std::string commit_json;
  std::optional<int64_t> step;
  // kRejected: why (a CorruptionError or IncompatibleError naming the file).
  Status problem;
};

// The entries directly under `root`, sorted by name. A root that does not
// exist holds nothing (an object store has no empty folders). Suffixed
// names are classified by their suffix alone: a temporary folder holding a
// complete _SHARDKEEP is still temporary. An I/O error reading any commit
// record fails the whole listing, naming the file.
Result<std::vector<RootEntry>> ListCheckpoints(Storage& storage,
                                               const std::string& root);

// The commit record of the checkpoint at `path`, checked by the core's
// decoder. NotFound when there is none; Corruption or Incompatible when the
// decoder refuses it.
Result<std::string> ReadCommitRecord(Storage& storage, const std::string& path);

// Deletes the checkpoint (or any folder) at `path` so that no crash leaves
// a half-deleted folder under its name: renames it to
// <path>.shardkeep-deleting (removing a leftover of an earlier, cut-short
// deletion first), makes the rename durable, then deletes recursively. On
// storage without atomic rename it deletes <path>/_SHARDKEEP first, then
// the rest: a crash halfway leaves an unfinished folder, never a record
// over partly deleted files. NotFound when nothing is at `path`.
Status DeleteCheckpoint(Storage& storage, const std::string& path);

// Removes a leftover folder: `path` must end in one of the three suffixes
// above, or be the folder of saves that never committed (no _SHARDKEEP,
// nothing but generation folders, which are deleted). InvalidArgument for
// anything else (a committed checkpoint, a folder holding other things),
// so that a checkpoint or someone's data cannot be removed by mistake. OK
// when it does not exist.
Status RemoveLeftover(Storage& storage, const std::string& path);

}  // namespace shardkeep
