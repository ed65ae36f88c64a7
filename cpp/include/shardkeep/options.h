// Tuning knobs shared by saves and loads. Defaults suit a local disk.
#pragma once

#include <cstdint>

#include "shardkeep/storage.h"

namespace shardkeep {

struct Options {
  // Largest chunk a shard is split into. Smaller chunks make loads onto
  // another sharding read less waste; larger ones cut index size.
  uint64_t chunk_bytes = 64ull << 20;
  // Compress chunks: byte planes, then zstd at `zstd_level` with literals
  // always entropy-coded (docs/COMPRESSION.md). -30 was chosen by
  // measurement: on float data as small as level 3 and 1.3x faster than
  // level 1; faster levels lose the matches of integer sequences.
  bool compress = false;
  int zstd_level = -30;
  // Threads writing (and reading) in parallel; 0 = number of cores, at most
  // 16, and for reads at least what the storage asks for
  // (StorageFeatures::parallel_reads: 32 on S3).
  int io_threads = 0;
  // A writer thread starts a new data file once its current one passes this.
  uint64_t data_file_bytes = 4ull << 30;
  // Cap on the memory the engine allocates for its own buffers: read and
  // decompression buffers of a load, the writers' gather buffers and zstd
  // output and working memory of a save. 0 = 1 GiB. The caller's memory
  // (shards being saved, load destinations) is not counted. One unit of
  // work needing more than the cap (a chunk larger than it) runs alone.
  uint64_t host_memory_limit = 0;
  // Every barrier and wait gives up after this long.
  double timeout_s = 600.0;
  // Loading: allow casts that may lose precision or range.
  bool allow_lossy_cast = false;
  // Reads of two chunks in one data file are merged when the gap between
  // them is at most this many bytes.
  uint64_t coalesce_gap_bytes = 1ull << 20;
  // Settings for s3:// paths that win over the environment and the AWS
  // files (the front resolves every path it is given with them).
  S3Overrides s3;
  // The same for gs:// paths.
  GcsOverrides gcs;

  int ResolvedIoThreads() const;
  uint64_t ResolvedHostMemoryLimit() const {
    return host_memory_limit ? host_memory_limit : (1ull << 30);
  }
};

}  // namespace shardkeep
