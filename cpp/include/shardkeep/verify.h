// Checking a committed checkpoint completely, without loading it: every
// file the commit record promises, every index against its meta.json, the
// tiling of every array leaf, and every chunk's bytes. Unlike a load, which
// stops at the first fault, verification reports all the faults it finds.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardkeep/status.h"
#include "shardkeep/storage.h"

namespace shardkeep {

// One fault in a checkpoint. `file` is the damaged (or missing) file's path
// in the storage; `checkpointable` and `leaf` (a key path, or "#<n>" for a
// leaf number meta.json does not have) are empty where they do not apply;
// `offset` is the byte offset in `file` where the fault lies (a chunk's
// stored bytes in a data file, a record in an index file), when there is
// one. `message` is a full sentence naming all of these.
struct VerifyProblem {
  std::string file;
  std::string checkpointable;
  std::string leaf;
  std::optional<uint64_t> offset;
  std::string message;
};

struct VerifyReport {
  // Every fault found, sorted by file, then offset.
  std::vector<VerifyProblem> problems;
  uint64_t chunks_checked = 0;  // chunks whose stored bytes were read
  uint64_t bytes_checked = 0;   // their stored bytes
  bool ok() const { return problems.empty(); }
};

struct VerifyOptions {
  // Chunks read at once; 0: one per core (at most 16), and at least what
  // the storage asks for (StorageFeatures::parallel_reads).
  int threads = 0;
  // Cap on the memory held by chunk and decompression buffers; 0 = 1 GiB.
  // A chunk larger than the cap is checked alone.
  uint64_t memory_limit = 0;
  // Called with the stored bytes checked so far and the total to check,
  // from the verifying threads but never by two at once. May be empty.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// Verifies the checkpoint at `path`:
//  - _SHARDKEEP decodes (docs/FORMAT.md §3); if it does not, that is the
//    one problem reported, since nothing else can be located;
//  - each listed checkpointable has a meta.json that decodes and agrees
//    with the record's kind, and its value.json (valid JSON) / value.bin;
//  - each index file the record lists exists and decodes, and each of its
//    records agrees with meta.json (leaf number, rank, box inside the
//    leaf's shape, raw length of the box);
//  - the chunks of every array leaf tile it exactly (not checked for the
//    leaves of a checkpointable one of whose index files is unreadable:
//    that problem already explains the gaps);
//  - every chunk's stored bytes lie inside its data file, their XXH3-64 is
//    the recorded checksum, and a zstd chunk is one frame that decodes to
//    its raw length.
// Chunks are checked in parallel. Returns the report (problems found are
// not errors). An error means verification could not run or finish:
// NotFound when there is no _SHARDKEEP at `path` (not a checkpoint), or a
// storage failure other than a missing file (a network or permission
// error), which leaves the verdict unknown.
Result<VerifyReport> VerifyCheckpoint(std::shared_ptr<Storage> storage,
                                      const std::string& path,
                                      const VerifyOptions& options = {});

}  // namespace shardkeep
