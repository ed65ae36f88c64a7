#include "engine/decoded_meta_cache.h"

#include <list>
#include <mutex>
#include <utility>

namespace shardkeep::internal {
namespace {

// A process saves few distinct trees in turn (the state, an EMA copy...).
constexpr size_t kEntries = 4;

struct Entry {
  std::string json;
  std::shared_ptr<const format::CheckpointableMeta> meta;
};

std::mutex& CacheMutex() {
  static std::mutex* const mu = new std::mutex;
  return *mu;
}

// Most recently used first.
std::list<Entry>& Cache() {
  static std::list<Entry>* const entries = new std::list<Entry>;
  return *entries;
}

}  // namespace

namespace {

// REQUIRES: CacheMutex() held.
void Remember(const std::string& json,
              std::shared_ptr<const format::CheckpointableMeta> meta) {
  std::list<Entry>& entries = Cache();
  entries.push_front({json, std::move(meta)});
  if (entries.size() > kEntries) entries.pop_back();
}

}  // namespace

void RememberDecodedMeta(const std::string& json,
                         std::shared_ptr<const format::CheckpointableMeta> meta) {
  if (json.size() > kMaxCachedMetaBytes) return;
  std::lock_guard<std::mutex> lock(CacheMutex());
  Remember(json, std::move(meta));
}

Result<std::shared_ptr<const format::CheckpointableMeta>> DecodeMetaCached(
    const std::string& json, const std::string& file) {
  const bool cacheable = json.size() <= kMaxCachedMetaBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(CacheMutex());
    std::list<Entry>& entries = Cache();
    for (auto it = entries.begin(); it != entries.end(); ++it) {
      if (it->json != json) continue;
      entries.splice(entries.begin(), entries, it);
      return entries.front().meta;
    }
  }
  SK_ASSIGN_OR_RETURN(format::CheckpointableMeta decoded,
                      format::DecodeCheckpointableMeta(json, file));
  auto meta = std::make_shared<const format::CheckpointableMeta>(std::move(decoded));
  if (cacheable) {
    std::lock_guard<std::mutex> lock(CacheMutex());
    Remember(json, meta);
  }
  return meta;
}

}  // namespace shardkeep::internal
