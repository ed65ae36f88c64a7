#include "engine/chunk_checks.h"

#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <optional>

#include "engine/byte_planes.h"
#include "engine/tiling.h"
#include "shardkeep/box.h"
#include "shardkeep/dtype.h"

namespace shardkeep::internal {

int ProcessOfIndexFile(const std::string& name) {
  return std::stoi(name.substr(7, name.size() - 11));
}

Status CheckChunkRecord(const format::CheckpointableMeta& meta,
                        const format::ChunkRecord& record,
                        const std::string& index_file) {
  auto bad = [&](const std::string& what) {
    return CorruptionError(index_file + ": chunk of leaf #" +
                           std::to_string(record.leaf) + " " + what);
  };
  if (record.leaf >= meta.leaves.size()) return bad("names no leaf of meta.json");
  const format::LeafMeta& leaf = meta.leaves[record.leaf];
  if (leaf.kind != format::LeafKind::kArray) return bad("belongs to a non-array leaf");
  Box whole{std::vector<uint64_t>(leaf.shape.size(), 0), leaf.shape};
  if (!Contains(whole, record.box)) {
    return bad("has box " + record.box.ToString() + " outside shape " + whole.ToString());
  }
  SK_ASSIGN_OR_RETURN(DType dtype, DTypeFromName(leaf.dtype));
  // Cannot overflow (the box lies inside a leaf of at most 2^63 bytes),
  // but a size from a file is never multiplied unchecked.
  std::optional<uint64_t> box_bytes = CheckedByteSize(record.box.shape, DTypeSize(dtype));
  if (!box_bytes || record.raw_length != *box_bytes) {
    return bad("has raw length " + std::to_string(record.raw_length) +
               " that does not match its box");
  }
  if (record.codec == format::Codec::kRaw && record.stored_length != record.raw_length) {
    return bad("is raw but its stored and raw lengths differ");
  }
  return Status::Ok();
}

Status CheckLeafTiling(const format::LeafMeta& leaf,
                       const std::vector<StoredChunk>& chunks,
                       const std::string& where, const std::string& folder,
                       const std::vector<std::string>& index_files) {
  if (leaf.kind != format::LeafKind::kArray) return Status::Ok();
  std::vector<const Box*> boxes;
  boxes.reserve(chunks.size());
  for (const StoredChunk& chunk : chunks) boxes.push_back(&chunk.record.box);
  std::optional<TilingFault> fault = FindTilingFault(leaf.shape, boxes);
  if (!fault) return Status::Ok();
  auto index_file = [&](const StoredChunk& chunk) {
    return folder + "/" + format::IndexFileName(chunk.process);
  };
  if (fault->overlap) {
    const StoredChunk& a = chunks[fault->overlap->first];
    const StoredChunk& b = chunks[fault->overlap->second];
    return CorruptionError(where + ": chunk " + a.record.box.ToString() + " in " +
                           index_file(a) + " overlaps chunk " + b.record.box.ToString() +
                           " in " + index_file(b) + " (an index file is damaged)");
  }
  std::string files;
  for (const std::string& index : index_files) {
    files += (files.empty() ? "" : ", ") + folder + "/" + index;
  }
  return CorruptionError(where + ": the chunks in " + (files.empty() ? "no index" : files) +
                         " cover " + std::to_string(fault->covered) + " of its " +
                         std::to_string(fault->total) +
                         " elements (an index file is missing or damaged)");
}

std::string DescribeChunk(const format::ChunkRecord& record,
                          const std::string& leaf_path, const std::string& file) {
  return "chunk " + record.box.ToString() + " of leaf '" + leaf_path + "' in " + file +
         " at offset " + std::to_string(record.offset);
}

Status CheckChunkChecksum(const format::ChunkRecord& record, const uint8_t* stored,
                          const std::string& leaf_path, const std::string& file) {
  if (XXH3_64bits(stored, record.stored_length) == record.checksum) return Status::Ok();
  return CorruptionError("checksum mismatch: " + DescribeChunk(record, leaf_path, file) +
                         ", length " + std::to_string(record.stored_length) +
                         ", has changed since it was written");
}

namespace {

// Decompresses the one zstd frame `stored` (`length` bytes) into `out`,
// which must receive exactly `expected` bytes.
Status DecompressFrame(const format::ChunkRecord& record, const uint8_t* stored,
                       uint64_t length, uint8_t* out, uint64_t expected,
                       const std::string& leaf_path, const std::string& file) {
  if (ZSTD_getFrameContentSize(stored, length) != expected) {
    return CorruptionError(DescribeChunk(record, leaf_path, file) +
                           " is not a zstd frame of its expected length " +
                           std::to_string(expected));
  }
  const size_t n = ZSTD_decompress(out, expected, stored, length);
  if (ZSTD_isError(n) || n != expected) {
    return CorruptionError(DescribeChunk(record, leaf_path, file) +
                           " does not decompress to its recorded length");
  }
  return Status::Ok();
}

}  // namespace

Status DecodeChunk(const format::ChunkRecord& record, const uint8_t* stored,
                   uint64_t item_size, uint8_t* raw, uint8_t* planes,
                   const std::string& leaf_path, const std::string& file) {
  if (record.codec == format::Codec::kZstd) {
    return DecompressFrame(record, stored, record.stored_length, raw, record.raw_length,
                           leaf_path, file);
  }
  // Codec 2: a frame per block of elements, each of the block's planes.
  // Unknown item size: every frame must decompress, and all to raw_length.
  const uint64_t block_bytes = kBytePlaneBlockElements * std::max<uint64_t>(item_size, 1);
  uint64_t in = 0;
  for (uint64_t at = 0; at < record.raw_length;) {
    const uint64_t remaining = record.stored_length - in;
    const size_t frame = ZSTD_findFrameCompressedSize(stored + in, remaining);
    const unsigned long long content = ZSTD_getFrameContentSize(stored + in, remaining);
    if (ZSTD_isError(frame) || content == ZSTD_CONTENTSIZE_ERROR ||
        content == ZSTD_CONTENTSIZE_UNKNOWN) {
      return CorruptionError(DescribeChunk(record, leaf_path, file) + " holds no zstd frame at byte " +
                             std::to_string(in) + " of " + std::to_string(record.stored_length));
    }
    const uint64_t bytes = item_size == 0 ? content : std::min(block_bytes, record.raw_length - at);
    if (bytes == 0 || bytes > record.raw_length - at) {
      return CorruptionError(DescribeChunk(record, leaf_path, file) +
                             " does not decompress to its recorded length");
    }
    const bool join = item_size > 1;
    SK_RETURN_IF_ERROR(DecompressFrame(record, stored + in, frame, join ? planes : raw + at, bytes,
                                       leaf_path, file));
    if (join) JoinBytePlanes(planes, bytes / item_size, item_size, raw + at);
    in += frame;
    at += bytes;
  }
  if (in != record.stored_length) {
    return CorruptionError(DescribeChunk(record, leaf_path, file) + " has " +
                           std::to_string(record.stored_length - in) +
                           " bytes after its last zstd frame");
  }
  return Status::Ok();
}

uint64_t DecodeScratchBytes(const format::ChunkRecord& record, uint64_t item_size) {
  const uint64_t planes =
      record.codec == format::Codec::kZstdBytePlanes && item_size > 1
          ? std::min(record.raw_length, kBytePlaneBlockElements * item_size)
          : 0;
  return record.codec == format::Codec::kRaw ? 0 : record.raw_length + planes;
}

}  // namespace shardkeep::internal
