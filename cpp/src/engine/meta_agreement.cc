#include "engine/meta_agreement.h"

#include <cinttypes>
#include <cstdio>
#include <map>
#include <sstream>

namespace shardkeep::internal {
namespace {

struct DigestLine {
  std::string name;
  std::string rest;  // kind and hash
};

std::vector<DigestLine> Parse(const std::string& digest) {
  std::vector<DigestLine> lines;
  std::istringstream in(digest);
  std::string line;
  while (std::getline(in, line)) {
    const size_t space = line.find(' ');
    lines.push_back({line.substr(0, space),
                     space == std::string::npos ? "" : line.substr(space + 1)});
  }
  return lines;
}

std::string JoinNames(const std::vector<DigestLine>& lines) {
  std::string names;
  for (const DigestLine& line : lines) {
    names += (names.empty() ? "'" : ", '") + line.name + "'";
  }
  return names.empty() ? "none" : names;
}

// How `theirs` differs from the primary's `ours`.
std::string Difference(const std::vector<DigestLine>& ours,
                       const std::vector<DigestLine>& theirs) {
  bool same_names = ours.size() == theirs.size();
  for (size_t i = 0; same_names && i < ours.size(); ++i) {
    same_names = ours[i].name == theirs[i].name;
  }
  if (!same_names) {
    return "in the checkpointables to save (" + JoinNames(theirs) +
           " instead of " + JoinNames(ours) + ")";
  }
  std::string parts;
  for (size_t i = 0; i < ours.size(); ++i) {
    if (ours[i].rest == theirs[i].rest) continue;
    parts += (parts.empty() ? "'" : ", '") + ours[i].name + "'";
  }
  return parts.empty() ? "in what it saves" : "in the meta.json of " + parts;
}

std::string ProcessList(const std::vector<int>& processes) {
  std::string list = processes.size() == 1 ? "process " : "processes ";
  for (size_t i = 0; i < processes.size(); ++i) {
    list += (i ? ", " : "") + std::to_string(processes[i]);
  }
  return list;
}

}  // namespace

std::string MetaDigest(const std::vector<CheckpointablePayload>& parts) {
  std::string digest;
  for (const CheckpointablePayload& part : parts) {
    char hash[17];
    std::snprintf(hash, sizeof(hash), "%016" PRIx64,
                  ChunkChecksum(part.meta_json.data(), part.meta_json.size()));
    digest += part.name + " " + part.kind + " " + hash + "\n";
  }
  return digest;
}

std::string DescribeDisagreement(const std::vector<std::string>& digests) {
  if (digests.empty()) return "";
  const std::vector<DigestLine> ours = Parse(digests[0]);
  // Processes grouped by how they differ, so a thousand processes that
  // differ alike make one line.
  std::map<std::string, std::vector<int>> differences;
  for (size_t p = 1; p < digests.size(); ++p) {
    if (digests[p] == digests[0]) continue;
    differences[Difference(ours, Parse(digests[p]))].push_back(static_cast<int>(p));
  }
  std::string description;
  for (const auto& [difference, processes] : differences) {
    description += (description.empty() ? "" : "; ") + ProcessList(processes) +
                   (processes.size() == 1 ? " differs" : " differ") +
                   " from process 0 " + difference;
  }
  return description;
}

}  // namespace shardkeep::internal
