// The binary chunk index `index/p<P>.idx` written by process P: where each
// chunk of each leaf lies in that process's data files. Pure encode/decode,
// no I/O. The exact layout is specified in docs/FORMAT.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardkeep/box.h"
#include "shardkeep/checkpoint.h"
#include "shardkeep/status.h"

namespace shardkeep::format {

// The index stores the public enum's values (docs/FORMAT.md §4).
using Codec = ::shardkeep::ChunkCodec;

// Magic "SKIDX\0\0\1": the last byte is the index layout version.
inline constexpr char kIndexMagic[8] = {'S', 'K', 'I', 'D', 'X', 0, 0, 1};

struct ChunkRecord {
  uint32_t leaf = 0;       // position in meta.json "leaves"
  uint32_t data_file = 0;  // F in data/p<P>-<F>.bin
  Codec codec = Codec::kRaw;
  uint64_t offset = 0;         // of the stored bytes in the data file
  uint64_t stored_length = 0;  // bytes in the data file
  uint64_t raw_length = 0;     // bytes after decompression
  uint64_t checksum = 0;       // XXH3-64 of the stored bytes
  Box box;                     // rank = box.rank()

  bool operator==(const ChunkRecord& other) const = default;
};

std::string EncodeIndex(const std::vector<ChunkRecord>& records);

// Checks magic, sizes, rank limits and the trailer checksum. `file` names
// the index in error messages (Corruption "<file>: ...").
Result<std::vector<ChunkRecord>> DecodeIndex(std::string_view bytes,
                                             const std::string& file);

// "index/p3.idx" and "data/p3-0.bin", relative to the checkpointable.
std::string IndexFileName(int process_index);
std::string DataFileName(int process_index, uint32_t data_file);

}  // namespace shardkeep::format
