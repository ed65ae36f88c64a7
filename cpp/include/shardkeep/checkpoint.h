// Saving and loading checkpoints: the engine's public entry points.
//
// A save is a blocking StartSave() (validation, the commit protocol's
// preparation) followed by a background phase owned by the returned
// SaveHandle (chunking, checksums, parallel writes, the commit). A load
// opens a CheckpointReader and asks for boxes of leaves.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardkeep/box.h"
#include "shardkeep/contents.h"
#include "shardkeep/coordinator.h"
#include "shardkeep/dtype.h"
#include "shardkeep/future.h"
#include "shardkeep/options.h"
#include "shardkeep/status.h"
#include "shardkeep/storage.h"

namespace shardkeep {

class ShardFeed;  // shardkeep/shard_feed.h

// Where a box's bytes already are: leaf `leaf_path` (a key path,
// LeafInfo::path) of pytree checkpointable `checkpointable` in the
// committed checkpoint at `checkpoint`, in the save's own storage, as the
// save whose commit record says `created_ns` wrote it. A save of an array
// that has not changed since that save (or since it was loaded from
// there) names it instead of passing the bytes again.
struct StoredIn {
  std::string checkpoint;
  std::string checkpointable;
  std::string leaf_path;
  int64_t created_ns = 0;
};

// The bytes of one box of one leaf, row-major, little-endian, contiguous.
// The memory is borrowed: it must stay valid until the save completes
// (SaveRequest::keepalive can own it).
struct ShardData {
  uint32_t leaf = 0;
  DType dtype = DType::kUInt8;
  Box box;
  const uint8_t* data = nullptr;
  // Instead of `data`: writes the bytes of `chunk` (a box inside `box`)
  // row-major into `dst`. The save calls it on its writer threads, once per
  // chunk as it writes it, so a save from sources holds at most one chunk
  // per writer thread (Options::chunk_bytes × io_threads) however large the
  // state: conversions from other formats stream this way. Thread-safe; an
  // error fails the save.
  std::function<Status(const Box& chunk, uint8_t* dst)> fill;
  // Instead of `data` and `fill`: the box holds the same values, in the
  // same dtype, as it does in an earlier checkpoint. The save links that
  // checkpoint's data files where its chunks cover the box exactly and the
  // storage can link (Storage::Link): those bytes are neither read nor
  // written again. Otherwise it reads the box from there and writes it.
  // NotFound when that checkpoint is gone or is no longer the one created
  // at `created_ns` (a forced save replaced it).
  std::optional<StoredIn> stored_in;
  // With `data`: an earlier checkpoint whose box of this leaf may hold the
  // same bytes (a leaf saved there under the same key path). Where the
  // chunks stored there cover the box exactly, each has the checksum of
  // the matching part of `data` and the same bytes when read back, and the
  // storage can link, the save links them instead of writing `data`.
  // Anything else (the checkpoint gone or replaced, the leaf absent or of
  // another dtype or shape, one byte different) writes `data`.
  std::optional<StoredIn> compare_with;
};

struct CheckpointablePayload {
  std::string name;       // folder name: 1-255 of [A-Za-z0-9_.-], not starting
                          // with '.', not _SHARDKEEP (CheckCheckpointableName)
  std::string kind;       // "pytree", "json", "bytes"
  std::string meta_json;  // meta.json content (written by the primary)
  std::vector<ShardData> shards;  // kind "pytree": this process's shards
  std::string value;  // kind "json"/"bytes": value.json / value.bin content
  // Kind "pytree", instead of `shards`: this process's shards, handed over
  // while the save runs (shardkeep/shard_feed.h). The writers start on the
  // first ones; each is checked against meta.json as it is taken. The save
  // fails if the feed fails, or if no shard arrives for Options::timeout_s.
  std::shared_ptr<ShardFeed> feed;
};

struct SaveRequest {
  std::string path;  // the checkpoint's path in `storage`
  std::vector<CheckpointablePayload> parts;
  std::optional<int64_t> step;
  // JSON objects stored in the commit record (InvalidArgument otherwise).
  std::string custom_metadata_json = "{}";
  std::string metrics_json = "{}";
  bool force = false;  // replace a committed checkpoint at `path`
  // Names this save's barriers. Unique per save and identical on every
  // process: agreed with the other processes before starting the save
  // (OperationIds::Agree("save", path, ...), shardkeep/operation_ids.h).
  // Required when the coordinator has more than one process
  // (InvalidArgument otherwise): a number each process counted for itself
  // would name another save's barriers as soon as one process skipped or
  // repeated a save, and the job would hang until its timeout. Empty in a
  // single-process save: numbered by this process's StartSave calls.
  std::string operation_id;
  // Released when the background phase ends: owns the shard memory.
  std::shared_ptr<void> keepalive;
};

// Owns the background phase of one save: its thread, joined by the
// destructor (so dropping the handle waits for the save), and its outcome.
class SaveHandle {
 public:
  struct State;  // the thread, the future and how to cancel (save.cc)
  explicit SaveHandle(std::unique_ptr<State> state);
  SaveHandle(const SaveHandle&) = delete;
  SaveHandle& operator=(const SaveHandle&) = delete;
  ~SaveHandle();
  const Future& future() const;

  // Stops the save from committing if it still can be stopped, and its
  // writers from starting new chunks. Ok: it will not commit (its future
  // resolves with an error once the background phase has wound down).
  // AlreadyExists: the commit was already under way; the future's outcome
  // says whether it succeeded. Any other error: whether it commits cannot
  // be known (the coordinator failed). Thread-safe; may be called again.
  Status Cancel();
  // The checkpoint's created_ns in its commit record (the same on every
  // process of the save): with the path, it tells this save's checkpoint
  // from a later one that replaced it (StoredIn::created_ns).
  int64_t created_ns() const;

 private:
  std::unique_ptr<State> state_;
};

// Runs the blocking phase and starts the background phase. An error of the
// blocking phase (bad request, committed checkpoint without `force`,
// storage failure while preparing) is returned here; later ones resolve the
// handle's future. A null `coordinator` saves as a single process.
Result<std::unique_ptr<SaveHandle>> StartSave(
    std::shared_ptr<Storage> storage, std::shared_ptr<Coordinator> coordinator,
    SaveRequest request, const Options& options);

// StartSave + wait.
Status Save(std::shared_ptr<Storage> storage,
            std::shared_ptr<Coordinator> coordinator, SaveRequest request,
            const Options& options);

// One box of one leaf to fill: `dst` holds the box row-major in `dtype`
// (which may differ from the stored dtype: a cast).
struct ReadRequest {
  uint32_t leaf = 0;
  DType dtype = DType::kUInt8;
  Box box;
  uint8_t* dst = nullptr;
};

// A byte range of a data file: a chunk as stored (or the slab of a
// safetensors tensor a read takes), and the XXH3-64 checksum of its bytes
// (none for safetensors files, which carry no checksums).
struct StoredRange {
  std::string file;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::optional<uint64_t> checksum;
};

// How a chunk's bytes are stored (docs/FORMAT.md §5).
enum class ChunkCodec : uint32_t {
  kRaw = 0,             // the elements as they are
  kZstd = 1,            // one zstd frame of them
  kZstdBytePlanes = 2,  // one zstd frame of their byte planes
};

// One chunk of a leaf as its index records it.
struct LeafChunk {
  Box box;
  StoredRange range;  // the data file and where the chunk's bytes lie in it
  ChunkCodec codec = ChunkCodec::kRaw;
  uint64_t raw_length = 0;  // bytes once decoded
};

// The checksum stored for each chunk (XXH3-64 of its stored bytes).
uint64_t ChunkChecksum(const void* data, size_t size);

class CheckpointReader {
 public:
  // Reads and checks `<path>/_SHARDKEEP`. NotFound when it is absent (a
  // path without it is not a checkpoint, even if other files exist).
  static Result<std::unique_ptr<CheckpointReader>> Open(
      std::shared_ptr<Storage> storage, const std::string& path);
  virtual ~CheckpointReader() = default;

  // Opens safetensors files (Hugging Face) as a checkpoint holding one
  // pytree checkpointable, "tensors", whose leaves are the tensors (key
  // path: the escaped tensor name), each stored as one raw chunk: Read,
  // ReadLeaf and Locate work on them as on shardkeep's own chunks, without
  // checksums. `path` is a .safetensors file, a folder of them, or an index
  // JSON ({"weight_map": {tensor: file}}). Headers are checked like
  // shardkeep's own index (docs/INTEROP.md): Corruption names the file.
  static Result<std::unique_ptr<CheckpointReader>> OpenSafetensors(
      std::shared_ptr<Storage> storage, const std::string& path,
      const Options& options = Options());

  // The decoded `_SHARDKEEP` as JSON text, and as fields.
  virtual const std::string& commit_json() const = 0;
  virtual const CheckpointInfo& Info() const = 0;
  // The tree and leaves of pytree checkpointable `name`, with the bytes
  // each leaf's chunks take in storage. Reads meta.json and every index of
  // `name` and proves that each array leaf's chunks tile it. NotFound for
  // an unknown name, InvalidArgument for a json/bytes checkpointable.
  virtual Result<PytreeInfo> Pytree(const std::string& checkpointable) = 0;
  // The chunks that hold leaf `leaf` (LeafInfo::index) of pytree
  // `checkpointable`, in index order: they tile the leaf (checked as
  // Pytree checks it). Needs only meta.json and the index files.
  virtual Result<std::vector<LeafChunk>> Chunks(const std::string& checkpointable,
                                                uint32_t leaf) = 0;
  // `<checkpointable>/meta.json`, checked. NotFound for an unknown name.
  virtual Result<std::string> MetaJson(const std::string& checkpointable) = 0;
  // value.json / value.bin of a json/bytes checkpointable.
  virtual Result<std::string> ReadValue(const std::string& checkpointable) = 0;
  // Fills every request from the chunks of `checkpointable`, reading only
  // the chunks that intersect the requested boxes, in parallel; verifies
  // checksums and coverage. Errors name the leaf and the file.
  virtual Status Read(const std::string& checkpointable,
                      const std::vector<ReadRequest>& requests,
                      const Options& options) = 0;
  // For each request (dst unused): its StoredRange when its bytes are one
  // raw chunk of the requested dtype, else nullopt. Lets a caller map files
  // instead of reading them (verifying the checksum itself). Requests are
  // checked as by Read, coverage included.
  virtual Result<std::vector<std::optional<StoredRange>>> Locate(
      const std::string& checkpointable, const std::vector<ReadRequest>& requests,
      const Options& options) = 0;
  // For each request (dst unused): the byte ranges a Read of it fetches,
  // each chunk it touches once (whole, as its checksum covers it whole; of
  // a safetensors tensor, the slab of rows Read takes), ordered by data file
  // (process, then file number) and offset. Needs only meta.json and the
  // index files, not the data files: a caller can fetch exactly these bytes
  // from elsewhere (another process, a peer's copy) and then Read. Read may
  // also read the gaps between neighbouring ranges it merges
  // (Options::coalesce_gap_bytes) but uses none of their bytes. Requests are
  // checked as by Read.
  virtual Result<std::vector<std::vector<StoredRange>>> Ranges(
      const std::string& checkpointable, const std::vector<ReadRequest>& requests,
      const Options& options) = 0;

  // Reads leaf `path` (a key path, LeafInfo::path) of `checkpointable`
  // into `dst`: the whole leaf, or `box` of it, row-major in `dtype` (a
  // cast when it differs from the stored dtype). `dst` must hold the box's
  // elements × DTypeSize(dtype) bytes. NotFound names an unknown path.
  Status ReadLeaf(const std::string& checkpointable, std::string_view path,
                  DType dtype, void* dst, const Options& options,
                  std::optional<Box> box = std::nullopt);
};

}  // namespace shardkeep
