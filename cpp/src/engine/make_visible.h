// The commit point of a save, and of a copy, which commits the same way:
// on storage that renames, moving the finished temporary checkpoint folder
// to its path; on storage without rename (object stores), creating the
// commit record that names the finished generation folder. Either replaces
// what is there when asked to (`force`).
#pragma once

#include <string>

#include "shardkeep/storage.h"

namespace shardkeep::internal {

// Folder that holds the previous checkpoint between the two renames of a
// replacement on a backend that cannot exchange.
inline constexpr char kOldSuffix[] = ".shardkeep-old";

// Moves the complete checkpoint folder `tmp` to `path` and makes that
// durable (fsync of the parent folder). When `path` exists it is replaced:
//  - by one Exchange(tmp, path) where the backend and the file system can
//    swap atomically, so `path` always holds one whole checkpoint, even
//    across a crash; the previous one then sits at `tmp` and is deleted;
//  - otherwise by two renames, <path> → <path>.shardkeep-old and
//    tmp → <path>; a crash between them leaves nothing at `path` and the
//    previous checkpoint whole at <path>.shardkeep-old.
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

}  // namespace shardkeep::internal
