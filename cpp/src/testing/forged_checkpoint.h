// Tests of hostile checkpoints edit files a save wrote. The commit record
// lists the checksum of each checkpointable's meta.json and value file, so
// a producer that wants its edits read must list the new checksums, as
// this does: it then reaches the checks behind the checksums.
#pragma once

#include <string>

#include "shardkeep/status.h"
#include "shardkeep/storage.h"

namespace shardkeep::testdata {

// Rewrites the commit record of the checkpoint at `path` with the
// checksums of its checkpointables' meta.json and value files as they are
// now. The record itself must be intact (it is decoded first).
Status RelistCheckpointFiles(Storage& storage, const std::string& path);

}  // namespace shardkeep::testdata
