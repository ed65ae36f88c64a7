// The restore pipeline: open a committed checkpoint, find the chunks that
// intersect each requested box, read them with few large reads on several
// threads, verify, decompress, and copy (casting) into the destinations.
#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "engine/byte_limiter.h"
#include "engine/checked_read.h"
#include "engine/chunk_checks.h"
#include "engine/copy.h"
#include "engine/parallel.h"
#include "engine/safetensors_source.h"
#include "format/checkpointable_meta.h"
#include "format/commit_record.h"
#include "format/index.h"
#include "format/pytree_info.h"
#include "shardkeep/checkpoint.h"

namespace shardkeep {
namespace {

using internal::StoredChunk;

// The one checkpointable of a reader of safetensors files.
constexpr char kSafetensorsName[] = "tensors";

// A checkpointable's meta.json, as stored and decoded.
struct LoadedMeta {
  std::string json;
  format::CheckpointableMeta meta;
};

// Everything known about one pytree checkpointable once opened.
struct OpenCheckpointable {
  const format::CheckpointableMeta& meta;  // owned by the reader's metas_
  std::vector<std::vector<StoredChunk>> chunks_by_leaf;
};

// Where one chunk's data goes: a region of a request's destination.
struct Placement {
  const ReadRequest* request;
  Box region;
};

// One chunk to read and everything it feeds.
struct ChunkRead {
  const StoredChunk* chunk;
  std::vector<Placement> placements;
  // Set when the chunk's raw bytes are exactly one contiguous piece of a
  // destination in the stored dtype: it is read straight into place.
  uint8_t* direct = nullptr;
  // Set when the chunk is read row by row straight into its placements
  // (MarkScattered).
  bool scatter = false;
};

// The shortest row ReadScattered reads on its own. Below it one read into a
// buffer and a copy out of it cost less than a vectored read's per-buffer
// work (cpp/bench/scatter_read_bench: 256-byte rows read into place 1.7x
// faster than through a buffer, 128-byte rows 1.7x slower).
constexpr uint64_t kMinScatterRunBytes = 256;

// Consecutive chunks of one data file fetched by a single read.
struct RangeRead {
  int process;
  uint32_t data_file;
  uint64_t offset;
  uint64_t length;
  std::vector<ChunkRead*> chunks;
};

// Read buffers reused across the ranges of every Read call of a reader (a
// load reads in several batches). A fresh buffer per range costs an
// allocation and a first touch of every page (the dominant cost on virtual
// machines), and std::vector would zero it too. The reader keeps at most as
// many as it had reads in flight at once, each at most one range, until it
// is closed.
class ScratchBuffers {
 public:
  struct Buffer {
    std::unique_ptr<uint8_t[]> data;
    size_t size = 0;
  };

  // The smallest free buffer that holds `size` bytes; when none does, one
  // is dropped for a new one, so that the number kept does not grow.
  // Buffers of several sizes are in use at once (a range's stored bytes,
  // a compressed chunk's decoded bytes and planes).
  Buffer Take(size_t size) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->size >= size && (best == free_.end() || it->size < best->size)) best = it;
      }
      if (best == free_.end() && !free_.empty()) best = free_.begin();
      if (best != free_.end()) {
        Buffer buffer = std::move(*best);
        free_.erase(best);
        if (buffer.size >= size) return buffer;
      }
    }
    return {std::make_unique_for_overwrite<uint8_t[]>(size), size};
  }

  void Give(Buffer buffer) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(buffer));
  }

 private:
  std::mutex mu_;
  std::vector<Buffer> free_;
};

class Reader final : public CheckpointReader {
 public:
  Reader(std::shared_ptr<Storage> storage, std::string path,
         format::CommitRecord commit, std::string commit_json)
      : storage_(std::move(storage)), path_(std::move(path)),
        root_(commit.data_folder ? path_ + "/" + *commit.data_folder : path_),
        commit_(std::move(commit)), commit_json_(std::move(commit_json)),
        info_(InfoOf(commit_)) {}

  // A reader of safetensors files: one pytree checkpointable, already open.
  Reader(std::shared_ptr<Storage> storage, std::string path,
         internal::SafetensorsSource source)
      : Reader(std::move(storage), path, SafetensorsRecord(),
               format::EncodeCommitRecord(SafetensorsRecord())) {
    external_files_ = std::move(source.files);
    auto loaded = std::make_unique<LoadedMeta>();
    loaded->meta = std::move(source.meta);
    loaded->json = format::EncodeCheckpointableMeta(loaded->meta);
    auto part = std::unique_ptr<OpenCheckpointable>(
        new OpenCheckpointable{loaded->meta, {}});
    part->chunks_by_leaf.resize(part->meta.leaves.size());
    for (format::ChunkRecord& chunk : source.chunks) {
      part->chunks_by_leaf[chunk.leaf].push_back({std::move(chunk), 0});
    }
    metas_[kSafetensorsName] = std::move(loaded);
    open_[kSafetensorsName] = std::move(part);
  }

  const std::string& commit_json() const override { return commit_json_; }
  const CheckpointInfo& Info() const override { return info_; }

  Result<PytreeInfo> Pytree(const std::string& name) override {
    SK_ASSIGN_OR_RETURN(std::string kind, CheckListed(name));
    if (kind != "pytree") {
      return InvalidArgumentError("checkpointable '" + name + "' of " + path_ +
                                  " is a " + kind + " value, not a pytree");
    }
    SK_ASSIGN_OR_RETURN(OpenCheckpointable* part, Open(name));
    PytreeInfo info = format::PytreeInfoOf(part->meta);
    info.stored_bytes.assign(info.leaves.size(), 0);
    for (size_t i = 0; i < info.leaves.size(); ++i) {
      for (const StoredChunk& chunk : part->chunks_by_leaf[i]) {
        info.stored_bytes[i] += chunk.record.stored_length;
      }
    }
    return info;
  }

  Result<std::vector<LeafChunk>> Chunks(const std::string& name, uint32_t leaf) override {
    SK_ASSIGN_OR_RETURN(OpenCheckpointable* part, Open(name));
    if (leaf >= part->chunks_by_leaf.size()) {
      return InvalidArgumentError("checkpointable '" + name + "' of " + path_ + " has " +
                                  std::to_string(part->chunks_by_leaf.size()) +
                                  " leaves, not leaf #" + std::to_string(leaf));
    }
    std::vector<LeafChunk> chunks;
    for (const StoredChunk& chunk : part->chunks_by_leaf[leaf]) {
      chunks.push_back({chunk.record.box, RangeOf(name, chunk), chunk.record.codec,
                        chunk.record.raw_length});
    }
    return chunks;
  }

  Result<std::string> MetaJson(const std::string& name) override {
    std::lock_guard<std::mutex> lock(mu_);
    SK_ASSIGN_OR_RETURN(const LoadedMeta* loaded, LoadMeta(name));
    return loaded->json;
  }

  Result<std::vector<std::optional<StoredRange>>> Locate(
      const std::string& name, const std::vector<ReadRequest>& requests,
      const Options& options) override {
    SK_ASSIGN_OR_RETURN(OpenCheckpointable* part, Open(name));
    std::vector<std::optional<StoredRange>> out;
    out.reserve(requests.size());
    for (const ReadRequest& request : requests) {
      std::map<const StoredChunk*, ChunkRead> reads;
      Slabs slabs;
      SK_RETURN_IF_ERROR(Plan(name, *part, request, options, reads, slabs));
      const StoredChunk* chunk = reads.size() == 1 ? reads.begin()->first : nullptr;
      if (chunk == nullptr || chunk->record.box != request.box ||
          chunk->record.codec != format::Codec::kRaw ||
          part->meta.leaves[request.leaf].dtype != DTypeName(request.dtype)) {
        out.emplace_back(std::nullopt);
        continue;
      }
      out.push_back(RangeOf(name, *chunk));
    }
    return out;
  }

  Result<std::vector<std::vector<StoredRange>>> Ranges(
      const std::string& name, const std::vector<ReadRequest>& requests,
      const Options& options) override {
    SK_ASSIGN_OR_RETURN(OpenCheckpointable* part, Open(name));
    std::vector<std::vector<StoredRange>> out;
    out.reserve(requests.size());
    for (const ReadRequest& request : requests) {
      // Planned alone, as Read plans it: one entry per chunk (or slab).
      std::map<const StoredChunk*, ChunkRead> reads;
      Slabs slabs;
      SK_RETURN_IF_ERROR(Plan(name, *part, request, options, reads, slabs));
      std::vector<const StoredChunk*> chunks;
      chunks.reserve(reads.size());
      for (const auto& [chunk, read] : reads) chunks.push_back(chunk);
      std::sort(chunks.begin(), chunks.end(), InFileOrder);
      std::vector<StoredRange>& ranges = out.emplace_back();
      ranges.reserve(chunks.size());
      for (const StoredChunk* chunk : chunks) ranges.push_back(RangeOf(name, *chunk));
    }
    return out;
  }

  Result<std::string> ReadValue(const std::string& name) override {
    SK_ASSIGN_OR_RETURN(std::string kind, CheckListed(name));
    if (kind == "pytree") {
      return InvalidArgumentError("checkpointable '" + name +
                                  "' is a pytree, not a json/bytes value");
    }
    const std::string file = Folder(name) + "/" + (kind == "json" ? "value.json" : "value.bin");
    SK_ASSIGN_OR_RETURN(
        internal::CheckedBytes read,
        internal::ReadAllChecked(*storage_, file, [&](const std::string& bytes) {
          return format::CheckListedChecksum(bytes, Listed(name)->value_checksum, file);
        }));
    SK_RETURN_IF_ERROR(read.check);
    return std::move(read.bytes);
  }

  Status Read(const std::string& name, const std::vector<ReadRequest>& requests,
              const Options& options) override {
    SK_ASSIGN_OR_RETURN(OpenCheckpointable* part, Open(name));
    std::map<const StoredChunk*, ChunkRead> reads;
    Slabs slabs;
    for (const ReadRequest& request : requests) {
      SK_RETURN_IF_ERROR(Plan(name, *part, request, options, reads, slabs));
    }
    const StorageFeatures features = storage_->features();
    if (features.scatter_reads) MarkScattered(*part, reads);
    std::vector<RangeRead> ranges =
        Coalesce(reads, options, features.min_efficient_read_bytes);
    internal::ByteLimiter limiter(options.ResolvedHostMemoryLimit());
    const int threads = options.io_threads > 0
                            ? options.io_threads
                            : std::max(options.ResolvedIoThreads(),
                                       features.parallel_reads);
    return internal::ParallelFor(
        ranges.size(), threads, [&](size_t i) {
          return ReadRange(name, *part, ranges[i], limiter);
        });
  }

 private:
  static CheckpointInfo InfoOf(const format::CommitRecord& commit) {
    CheckpointInfo info;
    info.step = commit.step;
    info.created_ns = commit.created_ns;
    info.committed_ns = commit.committed_ns;
    info.process_count = commit.process_count;
    for (const auto& entry : commit.checkpointables) {
      info.checkpointables.push_back({entry.name, entry.kind});
    }
    info.custom_metadata_json = commit.custom_metadata.dump();
    info.metrics_json = commit.metrics.dump();
    return info;
  }

  Result<std::string> CheckListed(const std::string& name) const {
    if (const format::CheckpointableEntry* entry = Listed(name)) return entry->kind;
    std::string listed;
    for (const auto& entry : commit_.checkpointables) {
      listed += (listed.empty() ? "" : ", ") + entry.name;
    }
    return NotFoundError("checkpoint " + path_ + " has no checkpointable '" + name +
                         "' (it has: " + listed + ")");
  }

  // The record's entry for `name`; null when it lists none.
  const format::CheckpointableEntry* Listed(const std::string& name) const {
    for (const auto& entry : commit_.checkpointables) {
      if (entry.name == name) return &entry;
    }
    return nullptr;
  }

  // The folder of checkpointable `name`: beside _SHARDKEEP, or in the
  // generation the record names (saves on object stores).
  std::string Folder(const std::string& name) const { return root_ + "/" + name; }

  std::string DataFilePath(const std::string& name, int process, uint32_t data_file) const {
    if (!external_files_.empty()) return external_files_[data_file];
    return Folder(name) + "/" + format::DataFileName(process, data_file);
  }

  // The bytes of `chunk` (or slab) in its data file.
  StoredRange RangeOf(const std::string& name, const StoredChunk& chunk) const {
    StoredRange range{DataFilePath(name, chunk.process, chunk.record.data_file),
                      chunk.record.offset, chunk.record.stored_length, std::nullopt};
    if (external_files_.empty()) range.checksum = chunk.record.checksum;
    return range;
  }

  // The order reads go in: by data file, then offset.
  static bool InFileOrder(const StoredChunk* a, const StoredChunk* b) {
    return std::tie(a->process, a->record.data_file, a->record.offset) <
           std::tie(b->process, b->record.data_file, b->record.offset);
  }

  static format::CommitRecord SafetensorsRecord() {
    format::CommitRecord record;
    record.checkpointables.push_back({kSafetensorsName, "pytree", std::nullopt, std::nullopt});
    return record;
  }

  // Reads and checks meta.json of `name` once (a load asks for it twice:
  // the Python front to plan, the reader to check requests; decoding a tree
  // of thousands of leaves takes tens of milliseconds). REQUIRES: mu_ held.
  Result<const LoadedMeta*> LoadMeta(const std::string& name) {
    auto it = metas_.find(name);
    if (it != metas_.end()) return it->second.get();
    SK_RETURN_IF_ERROR(CheckListed(name).status());
    const std::string file = Folder(name) + "/" + format::kMetaFileName;
    auto loaded = std::make_unique<LoadedMeta>();
    // Its bytes are checked against the record before they are decoded.
    SK_ASSIGN_OR_RETURN(
        internal::CheckedBytes read,
        internal::ReadAllChecked(*storage_, file, [&](const std::string& bytes) {
          SK_RETURN_IF_ERROR(
              format::CheckListedChecksum(bytes, Listed(name)->meta_checksum, file));
          Result<format::CheckpointableMeta> meta = format::DecodeCheckpointableMeta(bytes, file);
          if (meta.ok()) loaded->meta = std::move(*meta);
          return meta.status();
        }));
    SK_RETURN_IF_ERROR(read.check);
    loaded->json = std::move(read.bytes);
    return (metas_[name] = std::move(loaded)).get();
  }

  // Loads meta.json and every index of `name` once.
  Result<OpenCheckpointable*> Open(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = open_.find(name);
    if (it != open_.end()) return it->second.get();
    SK_ASSIGN_OR_RETURN(const LoadedMeta* loaded, LoadMeta(name));
    auto part = std::unique_ptr<OpenCheckpointable>(
        new OpenCheckpointable{loaded->meta, {}});
    part->chunks_by_leaf.resize(part->meta.leaves.size());
    auto listed = commit_.index_files.find(name);
    if (listed == commit_.index_files.end()) return &Remember(name, std::move(part));
    for (const std::string& index : listed->second) {
      const std::string file = Folder(name) + "/" + index;
      std::vector<format::ChunkRecord> records;
      Result<internal::CheckedBytes> read =
          internal::ReadAllChecked(*storage_, file, [&](const std::string& bytes) {
            Result<std::vector<format::ChunkRecord>> decoded = format::DecodeIndex(bytes, file);
            if (decoded.ok()) records = std::move(*decoded);
            return decoded.status();
          });
      if (read.status().code() == StatusCode::kNotFound) {
        return CorruptionError("checkpoint " + path_ + " is incomplete: " + file +
                               ", listed in _SHARDKEEP, is missing");
      }
      SK_RETURN_IF_ERROR(read.status());
      SK_RETURN_IF_ERROR(read->check);
      const int process = internal::ProcessOfIndexFile(index);
      for (auto& record : records) {
        SK_RETURN_IF_ERROR(internal::CheckChunkRecord(part->meta, record, file));
        part->chunks_by_leaf[record.leaf].push_back({std::move(record), process});
      }
    }
    for (size_t leaf = 0; leaf < part->meta.leaves.size(); ++leaf) {
      SK_RETURN_IF_ERROR(CheckTiling(name, *part, leaf));
    }
    return &Remember(name, std::move(part));
  }

  // The chunks of an array leaf must cover each of its elements exactly
  // once; then every request inside the leaf is covered exactly too.
  Status CheckTiling(const std::string& name, const OpenCheckpointable& part,
                     size_t leaf) const {
    auto listed = commit_.index_files.find(name);
    return internal::CheckLeafTiling(
        part.meta.leaves[leaf], part.chunks_by_leaf[leaf],
        "checkpoint " + path_ + ": leaf '" + part.meta.leaves[leaf].path + "' of " + name,
        Folder(name),
        listed != commit_.index_files.end() ? listed->second : std::vector<std::string>());
  }

  // REQUIRES: mu_ held.
  OpenCheckpointable& Remember(const std::string& name,
                               std::unique_ptr<OpenCheckpointable> part) {
    return *(open_[name] = std::move(part));
  }

  // Slabs of chunks (SlabOf), kept for one Read or Locate call.
  using Slabs = std::map<std::tuple<const StoredChunk*, uint64_t, uint64_t>, StoredChunk>;

  // A safetensors tensor is one chunk as large as the tensor, without a
  // checksum to verify, so a box of it need not be read whole: it is read
  // as the slab of whole leading-dimension rows that holds `region`, a
  // contiguous byte range (all of it for the row blocks of FSDP). Chunks
  // with checksums are read whole, as their checksum covers them whole.
  const StoredChunk* SlabOf(const StoredChunk& chunk, const Box& region, DType stored,
                            Slabs& slabs) const {
    const Box& box = chunk.record.box;
    if (external_files_.empty() || box.rank() == 0 || region.shape[0] == box.shape[0]) {
      return &chunk;
    }
    const uint64_t first_row = region.origin[0] - box.origin[0];
    auto [it, fresh] = slabs.try_emplace({&chunk, first_row, region.shape[0]});
    if (fresh) {
      // region is non-empty, so box.shape[0] > 0; the sizes fit (the
      // header decoder checked the tensor's bytes against its shape).
      const uint64_t row_bytes = box.NumElements() / box.shape[0] * DTypeSize(stored);
      StoredChunk& slab = it->second = chunk;
      slab.record.box.origin[0] += first_row;
      slab.record.box.shape[0] = region.shape[0];
      slab.record.offset += first_row * row_bytes;
      slab.record.stored_length = slab.record.raw_length = region.shape[0] * row_bytes;
    }
    return &it->second;
  }

  Status Plan(const std::string& name, OpenCheckpointable& part,
              const ReadRequest& request, const Options& options,
              std::map<const StoredChunk*, ChunkRead>& reads, Slabs& slabs) {
    if (request.leaf >= part.meta.leaves.size()) {
      return InvalidArgumentError("checkpointable '" + name + "' has no leaf #" +
                                  std::to_string(request.leaf));
    }
    const format::LeafMeta& leaf = part.meta.leaves[request.leaf];
    const std::string where = "leaf '" + leaf.path + "' of " + Folder(name);
    if (leaf.kind != format::LeafKind::kArray) {
      return InvalidArgumentError(where + " is not an array");
    }
    Box whole{std::vector<uint64_t>(leaf.shape.size(), 0), leaf.shape};
    if (!Contains(whole, request.box)) {
      return IncompatibleError(where + ": requested box " + request.box.ToString() +
                               " lies outside the stored shape " + whole.ToString());
    }
    SK_ASSIGN_OR_RETURN(DType stored, DTypeFromName(leaf.dtype));
    SK_RETURN_IF_ERROR(internal::CheckCast(stored, request.dtype,
                                           options.allow_lossy_cast)
                           .WithContext(where));
    // Open() proved the chunks tile the leaf, so they cover the box.
    for (const StoredChunk& stored_chunk : part.chunks_by_leaf[request.leaf]) {
      std::optional<Box> region = Intersect(stored_chunk.record.box, request.box);
      if (!region) continue;
      const StoredChunk& chunk = *SlabOf(stored_chunk, *region, stored, slabs);
      ChunkRead& read = reads[&chunk];
      read.chunk = &chunk;
      const bool whole_chunk = *region == chunk.record.box;
      if (request.dst != nullptr && whole_chunk && stored == request.dtype &&
          read.placements.empty() &&
          chunk.record.codec == format::Codec::kRaw &&
          internal::IsContiguousIn(*region, request.box)) {
        read.direct = request.dst +
                      internal::RowMajorOffset(*region, request.box) * DTypeSize(stored);
      } else {
        read.direct = nullptr;  // a second placement: read once, copy twice
      }
      read.placements.push_back({&request, std::move(*region)});
    }
    return Status::Ok();
  }

  // A safetensors chunk has no checksum, so it need not be read whole:
  // when its placements are disjoint regions of destinations in its own
  // dtype (the 2x4 boxes of a row-major tensor, each not one contiguous
  // range of it), each of their rows is read straight into place, with no
  // buffer and no copy.
  void MarkScattered(const OpenCheckpointable& part,
                     std::map<const StoredChunk*, ChunkRead>& reads) const {
    if (external_files_.empty()) return;
    for (auto& [chunk, read] : reads) {
      read.scatter = read.direct == nullptr && Scatterable(part, read);
    }
  }

  static bool Scatterable(const OpenCheckpointable& part, const ChunkRead& read) {
    const auto& record = read.chunk->record;
    if (record.codec != format::Codec::kRaw) return false;
    const std::string& stored = part.meta.leaves[record.leaf].dtype;
    for (size_t i = 0; i < read.placements.size(); ++i) {
      const Placement& placement = read.placements[i];
      const ReadRequest& request = *placement.request;
      if (request.dst == nullptr || DTypeName(request.dtype) != stored) return false;
      const uint64_t run = internal::RunsOf(record.box, request.box, placement.region).length;
      if (run * DTypeSize(request.dtype) < kMinScatterRunBytes) return false;
      for (size_t j = 0; j < i; ++j) {
        if (Intersect(placement.region, read.placements[j].region)) return false;
      }
    }
    return true;
  }

  // Groups chunk reads into ranges of one data file. Direct reads stay
  // alone (they land in distinct destinations); buffered ones merge while
  // the gap between them is small, trading a few wasted bytes for fewer
  // system calls.
  // Merges reads of neighbouring chunks of one data file. A chunk read
  // straight into place stays alone, unless requests cost more than copies
  // (ranges under `min_efficient_read_bytes`): then it joins its neighbours
  // and is copied out of the range's buffer like the others.
  static std::vector<RangeRead> Coalesce(std::map<const StoredChunk*, ChunkRead>& reads,
                                         const Options& options,
                                         uint64_t min_efficient_read_bytes) {
    std::vector<ChunkRead*> order;
    for (auto& [chunk, read] : reads) order.push_back(&read);
    std::sort(order.begin(), order.end(), [](const ChunkRead* a, const ChunkRead* b) {
      return InFileOrder(a->chunk, b->chunk);
    });
    const uint64_t max_range = std::max<uint64_t>(options.chunk_bytes, 8ull << 20);
    std::vector<RangeRead> ranges;
    for (ChunkRead* read : order) {
      const auto& record = read->chunk->record;
      RangeRead* last = ranges.empty() ? nullptr : &ranges.back();
      const bool worth_a_copy = last && last->length < min_efficient_read_bytes;
      const bool mergeable =
          last && (worth_a_copy || (!InPlace(*read) && !InPlace(*last->chunks.front()))) &&
          last->process == read->chunk->process &&
          last->data_file == record.data_file &&
          record.offset >= last->offset + last->length &&
          record.offset - (last->offset + last->length) <= options.coalesce_gap_bytes &&
          record.offset + record.stored_length - last->offset <= max_range;
      if (mergeable) {
        if (worth_a_copy) {
          for (ChunkRead* merged : {last->chunks.front(), read}) {
            merged->direct = nullptr;  // only a range's first can be
            merged->scatter = false;
          }
        }
        last->length = record.offset + record.stored_length - last->offset;
        last->chunks.push_back(read);
      } else {
        ranges.push_back({read->chunk->process, record.data_file, record.offset,
                          record.stored_length, {read}});
      }
    }
    return ranges;
  }

  // Read straight into its destinations, so alone in its range.
  static bool InPlace(const ChunkRead& read) { return read.direct || read.scatter; }

  Status ReadRange(const std::string& name, const OpenCheckpointable& part,
                   const RangeRead& range, internal::ByteLimiter& limiter) {
    const std::string file = DataFilePath(name, range.process, range.data_file);
    if (range.chunks.front()->direct) {
      ChunkRead& read = *range.chunks.front();
      SK_RETURN_IF_ERROR(
          storage_->ReadAt(file, range.offset, range.length, read.direct));
      return VerifyOrReread(part, read, read.direct, file);
    }
    if (range.chunks.front()->scatter) return ReadScattered(*range.chunks.front(), file);
    // The lengths come from an index: check them against the file before
    // sizing a buffer by them.
    SK_ASSIGN_OR_RETURN(uint64_t file_size, DataFileSize(file));
    if (range.offset > file_size || range.length > file_size - range.offset) {
      return CorruptionError(ChunkWhere(part, *range.chunks.back(), file) + " of " +
                             std::to_string(range.chunks.back()->chunk->record.stored_length) +
                             " bytes lies past the end of the file (" +
                             std::to_string(file_size) + " bytes)");
    }
    // The range's buffer and the decoding scratch CopyOut may need.
    uint64_t decoding = 0;
    for (const ChunkRead* read : range.chunks) {
      const auto& record = read->chunk->record;
      SK_ASSIGN_OR_RETURN(DType dtype, DTypeFromName(part.meta.leaves[record.leaf].dtype));
      decoding = std::max(decoding, internal::DecodeScratchBytes(record, DTypeSize(dtype)));
    }
    internal::ScopedBytes hold(limiter, range.length + decoding);
    ScratchBuffers::Buffer buffer = scratch_.Take(range.length);
    Status status = CopyOut(part, range, file, buffer.data.get());
    scratch_.Give(std::move(buffer));
    return status;
  }

  // Reads each row of each placement of `read` into place: the rows in file
  // order, the bytes no placement needs skipped.
  Status ReadScattered(const ChunkRead& read, const std::string& file) {
    const auto& record = read.chunk->record;
    const uint64_t item = DTypeSize(read.placements.front().request->dtype);
    std::vector<std::pair<uint64_t, ScatterPiece>> rows;  // by offset in the chunk
    for (const Placement& placement : read.placements) {
      uint8_t* dst = placement.request->dst;
      internal::ForEachRun(record.box, placement.request->box, placement.region,
                           [&](uint64_t from, uint64_t to, uint64_t count) {
                             rows.push_back({from * item, {dst + to * item, count * item}});
                           });
    }
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<ScatterPiece> pieces;
    pieces.reserve(2 * rows.size());
    uint64_t at = 0;
    for (const auto& [offset, piece] : rows) {
      if (offset > at) pieces.push_back({nullptr, offset - at});
      pieces.push_back(piece);
      at = offset + piece.size;
    }
    return storage_->ReadScatter(file, record.offset, pieces);
  }

  // Reads `range` into `buffer` and copies each of its chunks, verified
  // (and decoded), into the destinations that need it.
  Status CopyOut(const OpenCheckpointable& part, const RangeRead& range,
                 const std::string& file, uint8_t* buffer) {
    SK_RETURN_IF_ERROR(storage_->ReadAt(file, range.offset, range.length, buffer));
    for (ChunkRead* read : range.chunks) {
      const auto& record = read->chunk->record;
      uint8_t* stored = buffer + (record.offset - range.offset);
      SK_RETURN_IF_ERROR(VerifyOrReread(part, *read, stored, file));
      SK_ASSIGN_OR_RETURN(DType stored_dtype,
                          DTypeFromName(part.meta.leaves[record.leaf].dtype));
      if (record.codec != format::Codec::kRaw) {
        SK_RETURN_IF_ERROR(Decode(part, *read, stored_dtype, stored, file));
        continue;
      }
      for (const Placement& placement : read->placements) {
        internal::CopyRegion(stored, record.box, stored_dtype, placement.request->dst,
                             placement.request->box, placement.request->dtype,
                             placement.region);
      }
    }
    return Status::Ok();
  }

  // Decodes a compressed chunk into its destinations: straight into place
  // when it fills one contiguous run of a destination in its own dtype (a
  // load onto the sharding it was saved with), else into a buffer copied
  // from. The buffers come from scratch_, so their pages are touched once
  // per load, not once per chunk.
  Status Decode(const OpenCheckpointable& part, const ChunkRead& read, DType stored_dtype,
                const uint8_t* stored, const std::string& file) {
    const auto& record = read.chunk->record;
    const Placement& first = read.placements.front();
    const bool in_place = read.placements.size() == 1 && first.request->dst != nullptr &&
                          first.region == record.box && first.request->dtype == stored_dtype &&
                          internal::IsContiguousIn(record.box, first.request->box);
    const uint64_t item = DTypeSize(stored_dtype);
    ScratchBuffers::Buffer planes, decoded;
    if (const uint64_t block = internal::DecodeScratchBytes(record, item) - record.raw_length) {
      planes = scratch_.Take(block);
    }
    uint8_t* raw = nullptr;
    if (in_place) {
      raw = first.request->dst +
            internal::RowMajorOffset(record.box, first.request->box) * DTypeSize(stored_dtype);
    } else {
      decoded = scratch_.Take(record.raw_length);
      raw = decoded.data.get();
    }
    Status status = internal::DecodeChunk(record, stored, item, raw, planes.data.get(),
                                          part.meta.leaves[record.leaf].path, file);
    if (status.ok() && !in_place) {
      for (const Placement& placement : read.placements) {
        internal::CopyRegion(raw, record.box, stored_dtype, placement.request->dst,
                             placement.request->box, placement.request->dtype,
                             placement.region);
      }
    }
    for (ScratchBuffers::Buffer* used : {&planes, &decoded}) {
      if (used->data) scratch_.Give(std::move(*used));
    }
    return status;
  }

  // A committed data file never changes, so its size is asked of the
  // storage once per reader, not once per range (a stat, or a request on an
  // object store).
  Result<uint64_t> DataFileSize(const std::string& file) {
    {
      std::lock_guard<std::mutex> lock(sizes_mu_);
      auto known = file_sizes_.find(file);
      if (known != file_sizes_.end()) return known->second;
    }
    SK_ASSIGN_OR_RETURN(uint64_t size, storage_->FileSize(file));
    std::lock_guard<std::mutex> lock(sizes_mu_);
    file_sizes_.emplace(file, size);
    return size;
  }

  std::string ChunkWhere(const OpenCheckpointable& part, const ChunkRead& read,
                         const std::string& file) const {
    const auto& record = read.chunk->record;
    return internal::DescribeChunk(record, part.meta.leaves[record.leaf].path, file);
  }

  Status Verify(const OpenCheckpointable& part, const ChunkRead& read,
                const uint8_t* stored, const std::string& file) const {
    if (!external_files_.empty()) return Status::Ok();  // safetensors: no checksums
    const auto& record = read.chunk->record;
    return internal::CheckChunkChecksum(record, stored,
                                        part.meta.leaves[record.leaf].path, file);
  }

  // Verify, and on remote storage a second read of a chunk that fails.
  Status VerifyOrReread(const OpenCheckpointable& part, const ChunkRead& read,
                        uint8_t* stored, const std::string& file) {
    const auto& record = read.chunk->record;
    return internal::RereadAfterFailedCheck(
        *storage_, Verify(part, read, stored, file), file, record.offset,
        record.stored_length, stored, [&] { return Verify(part, read, stored, file); });
  }

  std::shared_ptr<Storage> storage_;
  const std::string path_;
  const std::string root_;  // the folder holding the checkpointable folders
  format::CommitRecord commit_;
  const std::string commit_json_;
  const CheckpointInfo info_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<LoadedMeta>> metas_;
  std::map<std::string, std::unique_ptr<OpenCheckpointable>> open_;
  ScratchBuffers scratch_;
  std::mutex sizes_mu_;  // guards file_sizes_ (taken by reader threads)
  std::map<std::string, uint64_t> file_sizes_;
  // Safetensors files: a chunk's data_file indexes them. Empty otherwise.
  std::vector<std::string> external_files_;
};

}  // namespace

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::OpenSafetensors(
    std::shared_ptr<Storage> storage, const std::string& path, const Options& options) {
  SK_ASSIGN_OR_RETURN(internal::SafetensorsSource source,
                      internal::OpenSafetensorsSource(*storage, path,
                                                      options.ResolvedIoThreads()));
  std::unique_ptr<CheckpointReader> reader =
      std::make_unique<Reader>(std::move(storage), path, std::move(source));
  return reader;
}

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    std::shared_ptr<Storage> storage, const std::string& path) {
  const std::string file = path + "/" + format::kCommitFileName;
  format::CommitRecord commit;
  Result<internal::CheckedBytes> read =
      internal::ReadAllChecked(*storage, file, [&](const std::string& bytes) {
        Result<format::CommitRecord> decoded = format::DecodeCommitRecord(bytes, file);
        if (decoded.ok()) commit = std::move(*decoded);
        return decoded.status();
      });
  if (!read.ok()) {
    if (read.status().code() == StatusCode::kNotFound) {
      return NotFoundError("no committed checkpoint at " + path + ": " + file +
                           " does not exist (the path is wrong, or its save "
                           "never committed)");
    }
    return read.status();
  }
  SK_RETURN_IF_ERROR(read->check);
  std::unique_ptr<CheckpointReader> reader = std::make_unique<Reader>(
      std::move(storage), path, std::move(commit), std::move(read->bytes));
  return reader;
}

Status CheckpointReader::ReadLeaf(const std::string& checkpointable,
                                  std::string_view path, DType dtype, void* dst,
                                  const Options& options, std::optional<Box> box) {
  SK_ASSIGN_OR_RETURN(PytreeInfo tree, Pytree(checkpointable));
  const LeafInfo* leaf = tree.Find(path);
  if (leaf == nullptr) {
    return NotFoundError("checkpointable '" + checkpointable + "' has no leaf '" +
                         std::string(path) + "'");
  }
  if (leaf->kind != LeafKind::kArray) {
    return InvalidArgumentError("leaf '" + leaf->path + "' of '" + checkpointable +
                                "' is a " + std::string(LeafKindName(leaf->kind)) +
                                ", not an array: its value is in LeafInfo::value_json");
  }
  ReadRequest request;
  request.leaf = leaf->index;
  request.dtype = dtype;
  request.box = box ? *box : Box{std::vector<uint64_t>(leaf->shape.size(), 0), leaf->shape};
  request.dst = static_cast<uint8_t*>(dst);
  return Read(checkpointable, {request}, options);
}

}  // namespace shardkeep
