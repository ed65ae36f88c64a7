#include "format/lease.h"


#include <nlohmann/json.hpp>

#include "format/hex64.h"
#include "format/json_parse.h"

namespace shardkeep::format {
namespace {

constexpr char kLeaseFormat[] = "shardkeep-lease";
constexpr int kLeaseVersion = 1;

}  // namespace

std::string EncodeLease(const LeaseRecord& lease) {
  nlohmann::ordered_json j;
  j["format"] = kLeaseFormat;
  j["version"] = kLeaseVersion;
  j["owner"] = lease.owner;
  j["host"] = lease.host;
  j["boot_id"] = lease.boot_id;
  j["pid_namespace"] = lease.pid_namespace;
  j["pid"] = lease.pid;
  j["pid_start"] = lease.pid_start;
  j["sequence"] = lease.sequence;
  j["renewed_ns"] = lease.renewed_ns;
  j["duration_s"] = lease.duration_s;
  return j.dump() + "\n";
}

Result<LeaseRecord> DecodeLease(std::string_view bytes, const std::string& file) {
  SK_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonObject<nlohmann::json>(bytes, file));
  auto wrong = [&file](const char* field) {
    return CorruptionError(file + ": lease field '" + field + "' is missing or mistyped");
  };
  if (!j.contains("format") || j["format"] != kLeaseFormat) {
    return CorruptionError(file + ": not a shardkeep lease");
  }
  if (!j.contains("version") || !j["version"].is_number_integer()) return wrong("version");
  if (j["version"].get<int64_t>() > kLeaseVersion) {
    return IncompatibleError(file + ": lease version " + j["version"].dump() +
                             " is newer than this build reads (" +
                             std::to_string(kLeaseVersion) + ")");
  }
  LeaseRecord lease;
  for (auto [field, out] : {std::pair{"owner", &lease.owner}, {"host", &lease.host},
                            {"boot_id", &lease.boot_id},
                            {"pid_namespace", &lease.pid_namespace}}) {
    if (!j.contains(field) || !j[field].is_string()) return wrong(field);
    *out = j[field].get<std::string>();
  }
  if (lease.owner.empty()) return wrong("owner");
  if (!j.contains("pid") || !j["pid"].is_number_integer()) return wrong("pid");
  lease.pid = j["pid"].get<int64_t>();
  for (auto [field, out] : {std::pair{"pid_start", &lease.pid_start},
                            {"sequence", &lease.sequence}}) {
    if (!j.contains(field) || !j[field].is_number_unsigned()) return wrong(field);
    *out = j[field].get<uint64_t>();
  }
  if (!j.contains("renewed_ns") || !j["renewed_ns"].is_number_integer()) {
    return wrong("renewed_ns");
  }
  lease.renewed_ns = j["renewed_ns"].get<int64_t>();
  if (!j.contains("duration_s") || !j["duration_s"].is_number() ||
      !(j["duration_s"].get<double>() > 0) || !(j["duration_s"].get<double>() < 1e9)) {
    return wrong("duration_s");
  }
  lease.duration_s = j["duration_s"].get<double>();
  return lease;
}

std::string LeaseFileName(uint64_t sequence) {
  return std::string(kLeasePrefix) + Hex64(sequence);
}

std::optional<uint64_t> LeaseSequenceOf(std::string_view name) {
  const std::string_view prefix(kLeasePrefix);
  if (!name.starts_with(prefix)) return std::nullopt;
  return ParseHex64(name.substr(prefix.size()));
}

}  // namespace shardkeep::format
