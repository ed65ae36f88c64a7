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
#include <functional>
#include <optional>
#include <string>
#include <string_view>
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

// Saves in flight. A save writes into a folder that looks like a leftover
// until it commits (a temporary folder, or a generation on storage without
// rename), so it holds a lease on that folder: lease files it renews while
// it works (the protocol, and how clocks are allowed to disagree, is in
// the project's docs/FORMAT.md, "Leases"). Every function here that
// deletes honours them: a folder a live lease covers is never removed; a
// lease whose holder is gone (its process no longer runs on this machine)
// or that went unrenewed past its duration plus an allowance for clocks
// makes the folder a leftover again. Just before its commit a save checks
// that its lease is still its own and its files are all there, and fails
// with LeaseLost otherwise.
inline constexpr char kLeaseFilePrefix[] = ".shardkeep-lease-";

// Where a save to `path` writes before its commit on storage with rename:
// <path>.shardkeep-tmp.
std::string TemporaryFolderOf(const std::string& path);

// A managed root's layout (docs/MANAGER.md): step s of a CheckpointManager
// is the folder named by its decimal digits, zero-padded to `width`
// ("000000100" for step 100, width 9). REQUIRES: step >= 0.
std::string StepFolderName(int64_t step, int width);
// The step a folder name under a managed root names: a name of ASCII digits
// only (any padding: a root written with another width still lists),
// nullopt for anything else, such as a leftover's suffixed name, or digits
// beyond int64.
std::optional<int64_t> StepOfFolderName(std::string_view name);

// A local tier's root holds one folder per slice, "p<q>" for the slice of
// process q, each a managed root of that slice's steps.
std::string SliceFolderName(int process);
// The process whose slice a folder name under a local tier's root holds
// ("p3" → 3), nullopt for any other name.
std::optional<int> SliceOfFolderName(std::string_view name);

enum class EntryState {
  kCommitted,     // <name>/_SHARDKEEP exists and decodes
  kRejected,      // <name>/_SHARDKEEP exists but the decoder refuses it
  kTemporary,     // <name> ends in kTemporarySuffix
  // <name> ends in kReplacedSuffix and <base> (<name> without the suffix)
  // is committed: the checkpoint a forced save replaced.
  kReplaced,
  // <name> ends in kReplacedSuffix and <base> is not committed: a forced
  // save that replaces by two renames (storage that cannot exchange, such
  // as NFS) was cut short between them, so this folder holds the only copy
  // of <base>. Not a leftover: nothing removes it. Renaming it back to
  // <base> recovers the checkpoint.
  kOnlyCopy,
  kBeingDeleted,  // <name> ends in kDeletingSuffix
  // Storage without atomic rename only: <name> has no _SHARDKEEP and holds
  // nothing but generation folders (.shardkeep-g<id>), the files of saves
  // that failed, crashed or are under way, or of a deletion cut short.
  kUnfinished,
  kOther,         // anything else: a file, a folder without a commit record
};

// "committed", "rejected", "temporary", "replaced", "only-copy",
// "being-deleted", "unfinished", "other".
const char* EntryStateName(EntryState state);

// Temporary, replaced, being-deleted and unfinished entries: what failed,
// cut-short (or running) saves and deletions leave, and RemoveLeftover
// removes. Never a committed or rejected checkpoint, an only copy, or
// anything else.
bool IsLeftover(EntryState state);

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
// names are classified by their suffix (and a replaced one by whether its
// <base> is committed), never by their content: a temporary folder holding
// a complete _SHARDKEEP is still temporary. An I/O error reading any
// commit record fails the whole listing, naming the file.
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
// the rest but the generations saves in flight hold leases on (a forced
// save to the same path): a crash halfway leaves an unfinished folder,
// never a record over partly deleted files. NotFound when nothing is at
// `path`.
Status DeleteCheckpoint(Storage& storage, const std::string& path);

// Removes a leftover folder: `path` must end in one of the three suffixes
// above, or be the folder of saves that never committed (no _SHARDKEEP,
// nothing but generation folders, which are deleted). InvalidArgument for
// anything else (a committed checkpoint, a folder holding other things),
// so that a checkpoint or someone's data cannot be removed by mistake, for
// an only copy (a <base>.shardkeep-old whose <base> is not committed),
// saying how to recover it, and for a temporary folder or generation a
// save in flight holds a live lease on (naming its holder; the others'
// generations are removed). OK when it does not exist.
Status RemoveLeftover(Storage& storage, const std::string& path);

struct CollectOptions {
  // A save under way looks exactly like a leftover, but holds a lease on
  // its folder (see "Saves in flight" above), which every collection
  // honours. This adds a second condition: only leftovers in which nothing
  // was written for this long are removed (for saves by builds older than
  // leases, which hold none). 0: the leases alone decide.
  double min_age_s = 0;
  // When anything below root/<name> was last written (ns since the Unix
  // epoch), or nullopt when unknown (the Storage interface reports no
  // times). Consulted only when min_age_s > 0; a leftover of unknown age
  // is then kept.
  std::function<std::optional<int64_t>(const std::string& name)> modified_ns;
  // Decide, but remove nothing.
  bool dry_run = false;
};

// What CollectLeftovers did with one entry.
struct CollectedEntry {
  enum class Outcome {
    kRemoved,      // a leftover, removed (with dry_run: would be)
    kNotLeftover,  // an only copy or a rejected checkpoint: never removed
    kTooRecent,    // a leftover written less than min_age_s ago
    kAgeUnknown,   // a leftover whose age is unknown, with min_age_s > 0
    kFailed,       // a leftover whose removal failed (`problem` says why)
    // A save in flight holds a live lease on it, or it turned into a
    // committed checkpoint meanwhile; `problem` says which (whose lease).
    kInUse,
  };
  std::string name;
  EntryState state = EntryState::kOther;
  Outcome outcome = Outcome::kRemoved;
  std::optional<double> age_s;  // when known and consulted
  // kFailed: the removal's error. An only copy: InvalidArgument saying
  // how to recover it (OnlyCopyAdvice).
  Status problem;
};

// Removes the leftovers among `entries` (ListCheckpoints of `root`), with
// RemoveLeftover, and reports every entry it removed or kept: leftovers,
// only copies and rejected checkpoints (committed and other entries are
// not reported). A failed removal is reported, not returned: the next
// collection retries it. The one policy shared by `shardkeep gc`, the
// CheckpointManager's root and the local tier's slice folders.
std::vector<CollectedEntry> CollectLeftovers(Storage& storage, const std::string& root,
                                             const std::vector<RootEntry>& entries,
                                             const CollectOptions& options);

// How to get back the checkpoint an only copy (`path`, ending in
// kReplacedSuffix) holds, in words, for messages.
std::string OnlyCopyAdvice(const std::string& path);

}  // namespace shardkeep
