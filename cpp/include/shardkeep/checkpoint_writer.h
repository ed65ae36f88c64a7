// Writing a checkpoint from C++ in the format the Python front loads,
// without writing meta.json by hand: declare the leaves of each pytree
// checkpointable by key path, hand over this process's shards of its array
// leaves, add json/bytes checkpointables and the commit record's fields,
// then commit through the engine's commit protocol (StartSave).
//
//   auto where = shardkeep::ResolveStorage("/ckpts/run/000100");  // or s3://
//   shardkeep::CheckpointWriter writer(where->storage, where->path);
//   SK_ASSIGN_OR_RETURN(shardkeep::PytreeBuilder* state, writer.AddPytree("state"));
//   SK_RETURN_IF_ERROR(state->AddArray("params/w", DType::kFloat32, {64, 32}));
//   SK_RETURN_IF_ERROR(state->AddShard("params/w", DType::kFloat32,
//                                      Box{{0, 0}, {64, 32}}, w, sizeof(w)));
//   SK_RETURN_IF_ERROR(state->AddInt("step", 100));
//   writer.SetStep(100);
//   SK_RETURN_IF_ERROR(writer.Commit(shardkeep::Options()));
//
// The tree. By default each checkpointable's structure is built from the
// key paths as nested dicts: a path's segments are unescaped (UnescapeKey:
// "~0" → '~', "~1" → '/') and become string keys, in the order the paths
// were first declared, so "layers/0/w" gives {"layers": {"0": {"w": …}}}
// (the key is the string "0", not a list position). The empty path ""
// makes the tree a single leaf. A caller who needs lists, tuples or named
// tuples passes the structure itself (PytreeBuilder::SetTree).
//
// Several processes (a caller-supplied Coordinator): every process builds
// the same checkpoint, declaring the same leaves, tree and checkpointables
// in the same order, and adds only its own shards; the engine refuses a
// save whose meta.json differs between processes. The values of json and
// bytes checkpointables and the commit record's fields are written by
// process 0. The shards of
// all processes together must tile each array leaf exactly once: each
// process checks that its own do not overlap, but only a reader can see a
// gap between processes (Pytree() and loads fail, naming the leaf). A
// process that fails before Start leaves the others waiting in the save's
// first barrier until Options::timeout_s, which then fails them all.
//
// Not thread-safe: one thread builds a writer. Nothing is written before
// Start/Commit.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardkeep/box.h"
#include "shardkeep/checkpoint.h"
#include "shardkeep/coordinator.h"
#include "shardkeep/dtype.h"
#include "shardkeep/options.h"
#include "shardkeep/status.h"
#include "shardkeep/storage.h"

namespace shardkeep {

// The leaves, shards and structure of one pytree checkpointable. Obtained
// from CheckpointWriter::AddPytree and owned by the writer.
//
// Paths are escaped key paths (LeafInfo::path): keys joined by '/', each
// escaped with EscapeKey. Every method checks its input and returns
// InvalidArgument naming the checkpointable and the path: a '~' not
// followed by '0' or '1', a path declared twice, a path that is a prefix of
// another leaf's path ("a" and "a/b": a leaf cannot also be a container),
// a second leaf beside the root leaf "".
class PytreeBuilder {
 public:
  ~PytreeBuilder();
  PytreeBuilder(const PytreeBuilder&) = delete;
  PytreeBuilder& operator=(const PytreeBuilder&) = delete;

  // An array leaf of `dtype` and global `shape` ({} for a 0-d array). Its
  // elements are written from the shards added with AddShard. Rank at most
  // 64 and at most 2^63 bytes.
  //
  // `sharding_json` describes the sharding it was computed with: "null"
  // (none) or a JSON object, stored as is and shown by shardkeep.metadata
  // and `shardkeep info`. The Python front writes, and understands,
  //   {"type": "named", "axis_names": ["data"], "mesh_shape": [4],
  //    "spec": ["data", null], "device_ids": [0, 1, 2, 3]}
  // (a jax NamedSharding; spec entries are axis names, null, or lists of
  // names) and {"type": "single_device", "device_id": 0}.
  Status AddArray(std::string path, DType dtype, std::vector<uint64_t> shape,
                  std::string sharding_json = "null");
  // Scalar leaves, loaded by Python as bool, int and float; strings as str
  // and AddNone as None. No shards.
  Status AddBool(std::string path, bool value);
  Status AddInt(std::string path, int64_t value);
  Status AddFloat(std::string path, double value);  // nan and ±inf too
  Status AddString(std::string path, std::string value);
  Status AddNone(std::string path);

  // One box of array leaf `path` held by this process: `box` (of the
  // leaf's rank, inside its shape), elements row-major, little-endian,
  // `dtype` equal to the declared one, `size` = box elements × itemsize.
  // The memory is borrowed: it must stay valid and unchanged until the save
  // completes (Commit returns, or the handle of Start resolves). Boxes of
  // one leaf must not overlap; without a coordinator (or with one of a
  // single process) they must cover the leaf, which Start checks.
  Status AddShard(std::string_view path, DType dtype, Box box, const void* data,
                  size_t size);
  // The same with memory the writer owns from now on and frees once the
  // save completes.
  Status AddShard(std::string_view path, DType dtype, Box box,
                  std::vector<uint8_t> data);
  // A shard produced while the save writes (ShardData::fill): `fill(chunk,
  // dst)` writes the bytes of one chunk of `box`, row-major, and is called
  // on the save's writer threads, chunk by chunk, so the save holds a
  // chunk per writer thread, never the shard. Conversions use it.
  Status AddShardSource(std::string_view path, DType dtype, Box box,
                        std::function<Status(const Box& chunk, uint8_t* dst)> fill);

  // Replaces the nested dicts built from the paths with `tree_json`, a
  // structure node of docs/FORMAT.md §4.1 (dict, list, tuple, namedtuple,
  // custom, leaf). Each leaf node stands for the declared leaf whose path
  // its position gives (dict and custom keys escaped, integer keys and
  // list/tuple positions in decimal, namedtuple fields); its "leaf" number
  // is filled in by the writer and may be omitted. Start checks that every
  // declared leaf has exactly one node and every leaf node a declared leaf.
  Status SetTree(std::string tree_json);

  struct State;  // checkpoint_writer.cc

 private:
  friend class CheckpointWriter;
  explicit PytreeBuilder(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// A checkpoint to be written at `path` in `storage` (ResolveStorage gives
// both from a URL). Checkpointables are saved in the order added.
class CheckpointWriter {
 public:
  CheckpointWriter(std::shared_ptr<Storage> storage, std::string path);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // A pytree checkpointable named `name` (a folder name: 1-255 characters
  // of [A-Za-z0-9_.-], not starting with '.'); Python's shardkeep.load
  // reads the one named "state". The builder lives as long as the writer.
  // InvalidArgument for a bad name or one already added.
  Result<PytreeBuilder*> AddPytree(std::string name);
  // A json checkpointable holding the JSON document `json` (checked to
  // parse), and a bytes checkpointable holding `bytes`.
  Status AddJson(std::string name, std::string json);
  Status AddBytes(std::string name, std::string bytes);

  // The commit record's fields: the step (none by default), custom
  // metadata and metrics (JSON objects; InvalidArgument otherwise).
  void SetStep(int64_t step);
  Status SetCustomMetadata(std::string json_object);
  Status SetMetrics(std::string json_object);
  // Replace a checkpoint already committed at `path` (AlreadyExists
  // otherwise).
  void SetForce(bool force);
  // Write as one process of several; null (the default): a single process.
  void SetCoordinator(std::shared_ptr<Coordinator> coordinator);
  // Names the save's barriers (SaveRequest::operation_id): unique per save
  // and identical on every process, e.g. OperationIds::Agree("save", path,
  // timeout_s) (shardkeep/operation_ids.h). Empty (the default): numbered
  // by this OS process's saves, which suits processes that save in step.
  void SetOperationId(std::string operation_id);

  // Encodes every meta.json, checks each leaf's shards (overlaps; coverage
  // when this is the only process) and starts the save (StartSave): its
  // blocking phase runs here, the rest in the background, owned by the
  // returned handle. An error of these checks leaves the writer as it was,
  // to be fixed and started again; once the save has started (whatever its
  // outcome) the writer is spent: a second call, or adding to it, is
  // InvalidArgument.
  Result<std::unique_ptr<SaveHandle>> Start(const Options& options);
  // Start and wait for the commit.
  Status Commit(const Options& options);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace shardkeep
