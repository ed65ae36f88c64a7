// The save pipeline and its commit protocol. A checkpoint appears whole or
// not at all:
//
//  Blocking phase (caller's thread):
//   1. Validate the request against its own meta.json. Publish this
//      process's MetaDigest (checkpointables, kinds, meta.json hashes).
//   2. Primary: refuse a committed checkpoint at <path> unless `force`;
//      remove a stale <path>.shardkeep-tmp left by a crash; create it fresh
//      with <checkpointable>/{data,index}/ folders. Agreement "prepared".
//      Then the primary compares every process's digest with its own and
//      publishes the verdict; a disagreement fails the save everywhere,
//      naming the processes that differ (only the primary's meta.json is
//      written, so it must describe everyone's shards).
//  Background phase (a thread owned by the SaveHandle):
//   3. Every process writes its chunks and its index into the temporary
//      folder and fsyncs them (WriteShards). The primary also writes the
//      values of json/bytes checkpointables.
//   4. Agreement "written".
//   5. Primary: writes every meta.json, then _SHARDKEEP, fsyncs them and
//      their folders; claims the outcome "commit" (see below); moves
//      <path>.shardkeep-tmp to <path> (MakeVisible, make_visible.h: with
//      `force`, an atomic exchange with the committed checkpoint where the
//      storage can, two renames otherwise) and fsyncs the parent. It then
//      publishes the result of the commit.
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
// A process that can neither record its "abort" nor read the key back
// cannot know who won: it fails with CommitStateUnknown, never with
// "nothing was committed".
//
// The rename is the commit point. If the parent-directory fsync after it
// fails, the rename is undone (the checkpoint was never reported durable);
// if undoing fails too, the save fails with CommitStateUnknown.
//
// A failed save removes its <path>.shardkeep-tmp: the primary deletes it
// once every process knows the save failed (after a failed agreement, or
// after publishing a failed commit), so leftovers of failed saves do not
// fill the storage. A straggler still writing after the others timed out
// may leave some files; the next save to <path> removes them. A save that
// runs out of space says how many bytes the process meant to write.
//
// A crash before the rename leaves only the temporary folder, which no
// reader accepts (it has no _SHARDKEEP at <path>) and the next save removes.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <set>
#include <system_error>

#include "engine/catch_exceptions.h"
#include "engine/make_visible.h"
#include "engine/meta_agreement.h"
#include "engine/shard_writer.h"
#include "format/checkpointable_meta.h"
#include "format/commit_record.h"
#include "format/index.h"
#include "shardkeep/cancellation.h"
#include "shardkeep/checkpoint.h"

namespace shardkeep {
namespace {

constexpr char kTmpSuffix[] = ".shardkeep-tmp";

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

// The bytes a process writes for `parts` before compression: its shards,
// and on the primary also the values and every meta.json.
uint64_t BytesToWrite(const std::vector<CheckpointablePayload>& parts,
                      bool primary) {
  uint64_t total = 0;
  for (const CheckpointablePayload& part : parts) {
    for (const ShardData& shard : part.shards) {
      total += shard.box.NumElements() * DTypeSize(shard.dtype);
    }
    if (primary) total += part.value.size() + part.meta_json.size();
  }
  return total;
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
    if (local.ok()) local = PublishMetaDigest();
    if (local.ok() && coordinator_->is_primary()) local = PrepareTemporaryDir();
    Status agreed = Agree("prepared", local);
    if (agreed.ok()) agreed = AgreeOnMeta();
    if (!agreed.ok()) RemoveTemporaryDir();
    return agreed;
  }

  // Steps 3–6.
  Status Run() {
    Status local;
    for (const CheckpointablePayload& part : request_.parts) {
      local = WritePart(part);
      if (!local.ok()) break;
    }
    Status written = Agree("written", ExplainIfOutOfSpace(local));
    if (!written.ok()) {
      RemoveTemporaryDir();
      return written;
    }
    if (!coordinator_->is_primary()) return AwaitCommit();
    Status committed = ExplainIfOutOfSpace(Commit());
    // Best effort: a peer that cannot read this times out on its own.
    (void)coordinator_->KeyValueSet(Key("result"), committed.ok()
                                                       ? std::string("ok")
                                                       : committed.ToString());
    // Whatever the commit left at tmp_ is not committed, unless its state
    // is unknown: then nothing is touched.
    if (!committed.ok() && committed.code() != StatusCode::kCommitStateUnknown) {
      RemoveTemporaryDir();
    }
    return committed;
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
  std::string MetaKey(int process) const {
    return Key("prepared/meta/" + std::to_string(process));
  }

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
    if (!barrier.ok()) {
      // A straggler's own failure may come from the others giving up (the
      // primary removes the temporary folder): the barrier's is the cause.
      Status failed = barrier.WithContext("save of " + request_.path);
      if (local.ok()) return failed;
      return Status(failed.code(), failed.message() +
                                       "; this process failed too: " + local.ToString());
    }
    if (!local.ok()) return local;
    SK_ASSIGN_OR_RETURN(std::optional<std::string> failure,
                        coordinator_->KeyValueTryGet(failed_key));
    if (failure) {
      return CancelledError("save of " + request_.path + " abandoned in phase '" +
                            phase + "' because " + *failure);
    }
    return Status::Ok();
  }

  // Step 1's publication; every process's is set before it arrives at
  // "prepared", so the primary finds them all after that agreement.
  Status PublishMetaDigest() {
    if (coordinator_->process_count() == 1) return Status::Ok();
    return coordinator_
        ->KeyValueSet(MetaKey(coordinator_->process_index()),
                      internal::MetaDigest(request_.parts))
        .WithContext("publishing what this process saves");
  }

  // The end of step 2: the primary's verdict on the digests, the same
  // status on every process.
  Status AgreeOnMeta() {
    if (coordinator_->process_count() == 1) return Status::Ok();
    const std::string verdict_key = Key("prepared/verdict");
    std::string verdict;
    if (coordinator_->is_primary()) {
      Result<std::string> judged = JudgeMetaDigests();
      verdict = judged.ok() ? *judged
                            : "the primary could not compare them: " +
                                  judged.status().ToString();
      Status published = coordinator_->KeyValueSet(verdict_key, verdict);
      SK_RETURN_IF_ERROR(judged.status());
      SK_RETURN_IF_ERROR(published.WithContext("save of " + request_.path +
                                               ": publishing the meta.json verdict"));
    } else {
      Result<std::string> published =
          coordinator_->KeyValueGet(verdict_key, options_.timeout_s);
      SK_RETURN_IF_ERROR(published.status().WithContext(
          "save of " + request_.path + ": waiting for the primary's meta.json verdict"));
      verdict = std::move(*published);
    }
    if (verdict.empty()) return Status::Ok();
    return InvalidArgumentError("save of " + request_.path +
                                ": the processes disagree on what to save: " + verdict);
  }

  // "" when every process publishes the primary's digest; otherwise which
  // processes differ and how.
  Result<std::string> JudgeMetaDigests() {
    std::vector<std::string> digests(coordinator_->process_count());
    for (int p = 0; p < coordinator_->process_count(); ++p) {
      SK_ASSIGN_OR_RETURN(std::optional<std::string> digest,
                          coordinator_->KeyValueTryGet(MetaKey(p)));
      if (!digest) {
        return InternalError("save of " + request_.path + ": process " +
                             std::to_string(p) +
                             " arrived at 'prepared' without publishing its "
                             "meta.json digest");
      }
      digests[p] = std::move(*digest);
    }
    return internal::DescribeDisagreement(digests);
  }

  // Step 6 on a non-primary process.
  Status AwaitCommit() {
    Result<std::string> result =
        coordinator_->KeyValueGet(Key("result"), options_.timeout_s);
    if (!result.ok()) {
      const std::string silence =
          result.status().code() == StatusCode::kTimeout
              ? "the primary (process 0) did not report the commit within " +
                    FormatSeconds(options_.timeout_s)
              : "waiting for the primary's commit failed (" +
                    result.status().ToString() + ")";
      SK_ASSIGN_OR_RETURN(std::string outcome, SettleOutcome(silence));
      if (outcome != "commit") {
        return TimeoutError("save of " + request_.path + ": " + silence +
                            "; nothing was committed");
      }
      // The primary claimed the commit first: its result decides.
      result = coordinator_->KeyValueGet(Key("result"), options_.timeout_s);
      if (!result.ok()) {
        return CommitStateUnknownError(
            "save of " + request_.path + ": the primary (process 0) claimed the " +
            "commit but its result did not arrive (" + result.status().ToString() +
            "); the checkpoint may or may not exist at " + request_.path);
      }
    }
    if (*result == "ok") return Status::Ok();
    // The primary's status, as text: "<code name>: <message>".
    if (result->starts_with(StatusCodeName(StatusCode::kCommitStateUnknown))) {
      return CommitStateUnknownError("save of " + request_.path +
                                     ": the primary (process 0) reported " + *result);
    }
    return CancelledError("save of " + request_.path +
                          " was not committed because the primary failed: " + *result);
  }

  // After the primary's `silence`: claims "abort" for the outcome, and
  // returns the outcome that holds ("abort", or "commit" when the primary
  // claimed it first). CommitStateUnknown when neither the claim nor the
  // key can be established: the primary may still commit.
  Result<std::string> SettleOutcome(const std::string& silence) {
    const std::string outcome_key = Key("outcome");
    const Status claim = coordinator_->KeyValueSet(outcome_key, "abort");
    if (claim.ok()) return std::string("abort");
    // AlreadyExists: another process decided first. Any other error: this
    // claim may or may not have been stored. Either way the key says.
    Result<std::optional<std::string>> decided =
        coordinator_->KeyValueTryGet(outcome_key);
    if (decided.ok() && decided->has_value()) return **decided;
    return CommitStateUnknownError(
        "save of " + request_.path + ": " + silence +
        ", and this process could not record that it gave up (" + claim.ToString() +
        (decided.ok() ? ""
                      : "; reading the outcome back: " + decided.status().ToString()) +
        "); the checkpoint may or may not be committed at " + request_.path +
        ": check it before relying on it");
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
    SK_RETURN_IF_ERROR(internal::DiscardFolder(*storage_, tmp_));
    for (const CheckpointablePayload& part : request_.parts) {
      SK_RETURN_IF_ERROR(storage_->CreateDir(tmp_ + "/" + part.name + "/data"));
      SK_RETURN_IF_ERROR(storage_->CreateDir(tmp_ + "/" + part.name + "/index"));
    }
    return Status::Ok();
  }

  // Once every process knows the save failed, its files are garbage. Best
  // effort: the next save to this path removes what is left.
  void RemoveTemporaryDir() {
    if (coordinator_->is_primary()) (void)internal::DiscardFolder(*storage_, tmp_);
  }

  // A full disk is named as such, with what this process meant to write.
  Status ExplainIfOutOfSpace(const Status& status) const {
    if (status.code() != StatusCode::kOutOfSpace) return status;
    return status.WithContext(
        "save of " + request_.path + " ran out of space: process " +
        std::to_string(coordinator_->process_index()) + " had " +
        std::to_string(BytesToWrite(request_.parts, coordinator_->is_primary())) +
        " bytes to write (before compression) into " + tmp_);
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
    // Any other failure: the claim may have been stored, so the others may
    // wait for the result, which says "not committed".
    SK_RETURN_IF_ERROR(claim);
    return internal::MakeVisible(*storage_, tmp_, request_.path)
        .WithContext("save of " + request_.path);
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
