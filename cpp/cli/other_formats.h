// Other formats' checkpoints, recognised by their files so that the tool
// says what a folder is instead of "not a checkpoint" or a missing
// _SHARDKEEP: shardkeep reads Orbax and PyTorch DCP checkpoints (from
// Python, read-only) but never writes them. The markers are the Python
// front's (python/shardkeep/loading/other_formats.py): this tool has no
// Python to ask. Local paths only, as there.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace shardkeep::cli {

struct OtherFormat {
  std::string format;       // "orbax" or "dcp", as `convert --from` names it
  std::string description;  // "an Orbax checkpoint (CheckpointManager step 5)"
  std::string brief;        // for `ls`: "orbax step 5, read-only"
  std::optional<int64_t> step;  // an Orbax CheckpointManager step folder's
  bool root = false;            // an Orbax CheckpointManager root (of steps)
};

// What the local folder `path` holds when it is an Orbax or DCP
// checkpoint (or an Orbax CheckpointManager root), else nullopt.
std::optional<OtherFormat> FindOtherFormat(const std::string& path);

// When `url` is a local Orbax or DCP checkpoint, prints to stderr that
// `shardkeep <command>` works on shardkeep checkpoints, what `url` is, and
// how to read or convert it, and returns true; else prints nothing.
bool ExplainOtherFormat(const std::string& command, const std::string& url);

}  // namespace shardkeep::cli
