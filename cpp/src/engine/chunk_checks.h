// The checks a reader makes of a pytree checkpointable's chunks, shared by
// the restore pipeline (reader.cc), which stops at the first failure, and
// the verifier (verify.cc), which collects every failure. Each check returns
// a Corruption error whose message names the file, the leaf and the offset.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/checkpointable_meta.h"
#include "format/index.h"
#include "shardkeep/status.h"

namespace shardkeep::internal {

// A stored chunk and the process whose files hold it.
struct StoredChunk {
  format::ChunkRecord record;
  int process = 0;
};

// The N of "index/p<N>.idx". REQUIRES: `name` has that form (as
// DecodeCommitRecord guarantees for every listed index file).
int ProcessOfIndexFile(const std::string& name);

// A record from an untrusted index file must agree with meta.json before
// any of its numbers sizes a buffer or addresses memory: it names a leaf,
// that leaf is an array, its box lies inside the leaf's shape, its raw
// length is the box's bytes and a raw chunk's stored length equals it.
// `index_file` names the index in the message.
Status CheckChunkRecord(const format::CheckpointableMeta& meta,
                        const format::ChunkRecord& record,
                        const std::string& index_file);

// Proves that `chunks` (each passed CheckChunkRecord) tile array leaf
// `leaf`: each element covered exactly once. `where` opens the message
// ("checkpoint X: leaf 'w' of state"); `folder` is the checkpointable's
// folder and `index_files` the index files its record lists (relative to
// `folder`), named when chunks are missing.
Status CheckLeafTiling(const format::LeafMeta& leaf,
                       const std::vector<StoredChunk>& chunks,
                       const std::string& where, const std::string& folder,
                       const std::vector<std::string>& index_files);

// "chunk [0:4, 0:8] of leaf 'w' in <file> at offset 128", for messages.
std::string DescribeChunk(const format::ChunkRecord& record,
                          const std::string& leaf_path, const std::string& file);

// Corruption unless the XXH3-64 of the chunk's `stored` bytes (its
// stored_length of them) is its recorded checksum. The message describes
// the chunk as DescribeChunk does and gives its length.
Status CheckChunkChecksum(const format::ChunkRecord& record, const uint8_t* stored,
                          const std::string& leaf_path, const std::string& file);

// Decodes the compressed chunk `stored` into `raw` (raw_length bytes). Codec
// 1: one zstd frame of the elements. Codec 2: a zstd frame per block of
// kBytePlaneBlockElements elements of `item_size` bytes, each of the
// block's byte planes, decompressed into `planes` (one block of scratch)
// and joined into `raw`. `item_size` 0 (not known: a verifier without the
// leaf's dtype) only checks that every frame decompresses, into `raw`, and
// that together they make raw_length bytes. A frame whose stated size
// differs from the record is refused before anything is written.
// REQUIRES: record.codec is not kRaw; `planes` is set for codec 2 when
// item_size > 1 (DecodeScratchBytes says how much a caller needs).
Status DecodeChunk(const format::ChunkRecord& record, const uint8_t* stored,
                   uint64_t item_size, uint8_t* raw, uint8_t* planes,
                   const std::string& leaf_path, const std::string& file);

// The scratch DecodeChunk needs beside the stored bytes: the decoded
// elements, and for codec 2 one block's planes. 0 for a raw chunk.
uint64_t DecodeScratchBytes(const format::ChunkRecord& record, uint64_t item_size);

}  // namespace shardkeep::internal
