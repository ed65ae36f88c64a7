#include "engine/reuse.h"

#include <cstring>
#include <map>
#include <optional>

#include "engine/copy.h"

namespace shardkeep::internal {
namespace {

// The earlier checkpoints named by one save's shards, each opened once, and
// the data files of theirs linked into this save so far.
class EarlierCheckpoints {
 public:
  EarlierCheckpoints(std::shared_ptr<Storage> storage, std::string dir, int process)
      : storage_(std::move(storage)), dir_(std::move(dir)), process_(process) {}

  // The reader of `from.checkpoint`, checked to be the checkpoint the save
  // at `from.created_ns` committed.
  Result<std::shared_ptr<CheckpointReader>> Open(const StoredIn& from) {
    auto found = readers_.find(from.checkpoint);
    if (found == readers_.end()) {
      Result<std::unique_ptr<CheckpointReader>> opened =
          CheckpointReader::Open(storage_, from.checkpoint);
      if (!opened.ok()) {
        return NotFoundError("the unchanged arrays of this save are in checkpoint " +
                             from.checkpoint + ", which cannot be opened: " +
                             opened.status().ToString());
      }
      found = readers_.emplace(from.checkpoint, std::move(*opened)).first;
    }
    const int64_t created_ns = found->second->Info().created_ns;
    if (created_ns != from.created_ns) {
      return NotFoundError("checkpoint " + from.checkpoint + " was replaced (created at " +
                           std::to_string(created_ns) + " ns, not " +
                           std::to_string(from.created_ns) +
                           "): it no longer holds the unchanged arrays of this save");
    }
    return found->second;
  }

  // The leaves of pytree `from.checkpointable` there, decoded once per save.
  Result<const PytreeInfo*> Tree(CheckpointReader& reader, const StoredIn& from) {
    const auto key = std::make_pair(from.checkpoint, from.checkpointable);
    auto found = trees_.find(key);
    if (found == trees_.end()) {
      SK_ASSIGN_OR_RETURN(PytreeInfo tree, reader.Pytree(from.checkpointable));
      found = trees_.emplace(key, std::move(tree)).first;
    }
    return &found->second;
  }

  // This save's number for `file` once linked into its data folder, or
  // nullopt when the storage cannot link (then it never tries again).
  Result<std::optional<uint32_t>> Link(const std::string& file) {
    if (const auto it = linked_.find(file); it != linked_.end()) {
      return std::optional<uint32_t>(it->second);
    }
    if (!can_link_) return std::optional<uint32_t>();
    const uint32_t number = static_cast<uint32_t>(linked_.size());
    SK_ASSIGN_OR_RETURN(bool linked,
                        storage_->Link(file, dir_ + "/" + format::DataFileName(process_, number)));
    if (!linked) {
      can_link_ = false;
      return std::optional<uint32_t>();
    }
    linked_.emplace(file, number);
    return std::optional<uint32_t>(number);
  }

  // False once the storage has said it cannot link: comparing is then
  // pointless, equal bytes would be written anyway.
  bool can_link() const { return can_link_; }

 private:
  const std::shared_ptr<Storage> storage_;
  const std::string dir_;
  const int process_;
  std::map<std::string, std::shared_ptr<CheckpointReader>> readers_;
  std::map<std::pair<std::string, std::string>, PytreeInfo> trees_;
  std::map<std::string, uint32_t> linked_;
  bool can_link_ = true;
};

// The position of `from.leaf_path` in the earlier checkpoint, checked to be
// an array of `dtype` holding `box`.
Result<uint32_t> FindLeaf(const PytreeInfo& tree, const StoredIn& from, const ShardData& shard) {
  const LeafInfo* leaf = tree.Find(from.leaf_path);
  const std::string where = "leaf '" + from.leaf_path + "' of '" + from.checkpointable +
                            "' in " + from.checkpoint;
  if (leaf == nullptr) return NotFoundError(where + " does not exist");
  if (leaf->kind != LeafKind::kArray || leaf->dtype != shard.dtype ||
      !Contains(Box{std::vector<uint64_t>(leaf->shape.size(), 0), leaf->shape}, shard.box)) {
    return InvalidArgumentError(where + " is not a " + std::string(DTypeName(shard.dtype)) +
                                " array holding box " + shard.box.ToString() +
                                ", as the shard said to reuse it claims");
  }
  return leaf->index;
}

// The records of `chunks` linked into this save, or nullopt when one of
// them could not be linked.
Result<std::optional<std::vector<format::ChunkRecord>>> LinkChunks(
    EarlierCheckpoints& earlier, const std::vector<const LeafChunk*>& chunks, uint32_t leaf) {
  std::vector<format::ChunkRecord> records;
  for (const LeafChunk* chunk : chunks) {
    SK_ASSIGN_OR_RETURN(std::optional<uint32_t> file, earlier.Link(chunk->range.file));
    if (!file || !chunk->range.checksum) return std::optional<std::vector<format::ChunkRecord>>();
    format::ChunkRecord& record = records.emplace_back();
    record.leaf = leaf;
    record.data_file = *file;
    record.codec = chunk->codec;
    record.offset = chunk->range.offset;
    record.stored_length = chunk->range.length;
    record.raw_length = chunk->raw_length;
    record.checksum = *chunk->range.checksum;
    record.box = chunk->box;
  }
  return std::optional(std::move(records));
}

// The chunks of leaf `from.leaf_path` in the earlier checkpoint that tile
// `shard`'s box, with the reader and the leaf's number there; nullopt where
// there is no such leaf (absent, another dtype, a shape not holding the
// box), the chunks reach outside the box, or the checkpoint cannot be
// opened as the one created at `from.created_ns`.
struct StoredChunks {
  std::shared_ptr<CheckpointReader> reader;
  uint32_t leaf = 0;
  std::vector<LeafChunk> chunks;
};

std::optional<StoredChunks> ChunksTiling(EarlierCheckpoints& earlier, const StoredIn& from,
                                         const ShardData& shard) {
  Result<std::shared_ptr<CheckpointReader>> reader = earlier.Open(from);
  if (!reader.ok()) return std::nullopt;
  Result<const PytreeInfo*> tree = earlier.Tree(**reader, from);
  if (!tree.ok()) return std::nullopt;
  const LeafInfo* leaf = (*tree)->Find(from.leaf_path);
  if (leaf == nullptr || leaf->kind != LeafKind::kArray || leaf->dtype != shard.dtype ||
      !Contains(Box{std::vector<uint64_t>(leaf->shape.size(), 0), leaf->shape}, shard.box)) {
    return std::nullopt;
  }
  Result<std::vector<LeafChunk>> chunks = (*reader)->Chunks(from.checkpointable, leaf->index);
  if (!chunks.ok()) return std::nullopt;
  StoredChunks out{*reader, leaf->index, {}};
  for (LeafChunk& chunk : *chunks) {
    if (!Intersect(chunk.box, shard.box)) continue;
    if (!Contains(shard.box, chunk.box)) return std::nullopt;
    out.chunks.push_back(std::move(chunk));
  }
  return out;
}

// Whether each of `stored.chunks` holds exactly the bytes of its box in
// `shard.data`. The stored checksum turns most differences away without a
// read (it is of the raw bytes where the chunk is not compressed); equal
// checksums are confirmed byte for byte against the chunk read back (a
// 64-bit hash is not a proof). A failed read counts as different: the
// save then writes its own bytes.
bool HoldsSameBytes(const StoredChunks& stored, const StoredIn& from, const ShardData& shard,
                    const Options& options) {
  const uint64_t item = DTypeSize(shard.dtype);
  std::vector<uint8_t> ours;
  std::vector<uint8_t> theirs;
  for (const LeafChunk& chunk : stored.chunks) {
    const uint64_t length = chunk.box.NumElements() * item;
    const uint8_t* mine = shard.data + RowMajorOffset(chunk.box, shard.box) * item;
    if (!IsContiguousIn(chunk.box, shard.box)) {
      ours.resize(length);
      CopyRegion(shard.data, shard.box, shard.dtype, ours.data(), chunk.box, shard.dtype,
                 chunk.box);
      mine = ours.data();
    }
    if (chunk.codec == ChunkCodec::kRaw && chunk.range.checksum &&
        ChunkChecksum(mine, length) != *chunk.range.checksum) {
      return false;
    }
    theirs.resize(length);
    ReadRequest request;
    request.leaf = stored.leaf;
    request.dtype = shard.dtype;
    request.box = chunk.box;
    request.dst = theirs.data();
    if (!stored.reader->Read(from.checkpointable, {request}, options).ok() ||
        std::memcmp(mine, theirs.data(), length) != 0) {
      return false;
    }
  }
  return true;
}

// The records of `shard`'s chunks linked from `shard.compare_with`, or
// nullopt when they are not all there, equal, and linked.
Result<std::optional<std::vector<format::ChunkRecord>>> LinkIfEqual(EarlierCheckpoints& earlier,
                                                                  const ShardData& shard,
                                                                  const Options& options) {
  const StoredIn& from = *shard.compare_with;
  if (!earlier.can_link()) return std::optional<std::vector<format::ChunkRecord>>();
  std::optional<StoredChunks> stored = ChunksTiling(earlier, from, shard);
  if (!stored || stored->chunks.empty() || !HoldsSameBytes(*stored, from, shard, options)) {
    return std::optional<std::vector<format::ChunkRecord>>();
  }
  std::vector<const LeafChunk*> chunks;
  for (const LeafChunk& chunk : stored->chunks) chunks.push_back(&chunk);
  Result<std::optional<std::vector<format::ChunkRecord>>> linked =
      LinkChunks(earlier, chunks, shard.leaf);
  // A link that fails (the earlier checkpoint deleted meanwhile, by a
  // retention that does not wait for a comparison) leaves the bytes to write.
  if (!linked.ok()) return std::optional<std::vector<format::ChunkRecord>>();
  return linked;
}

// `shard` with its bytes read from the earlier checkpoint, chunk by chunk
// as the writers ask for them.
ShardData ReadFrom(std::shared_ptr<CheckpointReader> reader, const StoredIn& from,
                   uint32_t stored_leaf, ShardData shard, const Options& options) {
  const DType dtype = shard.dtype;
  shard.stored_in.reset();
  shard.fill = [reader = std::move(reader), checkpointable = from.checkpointable, stored_leaf,
                dtype, options](const Box& chunk, uint8_t* dst) {
    ReadRequest request;
    request.leaf = stored_leaf;
    request.dtype = dtype;
    request.box = chunk;
    request.dst = dst;
    return reader->Read(checkpointable, {request}, options);
  };
  return shard;
}

}  // namespace

Result<ReusedShards> ReuseStoredShards(const std::shared_ptr<Storage>& storage,
                                       const std::string& dir, int process_index,
                                       const std::vector<ShardData>& shards,
                                       const Options& options) {
  ReusedShards out;
  EarlierCheckpoints earlier(storage, dir, process_index);
  for (const ShardData& shard : shards) {
    if (shard.compare_with && shard.data != nullptr && shard.box.NumElements() > 0) {
      SK_ASSIGN_OR_RETURN(std::optional<std::vector<format::ChunkRecord>> linked,
                          LinkIfEqual(earlier, shard, options));
      if (linked) {
        out.linked.insert(out.linked.end(), linked->begin(), linked->end());
      } else {
        out.to_write.push_back(shard);
      }
      continue;
    }
    if (!shard.stored_in || shard.box.NumElements() == 0) {
      if (!shard.stored_in) out.to_write.push_back(shard);
      continue;
    }
    const StoredIn& from = *shard.stored_in;
    SK_ASSIGN_OR_RETURN(std::shared_ptr<CheckpointReader> reader, earlier.Open(from));
    SK_ASSIGN_OR_RETURN(const PytreeInfo* tree, earlier.Tree(*reader, from));
    SK_ASSIGN_OR_RETURN(uint32_t stored_leaf, FindLeaf(*tree, from, shard));
    SK_ASSIGN_OR_RETURN(std::vector<LeafChunk> chunks,
                        reader->Chunks(from.checkpointable, stored_leaf));
    // The chunks that meet the box tile it (as they tile the leaf) when
    // none reaches outside it.
    std::vector<const LeafChunk*> meeting;
    bool inside = true;
    for (const LeafChunk& chunk : chunks) {
      if (!Intersect(chunk.box, shard.box)) continue;
      inside = inside && Contains(shard.box, chunk.box);
      meeting.push_back(&chunk);
    }
    if (inside) {
      SK_ASSIGN_OR_RETURN(std::optional<std::vector<format::ChunkRecord>> linked,
                          LinkChunks(earlier, meeting, shard.leaf));
      if (linked) {
        out.linked.insert(out.linked.end(), linked->begin(), linked->end());
        continue;
      }
    }
    out.to_write.push_back(ReadFrom(std::move(reader), from, stored_leaf, shard, options));
  }
  return out;
}

}  // namespace shardkeep::internal
