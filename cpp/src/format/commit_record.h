// `_SHARDKEEP`, the commit record: JSON, written last; a checkpoint exists
// iff this file exists and decodes. Pure encode/decode, no I/O.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardkeep/status.h"

namespace shardkeep::format {

inline constexpr char kCommitFileName[] = "_SHARDKEEP";
inline constexpr int kFormatVersion = 1;
// Saves on storage without rename (object stores) write each attempt into
// its own folder <checkpoint>/.shardkeep-g<16 hex digits>, a "generation";
// the commit record names the one that committed (CommitRecord::data_folder).
inline constexpr char kGenerationPrefix[] = ".shardkeep-g";

struct CheckpointableEntry {
  std::string name;  // also its folder name
  std::string kind;  // "pytree", "json" or "bytes"
};

struct CommitRecord {
  int version = kFormatVersion;
  std::optional<int64_t> step;
  int64_t created_ns = 0;
  int64_t committed_ns = 0;
  int process_count = 1;
  // The folder, relative to the checkpoint, that holds the checkpointable
  // folders: a generation name (IsGenerationFolderName). Absent: the
  // checkpoint's own folder (saves that commit by renaming).
  std::optional<std::string> data_folder;
  std::vector<CheckpointableEntry> checkpointables;  // in save order
  // checkpointable name → index files relative to the checkpointable folder.
  std::map<std::string, std::vector<std::string>> index_files;
  nlohmann::json custom_metadata = nlohmann::json::object();
  nlohmann::json metrics = nlohmann::json::object();
};

std::string EncodeCommitRecord(const CommitRecord& record);

// Refuses a foreign "format", a higher version, missing or mistyped
// fields, and hostile names: a checkpointable name must be a single safe
// path component, index paths must be "index/p<N>.idx" and a data folder a
// generation name. Unknown fields are ignored. Errors name `file`.
Result<CommitRecord> DecodeCommitRecord(std::string_view bytes,
                                        const std::string& file);

// True when `name` can be a checkpointable folder: 1–255 bytes of
// [A-Za-z0-9_.-], not starting with '.', and not "_SHARDKEEP" (the commit
// record lives beside the folders). The one rule for checkpointable names:
// the decoder, every save path (C++ and, through the binding, Python)
// and CheckpointWriter apply it.
bool IsSafeCheckpointableName(std::string_view name);

// OK when IsSafeCheckpointableName(name); otherwise InvalidArgument naming
// it and stating the rule. What a save refuses a bad name with.
Status CheckCheckpointableName(std::string_view name);

// True when `name` is kGenerationPrefix followed by exactly 16 lower-case
// hexadecimal digits.
bool IsGenerationFolderName(std::string_view name);

}  // namespace shardkeep::format
