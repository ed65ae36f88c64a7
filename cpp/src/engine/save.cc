// The save pipeline and its commit protocol. A checkpoint appears whole or
// not at all:
//
//  Blocking phase (caller's thread):
//   1. Validate the request against its own meta.json.
//   2. Primary: refuse a committed checkpoint at <path> unless `force`;
//      remove a stale <path>.shardkeep-tmp left by a crash; create it fresh
//      with <checkpointable>/{data,index}/ folders. Agreement "prepared".
//  Background phase (a thread owned by the SaveHandle):
//   3. Every process writes its chunks and its index into the temporary
//      folder and fsyncs them (WriteShards). The primary also writes the
//      values of json/bytes checkpointables.
//   4. Agreement "written".
//   5. Primary: writes every meta.json, then _SHARDKEEP, fsyncs them and
//      their folders; claims the outcome "commit" (see below); renames
//      <path>.shardkeep-tmp to <path> and fsyncs the parent. With `force`, a
//      committed <path> is first moved to <path>.shardkeep-old and deleted
//      after the rename. It then publishes the result of the commit.
//   6. Every other process waits for that published result; the futures
//      resolve with it.
//
// An agreement (Agree) is a barrier that also carries failures: a process
// that failed its part of a phase records the failure in the coordinator's
// key-value store and still arrives, so every process leaves the barrier
// knowing the phase failed. One that never arrives (dead, stalled, or
// unable to record its failure) makes the barrier time out everywhere
// (Options::timeout_s). Either way nothing is committed.
//
// The outcome key settles the race between a slow primary and processes
// that stop waiting for it: it is write-once, the primary sets it to
// "commit" just before the rename and a process that gives up sets it to
// "abort". Whoever sets it first decides; the primary renames only if it
// won, and a process that lost waits for the primary's published result.
//
// The rename is the commit point. If the parent-directory fsync after it
// fails, the rename is undone (the checkpoint was never reported durable);
// failing to delete <path>.shardkeep-old after a forced replace only leaves
// that folder behind for the next save to remove.
//
// A crash before the rename leaves only the temporary folder, which no
// reader accepts (it has no _SHARDKEEP at <path>) and the next save removes.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <set>
#include <system_error>

#include "engine/catch_exceptions.h"
#include "engine/shard_writer.h"
#include "format/checkpointable_meta.h"
#include "format/commit_record.h"
#include "format/index.h"
#include "shardkeep/cancellation.h"
#include "shardkeep/checkpoint.h"

namespace shardkeep {
namespace {

constexpr char kTmpSuffix[] = ".shardkeep-tmp";
constexpr char kOldSuffix[] = ".shardkeep-old";

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string FormatSeconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g s", seconds);
  return text;
}

std::string ParentDir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Every process numbers its saves in the same order, so the n-th save has
// the same barrier keys everywhere and never reuses an earlier one's.
std::string OperationId(const SaveRequest& request) {
  static std::atomic<uint64_t> sequence{0};
  const std::string n = request.operation_id.empty()
                            ? std::to_string(sequence.fetch_add(1))
                            : request.operation_id;
  return "shardkeep/save/" + n + "/" + request.path;
}

Status ValidateShard(const CheckpointablePayload& part,
                     const format::CheckpointableMeta& meta,
                     const ShardData& shard) {
  if (shard.leaf >= meta.leaves.size()) {
    return InvalidArgumentError("shard of leaf #" + std::to_string(shard.leaf) +
                                " but checkpointable '" + part.name + "' has " +
                                std::to_string(meta.leaves.size()) + " leaves");
  }
  const format::LeafMeta& leaf = meta.leaves[shard.leaf];
  const std::string where = "leaf '" + leaf.path + "' of '" + part.name + "'";
  if (leaf.kind != format::LeafKind::kArray) {
    return InvalidArgumentError(where + " is not an array but has a shard");
  }
  if (DTypeName(shard.dtype) != leaf.dtype) {
    return InvalidArgumentError(where + ": shard dtype " +
                                std::string(DTypeName(shard.dtype)) +
                                " differs from " + leaf.dtype);
  }
  Box whole{std::vector<uint64_t>(leaf.shape.size(), 0), leaf.shape};
  if (!Contains(whole, shard.box)) {
    return InvalidArgumentError(where + ": shard box " + shard.box.ToString() +
                                " lies outside shape " + whole.ToString());
  }
  if (shard.data == nullptr && shard.box.NumElements() > 0) {
    return InvalidArgumentError(where + ": shard has no data");
  }
  return Status::Ok();
}

Status ValidateRequest(const SaveRequest& request) {
  if (request.path.empty()) return InvalidArgumentError("empty checkpoint path");
  if (request.parts.empty()) {
    return InvalidArgumentError("nothing to save: no checkpointables");
  }
  std::set<std::string> names;
  for (const CheckpointablePayload& part : request.parts) {
    if (!format::IsSafeCheckpointableName(part.name)) {
      return InvalidArgumentError(
          "checkpointable name '" + part.name +
          "' must be 1-255 characters of [A-Za-z0-9_.-], not starting with '.'");
    }
    if (!names.insert(part.name).second) {
      return InvalidArgumentError("checkpointable '" + part.name + "' given twice");
    }
    SK_ASSIGN_OR_RETURN(format::CheckpointableMeta meta,
                        format::DecodeCheckpointableMeta(
                            part.meta_json, part.name + "/meta.json"));
    if (meta.kind != part.kind) {
      return InvalidArgumentError("checkpointable '" + part.name + "' is of kind '" +
                                  part.kind + "' but its meta.json says '" +
                                  meta.kind + "'");
    }
    for (const ShardData& shard : part.shards) {
      SK_RETURN_IF_ERROR(ValidateShard(part, meta, shard));
    }
  }
  return Status::Ok();
}

std::string ValueFileName(const std::string& kind) {
  return kind == "json" ? "value.json" : "value.bin";
}

class SaveOperation {
 public:
  SaveOperation(std::shared_ptr<Storage> storage,
                std::shared_ptr<Coordinator> coordinator, SaveRequest request,
                const Options& options)
      : storage_(std::move(storage)),
        coordinator_(std::move(coordinator)),
        request_(std::move(request)),
        options_(options),
        tmp_(request_.path + kTmpSuffix),
        id_(OperationId(request_)),
        created_ns_(NowNs()) {}

  // Steps 1–2.
  Status Prepare() {
    Status local = ValidateRequest(request_);
    if (local.ok() && coordinator_->is_primary()) local = PrepareTemporaryDir();
    return Agree("prepared", local);
  }

  // Steps 3–6.
  Status Run() {
    Status local;
    for (const CheckpointablePayload& part : request_.parts) {
      local = WritePart(part);
      if (!local.ok()) break;
    }
    SK_RETURN_IF_ERROR(Agree("written", local));
    if (coordinator_->is_primary()) {
      Status committed = Commit();
      // Best effort: a peer that cannot read this times out on its own.
      (void)coordinator_->KeyValueSet(Key("result"), committed.ok()
                                                         ? std::string("ok")
                                                         : committed.ToString());
      return committed;
    }
    return AwaitCommit();
  }

  // Claims the outcome "abort" (see the outcome key above), so that the
  // primary cannot commit any more. Ok: the save will not commit (this or
  // another process claimed "abort"). AlreadyExists: "commit" was claimed
  // first, so the commit is under way.
  Status Abandon() {
    Status claim = coordinator_->KeyValueSet(Key("outcome"), "abort");
    if (claim.code() != StatusCode::kAlreadyExists) return claim;
    SK_ASSIGN_OR_RETURN(std::optional<std::string> outcome,
                        coordinator_->KeyValueTryGet(Key("outcome")));
    if (outcome == "abort") return Status::Ok();
    return AlreadyExistsError("save of " + request_.path +
                              ": the commit is already under way");
  }

 private:
  std::string Key(const std::string& name) const { return id_ + "/" + name; }

  // Every process reports the outcome of a phase, then meets the others at
  // the phase's barrier: a failure anywhere fails the phase everywhere, so
  // no process waits for a peer that has given up and nothing is committed
  // after a failed write.
  Status Agree(const std::string& phase, const Status& local) {
    const std::string failed_key = Key(phase + "/failed");
    if (!local.ok()) {
      Status reported = coordinator_->KeyValueSet(
          failed_key, "process " + std::to_string(coordinator_->process_index()) +
                          ": " + local.ToString());
      // AlreadyExists: a peer has reported a failure already, which is
      // enough. Otherwise the others cannot learn of this failure, so this
      // process must not arrive: they time out instead of committing.
      if (!reported.ok() && reported.code() != StatusCode::kAlreadyExists) return local;
    }
    Status barrier = coordinator_->Barrier(Key(phase), options_.timeout_s);
    if (!local.ok()) return local;
    if (!barrier.ok()) return barrier.WithContext("save of " + request_.path);
    SK_ASSIGN_OR_RETURN(std::optional<std::string> failure,
                        coordinator_->KeyValueTryGet(failed_key));
    if (failure) {
      return CancelledError("save of " + request_.path + " abandoned in phase '" +
                            phase + "' because " + *failure);
    }
    return Status::Ok();
  }

  // Step 6 on a non-primary process.
  Status AwaitCommit() {
    Result<std::string> result =
        coordinator_->KeyValueGet(Key("result"), options_.timeout_s);
    if (!result.ok() && result.status().code() == StatusCode::kTimeout) {
      Status claim = coordinator_->KeyValueSet(Key("outcome"), "abort");
      std::optional<std::string> outcome = std::string("abort");
      if (claim.code() == StatusCode::kAlreadyExists) {
        SK_ASSIGN_OR_RETURN(outcome, coordinator_->KeyValueTryGet(Key("outcome")));
      }
      if (outcome != "commit") {
        return TimeoutError("save of " + request_.path + ": the primary (process 0) " +
                            "did not report the commit within " +
                            FormatSeconds(options_.timeout_s) + "; nothing was committed");
      }
      // The primary claimed the commit first: its result decides.
      result = coordinator_->KeyValueGet(Key("result"), options_.timeout_s);
    }
    SK_RETURN_IF_ERROR(result.status().WithContext(
        "save of " + request_.path + ": waiting for the primary's commit"));
    if (*result == "ok") return Status::Ok();
    return CancelledError("save of " + request_.path +
                          " was not committed because the primary failed: " + *result);
  }

  Status PrepareTemporaryDir() {
    const std::string& path = request_.path;
    SK_ASSIGN_OR_RETURN(bool committed,
                        storage_->Exists(path + "/" + format::kCommitFileName));
    if (committed && !request_.force) {
      return AlreadyExistsError("a checkpoint is already committed at " + path +
                                "; pass force=True to replace it");
    }
    if (!committed) {
      SK_ASSIGN_OR_RETURN(bool exists, storage_->Exists(path));
      if (exists) {
        SK_ASSIGN_OR_RETURN(std::vector<std::string> entries, storage_->List(path));
        if (!entries.empty() && !request_.force) {
          return AlreadyExistsError(path +
                                    " exists, is not empty and is not a shardkeep "
                                    "checkpoint; pass force=True to replace it");
        }
      }
    }
    SK_RETURN_IF_ERROR(storage_->DeleteRecursive(tmp_));
    for (const CheckpointablePayload& part : request_.parts) {
      SK_RETURN_IF_ERROR(storage_->CreateDir(tmp_ + "/" + part.name + "/data"));
      SK_RETURN_IF_ERROR(storage_->CreateDir(tmp_ + "/" + part.name + "/index"));
    }
    return Status::Ok();
  }

  Status WritePart(const CheckpointablePayload& part) {
    const std::string dir = tmp_ + "/" + part.name;
    if (part.kind == "pytree") {
      return internal::WriteShards(*storage_, dir, coordinator_->process_index(),
                                   part.shards, options_)
          .status();
    }
    if (!coordinator_->is_primary()) return Status::Ok();
    return storage_->WriteAll(dir + "/" + ValueFileName(part.kind), part.value, true);
  }

  Status Commit() {
    format::CommitRecord record;
    record.step = request_.step;
    record.created_ns = created_ns_;
    record.process_count = coordinator_->process_count();
    record.custom_metadata = request_.custom_metadata;
    record.metrics = request_.metrics;
    for (const CheckpointablePayload& part : request_.parts) {
      const std::string dir = tmp_ + "/" + part.name;
      SK_RETURN_IF_ERROR(storage_->WriteAll(
          dir + "/" + format::kMetaFileName, part.meta_json, true));
      record.checkpointables.push_back({part.name, part.kind});
      if (part.kind == "pytree") {
        std::vector<std::string>& files = record.index_files[part.name];
        for (int p = 0; p < record.process_count; ++p) {
          files.push_back(format::IndexFileName(p));
        }
      }
      for (const char* sub : {"/data", "/index", ""}) {
        SK_RETURN_IF_ERROR(storage_->SyncDir(dir + sub));
      }
    }
    record.committed_ns = NowNs();
    SK_RETURN_IF_ERROR(storage_->WriteAll(tmp_ + "/" + format::kCommitFileName,
                                          format::EncodeCommitRecord(record), true));
    SK_RETURN_IF_ERROR(storage_->SyncDir(tmp_));
    Status claim = coordinator_->KeyValueSet(Key("outcome"), "commit");
    if (claim.code() == StatusCode::kAlreadyExists) {
      return CancelledError("save of " + request_.path +
                            " not committed: other processes stopped waiting for the "
                            "commit (Options::timeout_s)");
    }
    SK_RETURN_IF_ERROR(claim);
    return MakeVisible();
  }

  Status MakeVisible() {
    const std::string& path = request_.path;
    const std::string old = path + kOldSuffix;
    SK_ASSIGN_OR_RETURN(bool replacing, storage_->Exists(path));
    if (replacing) {
      // Replacing (force): move the old one aside so the rename below lands
      // on a free name; the window without a checkpoint at <path> is two
      // renames long, and the old one survives it at <path>.shardkeep-old.
      SK_RETURN_IF_ERROR(storage_->DeleteRecursive(old));
      SK_RETURN_IF_ERROR(storage_->Rename(path, old));
    }
    Status renamed = storage_->Rename(tmp_, path);
    Status synced = renamed.ok() ? storage_->SyncDir(ParentDir(path)) : renamed;
    if (!synced.ok()) {
      // Not durable, so not committed: put everything back as it was.
      if (renamed.ok()) (void)storage_->Rename(path, tmp_);
      if (replacing) (void)storage_->Rename(old, path);
      return synced;
    }
    // Committed. A leftover old folder is removed by the next replace.
    if (replacing) (void)storage_->DeleteRecursive(old);
    return Status::Ok();
  }

  std::shared_ptr<Storage> storage_;
  std::shared_ptr<Coordinator> coordinator_;
  SaveRequest request_;
  const Options options_;
  const std::string tmp_;
  const std::string id_;
  const int64_t created_ns_;
};

}  // namespace

Result<std::unique_ptr<SaveHandle>> StartSave(
    std::shared_ptr<Storage> storage, std::shared_ptr<Coordinator> coordinator,
    SaveRequest request, const Options& options) {
  const std::string path = request.path;
  auto operation = std::make_shared<SaveOperation>(
      std::move(storage), std::move(coordinator), std::move(request), options);
  SK_RETURN_IF_ERROR(internal::CallCatching(
      "the blocking phase of the save of " + path, [&] { return operation->Prepare(); }));
  Future future;
  const CancellationToken token;
  auto cancel = [operation, token]() -> Status {
    token.Cancel();
    return operation->Abandon();
  };
  std::thread thread;
  try {
    thread = std::thread([operation, future, token, path] {
      CancellationScope scope(token);
      future.Set(internal::CallCatching("the background phase of the save of " + path,
                                        [&] { return operation->Run(); }));
    });
  } catch (const std::system_error& e) {
    (void)operation->Abandon();
    return ResourceExhaustedError("save of " + path +
                                  ": cannot start its background thread: " + e.what());
  }
  return std::make_unique<SaveHandle>(future, std::move(thread), std::move(cancel));
}

Status Save(std::shared_ptr<Storage> storage,
            std::shared_ptr<Coordinator> coordinator, SaveRequest request,
            const Options& options) {
  SK_ASSIGN_OR_RETURN(auto handle, StartSave(std::move(storage), std::move(coordinator),
                                             std::move(request), options));
  return *handle->future().Wait(-1);
}

}  // namespace shardkeep
