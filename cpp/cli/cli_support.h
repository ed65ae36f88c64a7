// Helpers shared by the `shardkeep` subcommands: opening a URL, measuring
// what a folder holds, formatting sizes and times, JSON output, reporting
// errors. Everything goes through the public API (storage.h), so every
// command works on each backend ResolveStorage knows.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardkeep/location.h"
#include "shardkeep/status.h"
#include "shardkeep/storage.h"

namespace shardkeep::cli {

// A URL as the user typed it, resolved to its backend.
struct OpenedLocation {
  std::string url;  // as given, without a trailing '/'
  std::shared_ptr<Storage> storage;
  std::string path;  // inside `storage`
  bool local = false;  // a path on this machine's file system
};

Result<OpenedLocation> OpenLocation(const std::string& url);
// "<parent>/<name>" for URLs and paths alike.
std::string JoinUrl(const std::string& parent, const std::string& name);

// Runs fn(0) .. fn(count - 1) on up to `threads` threads, returning when
// all are done. fn must not throw.
void ParallelFor(size_t count, int threads, const std::function<void(size_t)>& fn);
// Requests worth having in flight on this storage (a network store answers
// each after a round trip, so it gets more than there are cores).
int IoThreads(const Storage& storage);

struct FolderUsage {
  uint64_t bytes = 0;  // sum of the sizes of every file below
  uint64_t files = 0;
  Status status;       // the first error met (the sums then fall short)
};
// Usage of each of `paths` (a folder, walked recursively, or a file), all
// measured together in parallel through Storage::List and FileSize.
std::vector<FolderUsage> MeasureUsage(Storage& storage,
                                      const std::vector<std::vector<std::string>>& paths);

// Newest modification time (ns since the epoch) of `path` and everything
// below it: the last time a writer touched it. Only for local paths
// (OpenedLocation::local); nullopt when it cannot be read (e.g. it vanished).
std::optional<int64_t> NewestLocalModificationNs(const std::string& path);
int64_t NowNs();

// "0 B", "512 B", "1.5 KiB", "12.0 MiB", ...
std::string HumanBytes(uint64_t bytes);
// "2026-12-01 21:30:04 UTC"; "-" for 0.
std::string HumanTime(int64_t ns);
// ISO 8601 in UTC, "2026-12-01T21:30:04.123Z" (JSON output).
std::string IsoTime(int64_t ns);
// "250ms", "45s", "12m", "1h", "3.5h", "2d".
std::string HumanDuration(double seconds);

// Prints `value` as indented JSON, and a newline, to stdout.
void PrintJson(const nlohmann::ordered_json& value);

// Prints "shardkeep <command>: <what>: <status>" to stderr.
void PrintError(const std::string& command, const std::string& what, const Status& status);

// Left-aligned columns separated by two spaces; the last column is not
// padded.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  size_t size() const { return rows_.size() - 1; }
  // Each line starts with `indent`.
  void Print(const std::string& indent = "") const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace shardkeep::cli
