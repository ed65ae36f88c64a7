// Writes one process's shards of one pytree checkpointable: data files and
// the index. Used by the save pipeline; knows nothing of the commit.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "engine/byte_limiter.h"
#include "engine/sync_batch.h"
#include "format/index.h"
#include "shardkeep/checkpoint.h"
#include "shardkeep/options.h"
#include "shardkeep/shard_feed.h"
#include "shardkeep/storage.h"

namespace shardkeep::internal {

// Splits every shard into chunks of at most options.chunk_bytes, writes
// them on options.io_threads threads (each into data files of its own,
// `data/p<P>-<F>.bin`, rolling past options.data_file_bytes), checksums and
// optionally compresses each chunk, then writes `index/p<P>.idx`, and
// fsyncs every data file once, after its last write, and the index (the
// last data files and the index together, see SyncBatch). `dir` is the
// checkpointable's folder; its `data/` and `index/` subfolders must exist.
// The writers' scratch memory (gather buffers, zstd output and working
// memory) is held in a ByteLimiter of options.ResolvedHostMemoryLimit();
// the shards' own memory belongs to the caller and is not counted. Once
// the calling thread's CancellationScope is cancelled no new chunk starts.
// Returns the index file's path relative to `dir`.
Result<std::string> WriteShards(Storage& storage, const std::string& dir,
                                int process_index,
                                const std::vector<ShardData>& shards,
                                const Options& options);
// The same with the caller's limiter (a test reads its peak), leaving the
// files that are not durable yet (each thread's last data file and the
// index) in `unsynced` for the caller, who syncs them with its own (the
// commit syncs the primary's together with its folders and meta.json).
// On failure some files may be left there too; they need no sync then.
// `linked` are records of chunks already in data files of `dir` (an
// earlier checkpoint's, linked: engine/reuse.h): the index lists them too,
// and the new data files are numbered after theirs.
Result<std::string> WriteShards(Storage& storage, const std::string& dir,
                                int process_index,
                                const std::vector<ShardData>& shards,
                                const Options& options, ByteLimiter& limiter,
                                SyncBatch& unsynced,
                                std::vector<format::ChunkRecord> linked = {});

// Checks a shard before it is written (the save checks each against its
// meta.json); an error fails the write.
using ShardCheck = std::function<Status(const ShardData&)>;

// The same with shards that arrive while the writers run: the writers take
// chunks as the feed's producer adds shards, and end once it has closed
// the feed and every chunk is written. `check` sees every shard first. A
// writer's failure stops the others. At most `max_threads` writer threads
// run (a caller that knows there is little to write starts fewer).
Result<std::string> WriteShards(Storage& storage, const std::string& dir,
                                int process_index, ShardFeed& feed, const ShardCheck& check,
                                const Options& options, ByteLimiter& limiter,
                                SyncBatch& unsynced,
                                std::vector<format::ChunkRecord> linked = {},
                                uint64_t max_threads = std::numeric_limits<uint64_t>::max());

}  // namespace shardkeep::internal
