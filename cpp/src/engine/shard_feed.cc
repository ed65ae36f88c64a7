#include "shardkeep/shard_feed.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <utility>

#include "core/seconds_text.h"

namespace shardkeep {
namespace {

// How often a waiting Take asks whether to stop (a cancellation token has
// no way to wake it).
constexpr std::chrono::milliseconds kStopPoll{50};

}  // namespace

Status ShardFeed::Add(std::vector<ShardData> shards) {
  std::lock_guard lock(mutex_);
  if (save_ended_) {
    return ended_.ok() ? InvalidArgumentError("shards added to a feed whose save has ended")
                       : ended_;
  }
  if (closed_ || !failed_.ok()) {
    return InvalidArgumentError("shards added to a feed that was closed or failed");
  }
  for (const ShardData& shard : shards) {
    bytes_added_ += shard.box.NumElements() * DTypeSize(shard.dtype);
  }
  pending_.insert(pending_.end(), std::make_move_iterator(shards.begin()),
                  std::make_move_iterator(shards.end()));
  changed_.notify_all();
  return Status::Ok();
}

void ShardFeed::Close() {
  std::lock_guard lock(mutex_);
  closed_ = true;
  changed_.notify_all();
}

void ShardFeed::Fail(Status why) {
  std::lock_guard lock(mutex_);
  if (why.ok()) why = InternalError("a shard feed was failed with an Ok status");
  if (failed_.ok()) failed_ = std::move(why);
  changed_.notify_all();
}

Result<std::vector<ShardData>> ShardFeed::Take(double timeout_s,
                                               const std::function<bool()>& stop) {
  using Clock = std::chrono::steady_clock;
  const auto deadline =
      timeout_s > 0 ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(timeout_s))
                    : Clock::time_point::max();
  std::unique_lock lock(mutex_);
  while (true) {
    if (!failed_.ok()) return failed_;
    if (!pending_.empty()) return std::exchange(pending_, {});
    if (closed_) return std::vector<ShardData>{};
    if (stop()) return CancelledError("waiting for shards to save was cancelled");
    const auto now = Clock::now();
    if (now >= deadline) {
      return TimeoutError("no shards to save arrived within " + SecondsText(timeout_s) +
                          " (Options::timeout_s): whoever stages them stopped without "
                          "closing or failing the feed");
    }
    changed_.wait_until(lock, std::min(deadline, now + kStopPoll));
  }
}

void ShardFeed::End(const Status& outcome) {
  std::lock_guard lock(mutex_);
  save_ended_ = true;
  ended_ = outcome;
  pending_.clear();  // never to be written: their memory need not be kept
}

uint64_t ShardFeed::bytes_added() const {
  std::lock_guard lock(mutex_);
  return bytes_added_;
}

}  // namespace shardkeep
