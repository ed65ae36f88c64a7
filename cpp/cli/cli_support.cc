#include "cli_support.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <thread>
#include <utility>

namespace shardkeep::cli {

Result<OpenedLocation> OpenLocation(const std::string& url) {
  OpenedLocation location;
  location.url = url;
  while (location.url.size() > 1 && location.url.back() == '/') location.url.pop_back();
  SK_ASSIGN_OR_RETURN(StorageLocation resolved, ResolveStorage(location.url));
  location.storage = std::move(resolved.storage);
  location.path = std::move(resolved.path);
  SK_ASSIGN_OR_RETURN(const Location where, ParseLocation(location.url));
  location.local = where.local_path.has_value();
  return location;
}

std::string JoinUrl(const std::string& parent, const std::string& name) {
  if (!parent.empty() && parent.back() == '/') return parent + name;
  return parent + "/" + name;
}

void ParallelFor(size_t count, int threads, const std::function<void(size_t)>& fn) {
  const size_t workers = std::min<size_t>(count, static_cast<size_t>(std::max(threads, 1)));
  if (workers <= 1) {
    for (size_t i = 0; i < count; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < count; i = next++) fn(i);
  };
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (size_t t = 1; t < workers; ++t) pool.emplace_back(work);
  work();
  for (std::thread& thread : pool) thread.join();
}

int IoThreads(const Storage& storage) {
  const int parallel = storage.features().parallel_reads;
  return parallel > 0 ? std::min(parallel, 64) : 8;
}

std::vector<FolderUsage> MeasureUsage(Storage& storage,
                                      const std::vector<std::vector<std::string>>& paths) {
  std::vector<FolderUsage> usage(paths.size());
  // Breadth first: each round lists or sizes every path of the frontier in
  // parallel, so a store reached over the network sees many requests at once.
  std::vector<std::pair<size_t, std::string>> frontier;
  for (size_t item = 0; item < paths.size(); ++item) {
    for (const std::string& path : paths[item]) frontier.emplace_back(item, path);
  }
  std::mutex mu;
  while (!frontier.empty()) {
    std::vector<std::pair<size_t, std::string>> next;
    ParallelFor(frontier.size(), IoThreads(storage), [&](size_t i) {
      const auto& [item, path] = frontier[i];
      // A folder lists; a file does not (not a directory, or nothing below
      // its key), so it is sized instead.
      Result<std::vector<std::string>> children = storage.List(path);
      if (children.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        for (const std::string& child : *children) next.emplace_back(item, path + "/" + child);
        return;
      }
      Result<uint64_t> size = storage.FileSize(path);
      std::lock_guard<std::mutex> lock(mu);
      FolderUsage& u = usage[item];
      if (size.ok()) {
        u.bytes += *size;
        u.files += 1;
      } else if (size.status().code() != StatusCode::kNotFound ||
                 children.status().code() != StatusCode::kNotFound) {
        // Both NotFound: it vanished since its folder was listed.
        if (u.status.ok()) {
          u.status = children.status().code() != StatusCode::kNotFound ? children.status()
                                                                      : size.status();
        }
      }
    });
    frontier = std::move(next);
  }
  return usage;
}

std::optional<int64_t> NewestLocalModificationNs(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  auto to_ns = [](fs::file_time_type time) {
    const auto system = std::chrono::file_clock::to_sys(time);
    return static_cast<int64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(system.time_since_epoch()).count());
  };
  const fs::file_time_type own = fs::last_write_time(path, error);
  if (error) return std::nullopt;
  int64_t newest = to_ns(own);
  if (!fs::is_directory(path, error)) return newest;
  fs::recursive_directory_iterator it(path, fs::directory_options::skip_permission_denied, error);
  for (; !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    std::error_code entry_error;
    // symlink_status: a link's own time, never its target's.
    if (!it->is_symlink(entry_error)) {
      const fs::file_time_type time = it->last_write_time(entry_error);
      if (!entry_error) newest = std::max(newest, to_ns(time));
    }
  }
  return newest;
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string HumanBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 6) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f %s", value, kUnits[unit]);
  return text;
}

namespace {

std::string FormatUtc(int64_t ns, const char* format, bool millis) {
  const std::time_t seconds = static_cast<std::time_t>(ns / 1000000000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[64];
  size_t n = std::strftime(text, sizeof(text), format, &utc);
  std::string result(text, n);
  if (millis) {
    char ms[8];
    std::snprintf(ms, sizeof(ms), ".%03d", static_cast<int>((ns / 1000000) % 1000));
    result += ms;
  }
  return result;
}

}  // namespace

std::string HumanTime(int64_t ns) {
  if (ns == 0) return "-";
  return FormatUtc(ns, "%Y-%m-%d %H:%M:%S", false) + " UTC";
}

std::string IsoTime(int64_t ns) { return FormatUtc(ns, "%Y-%m-%dT%H:%M:%S", true) + "Z"; }

std::string HumanDuration(double seconds) {
  if (seconds < 0) seconds = 0;
  char text[32];
  if (seconds < 1) {
    std::snprintf(text, sizeof(text), "%.0fms", seconds * 1000);
    return text;
  }
  double value = seconds;
  const char* unit = "s";
  if (seconds >= 86400) {
    value = seconds / 86400, unit = "d";
  } else if (seconds >= 3600) {
    value = seconds / 3600, unit = "h";
  } else if (seconds >= 60) {
    value = seconds / 60, unit = "m";
  }
  // Whole numbers and large ones without decimals: "1h", "12m", "1.5h".
  const bool whole = value >= 10 || value == static_cast<double>(static_cast<int64_t>(value));
  std::snprintf(text, sizeof(text), whole ? "%.0f%s" : "%.1f%s", value, unit);
  return text;
}

void PrintJson(const nlohmann::ordered_json& value) {
  // Invalid UTF-8 in names or metadata is replaced, never a thrown error.
  std::cout << value.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
}

void PrintError(const std::string& command, const std::string& what, const Status& status) {
  std::cerr << "shardkeep " << command << ": " << what << ": " << status.ToString() << "\n";
}

void Table::Print(const std::string& indent) const {
  std::vector<size_t> widths;
  for (const auto& row : rows_) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  for (const auto& row : rows_) {
    std::string line = indent;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(widths[c] - row[c].size() + 2, ' ');
    }
    std::cout << line << "\n";
  }
}

}  // namespace shardkeep::cli
