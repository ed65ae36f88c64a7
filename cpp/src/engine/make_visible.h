// The commit point of a save, and of a copy, which commits the same way:
// on storage that renames, moving the finished temporary checkpoint folder
// to its path; on storage without rename (object stores), creating the
// commit record that names the finished generation folder. Either replaces
// what is there when asked to (`force`).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/lease.h"
#include "shardkeep/checkpoint_root.h"  // the folder suffixes
#include "shardkeep/storage.h"

namespace shardkeep::internal {

// Moves the complete checkpoint folder `tmp` to `path` and makes that
// durable (fsync of the parent folder). When `path` exists it is replaced:
//  - by one Exchange(tmp, path) where the backend and the file system can
//    swap atomically, so `path` always holds one whole checkpoint, even
//    across a crash; the previous one then sits at `tmp` and is deleted;
//  - otherwise by two renames, <path> → <path>.shardkeep-old
//    (kReplacedSuffix) and tmp → <path>; a crash between them leaves
//    nothing at `path` and the previous checkpoint whole at
//    <path>.shardkeep-old, which ListCheckpoints calls an only copy.
// OK: committed. A non-OK status other than CommitStateUnknown: nothing
// changed at `path`, and `tmp` still holds the new checkpoint (for the
// caller to delete). CommitStateUnknown: a step failed and so did putting
// things back; the message says where the new and the previous checkpoint
// are. Deleting the previous checkpoint after the commit is best effort: a
// leftover at `tmp` or <path>.shardkeep-old is removed by the next save.
Status MakeVisible(Storage& storage, const std::string& tmp,
                   const std::string& path);

// Deletes a folder that may hold a whole checkpoint (a previous one moved
// aside, a stale temporary folder), commit record first: a crash halfway
// through then leaves a folder with no `_SHARDKEEP`, never one whose record
// still decodes while its data files are partly gone.
Status DiscardFolder(Storage& storage, const std::string& dir);

// Deletes the generation folder `generation` of the checkpoint at `path`,
// unless a live lease covers it (a save in flight) or the commit record at
// `path` names it (or cannot be decoded): InvalidArgument saying which.
// The record is read after the lease, and a save creates its record before
// it releases its lease, so a save that committed meanwhile is never taken
// for a dead one. The lease files go first, so that a holder stalled past
// its lease learns at its next renewal or check that its files are being
// deleted. OK when it does not exist.
Status DiscardGeneration(Storage& storage, const std::string& path,
                         const std::string& generation);

// Refuses, unless `force`, a commit at `path` that would replace something:
// a committed checkpoint, or a folder holding anything else (with
// `generations`, the layout of storage without rename, the generation
// folders of other saves are no obstacle: they are not checkpoints).
// AlreadyExists, ending with `force_hint` ("pass force=True to replace it").
Status CheckCommitTarget(Storage& storage, const std::string& path, bool force,
                         bool generations, const std::string& force_hint);

// A fresh generation folder name: ".shardkeep-g" and 16 random hex digits.
std::string NewGenerationName();

// The commit point on storage without rename: creates <path>/_SHARDKEEP
// holding `record` (which names `generation`) with WriteIfAbsent. With
// `force`, the committed record is deleted first and put back if the
// creation fails. After the commit every other generation at `path` is
// deleted (with `force`, every other entry), best effort.
// AlreadyExists: another save committed first. CommitStateUnknown: whether
// the record exists could not be learnt. `context` opens every message
// ("save of <path>").
Status CommitGeneration(Storage& storage, const std::string& path,
                        const std::string& generation, const std::string& record,
                        bool force, const std::string& context);

// The one place that decides how a save or a copy commits at `path`, from
// the storage's features: where the files are written before the commit,
// what is prepared and discarded, and the commit point itself. The
// committing process holds a lease on the folder from Prepare until the
// commit or Discard (engine/lease.h), so that collectors leave it alone.
//  - Renaming (StorageFeatures::atomic_rename): the files go to
//    <path>.shardkeep-tmp, which MakeVisible moves to <path>.
//  - Generations (no atomic rename, conditional_create: object stores):
//    the files go to a generation folder <path>/.shardkeep-g<id>, which
//    CommitGeneration commits by creating <path>/_SHARDKEEP.
// Holds `storage` by reference: it must outlive the target. Not
// thread-safe; one operation owns it.
class CommitTarget {
 public:
  // `context` opens the messages ("save of <path>").
  CommitTarget(Storage& storage, std::string path, std::string context);

  // InvalidArgument where the storage offers neither way: nothing can
  // commit there.
  Status CheckUsable() const;
  bool renames() const { return renames_; }
  // Where the files go before the commit: <path>.shardkeep-tmp, or the
  // generation folder once drawn (Prepare) or learnt (Adopt).
  const std::string& folder() const { return folder_; }
  // The commit record's data_folder: the generation, nullopt when renaming.
  std::optional<std::string> data_folder() const;

  // The committing process's preparation: refuses, unless `force`, a path
  // that holds something (CheckCommitTarget, ending with `force_hint`);
  // then, renaming, refuses a temporary folder another save holds a live
  // lease on (AlreadyExists naming it), deletes a stale one and creates it
  // afresh; with generations, draws a fresh one and deletes nothing
  // (another job may be writing its own generation there). Either way it
  // takes the lease of the folder before anything is written into it.
  Status Prepare(bool force, const std::string& force_hint);
  // The other processes of a save, generations only: the generation the
  // committing process drew. Internal for a name that is not one.
  Status Adopt(const std::string& generation);
  // The commit point, replacing what is at the path when `force`.
  // Renaming: folder() must hold the whole checkpoint, its _SHARDKEEP
  // included, durably; `record` is not used. Generations: creates
  // <path>/_SHARDKEEP holding `record` (which must name data_folder()).
  // First checks that the lease is still this target's and that
  // folder() still holds every file of `files` (paths relative to it):
  // LeaseLost naming what is missing otherwise, and nothing is committed.
  // Releases the lease afterwards, whatever the outcome.
  Status Commit(const std::string& record, bool force,
                const std::vector<std::string>& files);
  // LeaseLost when the lease this process holds was lost (OK when it holds
  // none): what explains a failed write into a folder another process
  // removed.
  Status CheckLease();
  // After a failure that left no commit: deletes folder(), best effort
  // (the next commit at the path removes what is left), and releases the
  // lease.
  void Discard();

 private:
  Storage& storage_;
  const std::string path_;
  const std::string context_;
  const bool renames_;
  // The files of Commit's `files` missing from folder(), listed by folder.
  Status CheckWhole(const std::vector<std::string>& files);
  void ReleaseLease(const std::string& folder_now);

  std::string generation_;  // generations: once drawn or learnt
  std::string folder_;
  std::unique_ptr<LeaseHolder> lease_;  // the committing process's, from Prepare
};

}  // namespace shardkeep::internal
