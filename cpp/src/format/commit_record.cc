#include "format/commit_record.h"

#include <xxhash.h>

#include <algorithm>
#include <climits>
#include <iterator>
#include <set>

#include "core/decimal.h"
#include "format/hex64.h"
#include "format/json_parse.h"

namespace shardkeep::format {
namespace {

using ordered_json = nlohmann::ordered_json;

// Checksums are written as 16 lower-case hexadecimal digits (a JSON number
// could not hold every u64 exactly in every reader).
constexpr size_t kChecksumDigits = kHex64Digits;
constexpr char kChecksumKey[] = "checksum";

bool IsJsonSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Where the digits of the record's own checksum start: the bytes end with
// the member "checksum": "<16 digits>" and the object's closing brace,
// with JSON white space allowed between the tokens and after the brace.
// npos when they do not. Found from the end, so no parse is needed to
// check the bytes before they are decoded.
size_t FindOwnChecksum(std::string_view bytes) {
  size_t end = bytes.size();
  auto skip_space = [&] {
    while (end > 0 && IsJsonSpace(bytes[end - 1])) --end;
  };
  auto take = [&](std::string_view token) {
    if (end < token.size() || bytes.substr(end - token.size(), token.size()) != token) {
      return false;
    }
    end -= token.size();
    return true;
  };
  skip_space();
  if (!take("}")) return std::string_view::npos;
  skip_space();
  if (!take("\"") || end < kChecksumDigits) return std::string_view::npos;
  const size_t digits = end - kChecksumDigits;
  if (!ParseHex64(bytes.substr(digits, kChecksumDigits))) return std::string_view::npos;
  end = digits;
  if (!take("\"")) return std::string_view::npos;
  skip_space();
  if (!take(":")) return std::string_view::npos;
  skip_space();
  if (!take(std::string("\"") + kChecksumKey + "\"")) return std::string_view::npos;
  return digits;
}

// The record's checksum covers all its bytes, its own digits read as
// zeros (what the encoder hashes before it fills them in).
uint64_t OwnChecksum(std::string_view record, size_t digits) {
  std::string zeroed(record);
  zeroed.replace(digits, kChecksumDigits, kChecksumDigits, '0');
  return FileChecksum(zeroed);
}

// Reads the checksum `key` of checkpointable `name` into `out` when
// present; Corruption when present but not 16 lower-case hex digits, or
// absent where `required`.
Status GetEntryChecksum(const ordered_json& entry, const std::string& file,
                        const std::string& name, const char* key, bool required,
                        std::optional<uint64_t>* out) {
  auto it = entry.find(key);
  if (it == entry.end() && !required) return Status::Ok();
  if (it != entry.end() && it->is_string()) {
    *out = ParseHex64(it->get<std::string>());
    if (*out) return Status::Ok();
  }
  return CorruptionError(file + ": checkpointable \"" + name + "\": expected \"" + key +
                         "\" to be 16 lower-case hexadecimal digits");
}


// Parses "index/p<N>.idx" with N a decimal of at most 9 digits without
// leading zeros; returns N, or -1 when `path` has any other form.
int ParseIndexPath(std::string_view path) {
  constexpr std::string_view kPrefix = "index/p", kSuffix = ".idx";
  if (path.size() <= kPrefix.size() + kSuffix.size() ||
      !path.starts_with(kPrefix) || !path.ends_with(kSuffix)) {
    return -1;
  }
  const std::string_view digits =
      path.substr(kPrefix.size(), path.size() - kPrefix.size() - kSuffix.size());
  if (digits.size() > 1 && digits[0] == '0') return -1;
  const std::optional<int64_t> n = DecimalValue(digits, 999'999'999);
  return n ? static_cast<int>(*n) : -1;
}

// Reads an integer field into [lo, hi]; `what` names it in errors.
Status GetInt(const ordered_json& v, const std::string& file,
              const std::string& what, int64_t lo, int64_t hi, int64_t* out) {
  if (!v.is_number_integer() ||
      (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX})) {
    return CorruptionError(file + ": expected \"" + what +
                           "\" to be a signed 64-bit integer");
  }
  const int64_t n = v.get<int64_t>();
  if (n < lo || n > hi) {
    return CorruptionError(file + ": expected \"" + what + "\" in [" +
                           std::to_string(lo) + ", " + std::to_string(hi) +
                           "], found " + std::to_string(n));
  }
  *out = n;
  return Status::Ok();
}

}  // namespace

bool IsSafeCheckpointableName(std::string_view name) {
  if (name.empty() || name.size() > 255 || name[0] == '.') return false;
  // The commit record itself lives beside the checkpointable folders.
  if (name == kCommitFileName) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
           (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
  });
}

Status CheckCheckpointableName(std::string_view name) {
  if (IsSafeCheckpointableName(name)) return Status::Ok();
  return InvalidArgumentError("checkpointable name '" + std::string(name) +
                              "' must be 1-255 characters of [A-Za-z0-9_.-], not starting "
                              "with '.', and not " + kCommitFileName);
}

bool IsGenerationFolderName(std::string_view name) {
  const std::string_view prefix = kGenerationPrefix;
  return name.starts_with(prefix) && ParseHex64(name.substr(prefix.size())).has_value();
}

std::string EncodeCommitRecord(const CommitRecord& record) {
  ordered_json j;
  j["format"] = "shardkeep";
  j["version"] = record.version;
  j["step"] = record.step ? ordered_json(*record.step) : ordered_json(nullptr);
  j["created_ns"] = record.created_ns;
  j["committed_ns"] = record.committed_ns;
  j["process_count"] = record.process_count;
  if (record.data_folder) j["data_folder"] = *record.data_folder;
  ordered_json checkpointables = ordered_json::object();
  const bool checksummed = record.version >= kFirstChecksummedVersion;
  for (const CheckpointableEntry& e : record.checkpointables) {
    ordered_json entry = {{"kind", e.kind}};
    if (checksummed && e.meta_checksum) entry["meta_checksum"] = Hex64(*e.meta_checksum);
    if (checksummed && e.value_checksum) {
      entry["value_checksum"] = Hex64(*e.value_checksum);
    }
    checkpointables[e.name] = std::move(entry);
  }
  j["checkpointables"] = std::move(checkpointables);
  // index_files in checkpointable order (then any stray keys, sorted), so
  // that the file reads in save order.
  ordered_json index_files = ordered_json::object();
  for (const CheckpointableEntry& e : record.checkpointables) {
    auto it = record.index_files.find(e.name);
    if (it != record.index_files.end()) index_files[e.name] = it->second;
  }
  for (const auto& [name, paths] : record.index_files) {
    if (!index_files.contains(name)) index_files[name] = paths;
  }
  j["index_files"] = std::move(index_files);
  j["custom_metadata"] = ordered_json(record.custom_metadata);
  j["metrics"] = ordered_json(record.metrics);
  // Last, so that a reader finds it from the end of the file.
  if (checksummed) j[kChecksumKey] = std::string(kChecksumDigits, '0');
  // `replace` keeps dump() from throwing on invalid UTF-8 in user strings.
  std::string text = j.dump(2, ' ', false, ordered_json::error_handler_t::replace) + "\n";
  SealCommitRecord(text);
  return text;
}

uint64_t FileChecksum(std::string_view bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

CheckpointableEntry ListCheckpointable(const std::string& name, const std::string& kind,
                                       std::string_view meta_json, std::string_view value) {
  CheckpointableEntry entry{name, kind, FileChecksum(meta_json), std::nullopt};
  if (kind != "pytree") entry.value_checksum = FileChecksum(value);
  return entry;
}

Status CheckListedChecksum(std::string_view bytes, std::optional<uint64_t> expected,
                           const std::string& file) {
  if (!expected) return Status::Ok();
  const uint64_t actual = FileChecksum(bytes);
  if (actual == *expected) return Status::Ok();
  return CorruptionError(file + ": checksum mismatch: its " + std::to_string(bytes.size()) +
                         " bytes hash to " + Hex64(actual) + " but the commit record (" +
                         kCommitFileName + ") lists " + Hex64(*expected) +
                         "; the file changed after the save committed, or was damaged on "
                         "the way from storage");
}

void SealCommitRecord(std::string& record) {
  const size_t digits = FindOwnChecksum(record);
  if (digits == std::string_view::npos) return;
  record.replace(digits, kChecksumDigits, Hex64(OwnChecksum(record, digits)));
}

Result<CommitRecord> DecodeCommitRecord(std::string_view bytes,
                                        const std::string& file) {
  auto corrupt = [&file](const std::string& what) {
    return CorruptionError(file + ": " + what);
  };
  // The bytes are checked before anything is decoded from them: a flipped
  // digit still parses, and a flipped version would be misread as newer.
  const size_t own = FindOwnChecksum(bytes);
  if (own != std::string_view::npos) {
    const uint64_t stated = *ParseHex64(bytes.substr(own, kChecksumDigits));
    const uint64_t actual = OwnChecksum(bytes, own);
    if (actual != stated) {
      return corrupt("checksum mismatch: its " + std::to_string(bytes.size()) +
                     " bytes hash to " + Hex64(actual) + " but its \"checksum\" says " +
                     Hex64(stated) + "; the file was damaged after it was written, or "
                     "on the way from storage");
    }
  }
  SK_ASSIGN_OR_RETURN(const ordered_json j, ParseJsonObject<ordered_json>(bytes, file));
  auto format = j.find("format");
  if (format == j.end() || !format->is_string() || *format != "shardkeep") {
    return corrupt("expected \"format\": \"shardkeep\"");
  }

  // The version comes first: a newer record may have changed anything else.
  CommitRecord record;
  auto version = j.find("version");
  if (version == j.end()) return corrupt("missing \"version\"");
  int64_t v = 0;
  SK_RETURN_IF_ERROR(GetInt(*version, file, "version", 1, INT64_MAX, &v));
  if (v > kFormatVersion) {
    return IncompatibleError(
        file + ": written by a newer shardkeep (format version " +
        std::to_string(v) + "), this reader supports versions up to " +
        std::to_string(kFormatVersion) + "; upgrade shardkeep to read it");
  }
  record.version = static_cast<int>(v);
  const bool checksummed = record.version >= kFirstChecksummedVersion;
  // The member found from the end must be the object's own last member
  // (not, say, the tail of a key with an escaped quote).
  if (checksummed && (own == std::string_view::npos || j.empty() ||
                      std::prev(j.end()).key() != kChecksumKey)) {
    return corrupt("a format version " + std::to_string(v) +
                   " record ends with its \"checksum\" member (16 lower-case hexadecimal "
                   "digits); this one does not: it was damaged or edited");
  }

  // "step" may be null or absent (a checkpoint outside a step sequence).
  if (auto step = j.find("step"); step != j.end() && !step->is_null()) {
    int64_t s = 0;
    SK_RETURN_IF_ERROR(GetInt(*step, file, "step", INT64_MIN, INT64_MAX, &s));
    record.step = s;
  }
  for (auto [key, out] : {std::pair{"created_ns", &record.created_ns},
                          std::pair{"committed_ns", &record.committed_ns}}) {
    auto it = j.find(key);
    if (it == j.end()) return corrupt(std::string("missing \"") + key + "\"");
    SK_RETURN_IF_ERROR(GetInt(*it, file, key, INT64_MIN, INT64_MAX, out));
  }
  auto pc = j.find("process_count");
  if (pc == j.end()) return corrupt("missing \"process_count\"");
  int64_t process_count = 0;
  SK_RETURN_IF_ERROR(
      GetInt(*pc, file, "process_count", 1, INT_MAX, &process_count));
  record.process_count = static_cast<int>(process_count);

  // Absent: the checkpointables sit beside _SHARDKEEP. Present: exactly a
  // generation name, so that no record can send a reader elsewhere
  // ("../other", "/etc", "a/b").
  if (auto folder = j.find("data_folder"); folder != j.end()) {
    if (!folder->is_string() || !IsGenerationFolderName(folder->get<std::string>())) {
      return corrupt(std::string("expected \"data_folder\" to be \"") + kGenerationPrefix +
                     "\" followed by 16 lower-case hexadecimal digits, found " +
                     folder->dump(-1, ' ', false, ordered_json::error_handler_t::replace));
    }
    record.data_folder = folder->get<std::string>();
  }

  // Checkpointables, in document order (ordered_json keeps it).
  auto cps = j.find("checkpointables");
  if (cps == j.end() || !cps->is_object()) {
    return corrupt("expected \"checkpointables\" to be an object");
  }
  for (const auto& [name, entry] : cps->items()) {
    if (!IsSafeCheckpointableName(name)) {
      return corrupt("checkpointable name \"" + name +
                     "\" is not 1-255 bytes of [A-Za-z0-9_.-] not starting "
                     "with '.'");
    }
    if (!entry.is_object()) {
      return corrupt("checkpointable \"" + name + "\": expected an object");
    }
    auto kind = entry.find("kind");
    if (kind == entry.end() || !kind->is_string() ||
        !IsSafeCheckpointableName(kind->get<std::string>())) {
      return corrupt("checkpointable \"" + name +
                     "\": expected \"kind\" to be a name such as \"pytree\"");
    }
    CheckpointableEntry listed{name, kind->get<std::string>(), std::nullopt, std::nullopt};
    if (checksummed) {
      SK_RETURN_IF_ERROR(GetEntryChecksum(entry, file, name, "meta_checksum", true,
                                          &listed.meta_checksum));
      const bool has_value = listed.kind != "pytree";  // value.json or value.bin
      SK_RETURN_IF_ERROR(GetEntryChecksum(entry, file, name, "value_checksum", has_value,
                                          &listed.value_checksum));
    }
    record.checkpointables.push_back(std::move(listed));
  }

  auto idx = j.find("index_files");
  if (idx == j.end() || !idx->is_object()) {
    return corrupt("expected \"index_files\" to be an object");
  }
  for (const auto& [name, paths] : idx->items()) {
    if (!cps->contains(name)) {
      return corrupt("index_files lists \"" + name +
                     "\", which is not a checkpointable");
    }
    if (!paths.is_array()) {
      return corrupt("index_files \"" + name + "\": expected an array");
    }
    std::set<int> seen;
    std::vector<std::string>& out = record.index_files[name];
    for (const ordered_json& p : paths) {
      const int n = p.is_string() ? ParseIndexPath(p.get<std::string>()) : -1;
      if (n < 0) {
        return corrupt("index_files \"" + name +
                       "\": expected paths of the form \"index/p<N>.idx\", "
                       "found " + p.dump(-1, ' ', false,
                                         ordered_json::error_handler_t::replace));
      }
      if (n >= record.process_count || !seen.insert(n).second) {
        return corrupt("index_files \"" + name + "\": \"" +
                       p.get<std::string>() +
                       "\" is repeated or beyond process_count " +
                       std::to_string(record.process_count));
      }
      out.push_back(p.get<std::string>());
    }
  }

  for (auto [key, out] : {std::pair{"custom_metadata", &record.custom_metadata},
                          std::pair{"metrics", &record.metrics}}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;  // default {}
    if (!it->is_object()) {
      return corrupt(std::string("expected \"") + key + "\" to be an object");
    }
    *out = nlohmann::json(*it);
  }
  return record;
}

}  // namespace shardkeep::format
