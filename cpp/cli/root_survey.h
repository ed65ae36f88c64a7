// What lies under a checkpoint root, for `ls` and `gc`: each entry's state
// (ListCheckpoints), the commit record of each checkpoint, the bytes each
// entry holds and, on a local file system, when it was last written.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cli_support.h"
#include "shardkeep/checkpoint_root.h"
#include "shardkeep/contents.h"
#include "shardkeep/status.h"

namespace shardkeep::cli {

struct SurveyedEntry {
  RootEntry entry;
  std::string url;  // root URL + name
  // Committed: its decoded commit record.
  std::optional<CheckpointInfo> info;
  // Committed, rejected and leftovers (not "other" entries, which may be
  // anyone's data): the files below it.
  std::optional<FolderUsage> usage;
  // Local roots only: the newest modification time below the entry.
  std::optional<int64_t> modified_ns;
  // Why the entry could not be read (e.g. deleted while being surveyed).
  Status problem;
};

// Every entry directly under `root`, sorted by name. Fails only when the
// root cannot be listed.
Result<std::vector<SurveyedEntry>> SurveyRoot(const OpenedLocation& root);

}  // namespace shardkeep::cli
