// Shards handed to a save while it runs (CheckpointablePayload::feed).
//
// A synchronous save from Python stages its tree leaf after leaf; with a
// feed, the save's writer threads start on the first leaves' chunks while
// later leaves are still being staged, instead of waiting for all of them.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "shardkeep/checkpoint.h"
#include "shardkeep/status.h"

namespace shardkeep {

// One producer (the caller staging shards) and one save consuming them.
// Shards of a feed hold data or fill (not stored_in or compare_with: a save
// that reuses a base plans its links from all of its shards at once).
// Thread-safe.
class ShardFeed {
 public:
  // Adds shards for the save to write; their memory must stay valid until
  // the save ends, as with CheckpointablePayload::shards. InvalidArgument
  // after Close or Fail. Once the save has ended without taking everything
  // (it failed, or was cancelled), its outcome: the producer can stop
  // staging and learn why from the save.
  Status Add(std::vector<ShardData> shards);
  // Every shard has been added.
  void Close();
  // The producer failed: the save fails with `why` and commits nothing.
  void Fail(Status why);

  // The save's side: the shards added since the last Take, waiting for at
  // least one; an empty vector once closed and every shard taken. Fails
  // with the producer's Fail status, with Timeout when `timeout_s` (> 0)
  // pass with no Add, Close or Fail, and with Cancelled once `stop`
  // (polled while waiting) returns true.
  Result<std::vector<ShardData>> Take(double timeout_s, const std::function<bool()>& stop);
  // The save has ended with `outcome`: an Add after this returns it (an
  // Ok outcome: InvalidArgument, as after Close).
  void End(const Status& outcome);
  // The bytes of every shard added so far (a full disk's error names them).
  uint64_t bytes_added() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<ShardData> pending_;
  bool closed_ = false;
  Status failed_;   // Fail's
  Status ended_;    // End's; ok until the save ends with an error
  bool save_ended_ = false;
  uint64_t bytes_added_ = 0;
};

}  // namespace shardkeep
