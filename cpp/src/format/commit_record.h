// `_SHARDKEEP`, the commit record: JSON, written last; a checkpoint exists
// iff this file exists and decodes. From format version 2 it carries the
// checksums of the checkpointables' small files (meta.json, value files)
// and one of its own bytes (docs/FORMAT.md §3). Pure encode/decode, no I/O.
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
// Version 3 added codec 2, chunks compressed as byte planes (FORMAT.md §6).
inline constexpr int kFormatVersion = 3;
// The first version whose records carry checksums: the record's own
// "checksum" and each checkpointable's "meta_checksum" (and, for json and
// bytes values, "value_checksum").
inline constexpr int kFirstChecksummedVersion = 2;
// Saves on storage without rename (object stores) write each attempt into
// its own folder <checkpoint>/.shardkeep-g<16 hex digits>, a "generation";
// the commit record names the one that committed (CommitRecord::data_folder).
inline constexpr char kGenerationPrefix[] = ".shardkeep-g";

struct CheckpointableEntry {
  std::string name;  // also its folder name
  std::string kind;  // "pytree", "json" or "bytes"
  // XXH3-64 of its meta.json as stored, and of its value file (value.json,
  // value.bin) for the kinds that have one. Absent in version-1 records.
  std::optional<uint64_t> meta_checksum;
  std::optional<uint64_t> value_checksum;
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

// From version 2 on, the entries' checksums (when set) and the record's
// own checksum as its last member.
std::string EncodeCommitRecord(const CommitRecord& record);

// Refuses a record whose own checksum does not match its bytes (checked
// before anything else is read), a foreign "format", a higher version, a
// version-2 record without its checksums, missing or mistyped fields, and
// hostile names: a checkpointable name must be a single safe path
// component, index paths must be "index/p<N>.idx" and a data folder a
// generation name. Unknown fields are ignored. Errors name `file`.
Result<CommitRecord> DecodeCommitRecord(std::string_view bytes,
                                        const std::string& file);

// XXH3-64 (seed 0) of `bytes`: the checksum of every file the commit
// record covers, and of the record itself.
uint64_t FileChecksum(std::string_view bytes);

// The entry listing checkpointable `name` saved with these files: its
// checksums (of `value` too unless it is a pytree, which has no value file).
CheckpointableEntry ListCheckpointable(const std::string& name, const std::string& kind,
                                       std::string_view meta_json, std::string_view value);

// Corruption naming `file` unless `bytes` (a checkpointable's meta.json or
// value file, as read) have the checksum `expected` that the commit record
// lists for them. OK when there is none to compare with (version 1).
Status CheckListedChecksum(std::string_view bytes, std::optional<uint64_t> expected,
                           const std::string& file);

// Rewrites the digits of the record's final "checksum" member to match
// the rest of `record` (the encoder's last step), so that a test or fuzzer
// can forge a record whose checksum holds. No-op without one.
void SealCommitRecord(std::string& record);

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
