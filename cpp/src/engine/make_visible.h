// The commit point of a save: moving the finished temporary checkpoint
// folder to its path, replacing what is there (a save with `force`).
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

}  // namespace shardkeep::internal
