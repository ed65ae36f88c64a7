// A save of arrays that have not changed since an earlier checkpoint
// (ShardData::stored_in): their chunks are taken from there, not written
// again.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "format/index.h"
#include "shardkeep/checkpoint.h"
#include "shardkeep/options.h"
#include "shardkeep/storage.h"

namespace shardkeep::internal {

struct ReusedShards {
  // Index records of the chunks taken as they are: each lies in a data file
  // of the earlier checkpoint, linked into this one's `data/` folder as
  // `p<P>-<F>.bin` with F from 0 up.
  std::vector<format::ChunkRecord> linked;
  // What is left to write: the shards without stored_in as they are
  // (compare_with ones whose bytes differ from the earlier checkpoint's), and
  // those that could not be linked turned into shards that read their
  // bytes from the earlier checkpoint (ShardData::fill).
  std::vector<ShardData> to_write;
};

// Links the data files of earlier checkpoints that hold `shards` with
// stored_in, or with compare_with where their bytes are equal, into `dir`
// (a pytree checkpointable's folder of this save, written by process
// `process_index`). A shard is linked when the chunks
// of its leaf that meet its box all lie inside it (they then tile it:
// the earlier checkpoint's chunks tile the leaf) and `storage` can link;
// otherwise it is read. Linking a file links every chunk in it, including
// those of other leaves: on a file system the space is shared, so that
// costs nothing until the earlier checkpoint is deleted; an object store
// copies the file on the server.
Result<ReusedShards> ReuseStoredShards(const std::shared_ptr<Storage>& storage,
                                       const std::string& dir, int process_index,
                                       const std::vector<ShardData>& shards,
                                       const Options& options);

}  // namespace shardkeep::internal
