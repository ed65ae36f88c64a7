// The save pipeline and its commit protocol. A checkpoint appears whole or
// not at all. The steps below are those of storage that renames atomically
// (POSIX); storage that cannot (object stores) commits by creating
// _SHARDKEEP conditionally instead, see "Without rename" further down. The
// storage's features choose.
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
//      folder (WriteShards; a part's feed is written as its shards arrive,
//      each checked against meta.json then, see ShardFeed); the primary
//      also writes the values of json/bytes checkpointables. Every process but the primary fsyncs
//      its files here; the primary's are fsynced in step 5.
//   4. Agreement "written".
//   5. Primary: writes every meta.json, then _SHARDKEEP; fsyncs them, its
//      files of step 3 and every folder of the temporary folder (itself
//      included), all at once (engine/sync_batch.h: nothing there needs an
//      order, only to be durable before the rename); claims the outcome
//      "commit" (see below); moves
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
//
// Without rename (StorageFeatures::conditional_create, no atomic_rename):
//  - The folder each process writes into is a generation,
//    <path>/.shardkeep-g<16 hex digits>, drawn at random by the primary in
//    step 2 and published in the key-value store before "prepared"; the
//    others read it after that agreement. Step 2 refuses a committed
//    checkpoint without `force`, and a folder holding anything but
//    generations without `force`; it deletes nothing (another job may be
//    writing its own generation there).
//  - Step 5: the primary writes every meta.json into the generation,
//    claims the outcome "commit", then (with `force`) reads and deletes the
//    committed _SHARDKEEP, and creates <path>/_SHARDKEEP naming the
//    generation ("data_folder") with WriteIfAbsent: that creation is the
//    commit point. AlreadyExists: another save committed first; the save
//    fails with AlreadyExists everywhere. Another failure: the record is
//    read back (ours: committed; absent: not committed, and a record that
//    `force` deleted is put back; unreadable: CommitStateUnknown).
//  - After the commit the primary deletes every other generation at <path>
//    (with `force`, every other entry): they can no longer commit. A
//    failed save deletes its own generation where the rename protocol
//    deletes its temporary folder. Between deleting the old record and
//    creating the new one, a forced save leaves no checkpoint at <path>
//    (docs/DESIGN_NOTES.md, "Commit on object stores").
#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>
#include <system_error>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/seconds_text.h"
#include "engine/catch_exceptions.h"
#include "engine/decoded_meta_cache.h"
#include "engine/make_visible.h"
#include "engine/reuse.h"
#include "engine/meta_agreement.h"
#include "engine/shard_writer.h"
#include "engine/sync_batch.h"
#include "format/checkpointable_meta.h"
#include "format/commit_record.h"
#include "format/index.h"
#include "shardkeep/cancellation.h"
#include "shardkeep/checkpoint.h"
#include "shardkeep/checkpoint_root.h"
#include "shardkeep/shard_feed.h"

namespace shardkeep {
namespace {

constexpr char kForceHint[] =
    "save with force to replace it (force=True in Python; SaveRequest::force or "
    "CheckpointWriter::SetForce in C++)";

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The prefix of this save's keys. A single process numbers its own saves;
// several processes must be given one id (SaveRequest::operation_id).
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
  if (shard.data == nullptr && !shard.fill && !shard.stored_in &&
      shard.box.NumElements() > 0) {
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
    SK_RETURN_IF_ERROR(format::CheckCheckpointableName(part.name));
    if (!names.insert(part.name).second) {
      return InvalidArgumentError("checkpointable '" + part.name + "' given twice");
    }
    SK_ASSIGN_OR_RETURN(std::shared_ptr<const format::CheckpointableMeta> meta,
                        internal::DecodeMetaCached(part.meta_json,
                                                   part.name + "/meta.json"));
    if (meta->kind != part.kind) {
      return InvalidArgumentError("checkpointable '" + part.name + "' is of kind '" +
                                  part.kind + "' but its meta.json says '" +
                                  meta->kind + "'");
    }
    if (part.feed && (part.kind != "pytree" || !part.shards.empty())) {
      return InvalidArgumentError("checkpointable '" + part.name +
                                  "' has a shard feed but is not a pytree or has shards too");
    }
    for (const ShardData& shard : part.shards) {
      SK_RETURN_IF_ERROR(ValidateShard(part, *meta, shard));
    }
  }
  return Status::Ok();
}

// ValidateShard for a shard that arrives through the part's feed, which
// plans no links from a base (ShardFeed).
Status ValidateFedShard(const CheckpointablePayload& part,
                        const format::CheckpointableMeta& meta, const ShardData& shard) {
  if (shard.stored_in || shard.compare_with) {
    return InvalidArgumentError("a shard of leaf #" + std::to_string(shard.leaf) + " of '" +
                                part.name + "' names an earlier checkpoint, which a shard "
                                "feed cannot take: give such shards in the request");
  }
  return ValidateShard(part, meta, shard);
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
    if (part.feed) total += part.feed->bytes_added();
    if (primary) total += part.value.size() + part.meta_json.size();
  }
  return total;
}

// Decodes `text` into `out`; InvalidArgument naming `what` unless it is a
// JSON object.
Status ParseJsonObject(const std::string& text, const char* what, nlohmann::json& out) {
  nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return InvalidArgumentError(std::string(what) + " must be a JSON object");
  }
  out = std::move(parsed);
  return Status::Ok();
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
        target_(*storage_, request_.path, "save of " + request_.path),
        id_(OperationId(request_)),
        created_ns_(NowNs()) {}

  // Steps 1–2.
  Status Prepare() {
    // Without an id the processes' keys differ: no agreement could carry
    // this failure, so every process fails here on its own.
    if (request_.operation_id.empty() && coordinator_->process_count() > 1) {
      return InvalidArgumentError(
          "save of " + request_.path + ": a save by " +
          std::to_string(coordinator_->process_count()) +
          " processes needs SaveRequest::operation_id (CheckpointWriter::SetOperationId), "
          "the same on every process and new for every save, to name its barriers");
    }
    Status local = ValidateRequest(request_);
    if (local.ok()) local = ParseJsonObject(request_.custom_metadata_json, "custom_metadata",
                                            custom_metadata_);
    if (local.ok()) local = ParseJsonObject(request_.metrics_json, "metrics", metrics_);
    if (local.ok()) local = target_.CheckUsable();
    if (local.ok()) local = PublishMetaDigest();
    if (local.ok() && coordinator_->is_primary()) local = PrepareFolder();
    Status agreed = Agree("prepared", local);
    if (agreed.ok()) agreed = AgreeOnMeta();
    if (agreed.ok()) agreed = LearnFromPrimary();
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
    // The primary of a rename commit syncs its files with the commit's
    // (CommitByRename); everyone else's must be durable before "written".
    if (local.ok() && !PrimaryDefersSyncs()) local = unsynced_.SyncAll(*storage_);
    Status written = Agree("written", ExplainIfOutOfSpace(ExplainIfLeaseLost(local)));
    if (!written.ok()) {
      unsynced_.Discard();
      written = ExplainIfOvertaken(std::move(written));
      RemoveTemporaryDir();
      return written;
    }
    if (!coordinator_->is_primary()) return AwaitCommit();
    Status committed = ExplainIfOutOfSpace(ExplainIfLeaseLost(Commit()));
    unsynced_.Discard();  // what a failed commit left unsynced
    // Best effort: a peer that cannot read this times out on its own.
    (void)coordinator_->KeyValueSet(Key("result"), committed.ok()
                                                       ? std::string("ok")
                                                       : committed.ToString());
    // Whatever the commit left in its folder is not committed, unless its state
    // is unknown: then nothing is touched.
    if (!committed.ok() && committed.code() != StatusCode::kCommitStateUnknown) {
      RemoveTemporaryDir();
    }
    return committed;
  }

  // The save has ended with `outcome`: its feeds take no more shards
  // (ShardFeed::End), so that their producers stop staging.
  void EndFeeds(const Status& outcome) {
    for (const CheckpointablePayload& part : request_.parts) {
      if (part.feed) part.feed->End(outcome);
    }
  }

  // The commit record's created_ns (the primary's), once Prepare() succeeded.
  int64_t created_ns() const { return created_ns_; }

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
  std::string RecordFile() const {
    return request_.path + "/" + format::kCommitFileName;
  }

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
                    SecondsText(options_.timeout_s)
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
    // Another job committed the path first (object stores): the same
    // answer everywhere, so every process of this job knows why.
    if (result->starts_with(std::string(StatusCodeName(StatusCode::kAlreadyExists)) +
                            ":")) {
      return AlreadyExistsError("save of " + request_.path +
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

  // The primary's part of step 2: the commit target's checks and
  // preparation (make_visible.h), then, renaming, the folders of the
  // temporary checkpoint; with generations, the generation's name goes to
  // the other processes (keys need no folders: the writers' files create
  // them).
  Status PrepareFolder() {
    SK_RETURN_IF_ERROR(target_.Prepare(request_.force, kForceHint));
    if (coordinator_->process_count() > 1) {
      SK_RETURN_IF_ERROR(
          coordinator_->KeyValueSet(Key("created_ns"), std::to_string(created_ns_))
              .WithContext("save of " + request_.path + ": publishing its creation time"));
    }
    if (!target_.renames()) {
      if (coordinator_->process_count() == 1) return Status::Ok();
      return coordinator_->KeyValueSet(Key("generation"), *target_.data_folder())
          .WithContext("save of " + request_.path + ": publishing its folder");
    }
    for (const CheckpointablePayload& part : request_.parts) {
      SK_RETURN_IF_ERROR(storage_->CreateDir(target_.folder() + "/" + part.name + "/data"));
      SK_RETURN_IF_ERROR(storage_->CreateDir(target_.folder() + "/" + part.name + "/index"));
    }
    return Status::Ok();
  }

  // After "prepared", on the others: what the primary chose in step 2.
  // Its created_ns names the checkpoint in the commit record, so that every
  // process can tell later whether <path> still holds this save's
  // checkpoint (SaveHandle::created_ns); and the generation's name.
  Status LearnFromPrimary() {
    if (coordinator_->is_primary()) return Status::Ok();
    Result<std::string> created =
        coordinator_->KeyValueGet(Key("created_ns"), options_.timeout_s);
    SK_RETURN_IF_ERROR(created.status().WithContext(
        "save of " + request_.path + ": waiting for the primary's creation time"));
    try {
      created_ns_ = std::stoll(*created);
    } catch (const std::exception&) {
      return InternalError("save of " + request_.path + ": the primary published '" +
                           *created + "' as its creation time");
    }
    if (target_.renames()) return Status::Ok();
    Result<std::string> published =
        coordinator_->KeyValueGet(Key("generation"), options_.timeout_s);
    SK_RETURN_IF_ERROR(published.status().WithContext(
        "save of " + request_.path + ": waiting for the primary's folder name"));
    return target_.Adopt(*published);
  }

  // Once every process knows the save failed, its files are garbage. Best
  // effort: the next save to this path (rename) or the next commit there
  // (generations) removes what is left.
  void RemoveTemporaryDir() {
    if (coordinator_->is_primary()) target_.Discard();
  }

  // A write that failed because another process removed the folder (it
  // judged the save dead; files then go missing) is reported as the lost
  // lease it is. Other failures ask the storage nothing more.
  Status ExplainIfLeaseLost(const Status& status) {
    if (status.code() != StatusCode::kNotFound) return status;
    const Status lease = target_.CheckLease();
    if (lease.ok()) return status;
    return Status(StatusCode::kLeaseLost, lease.message() + " (writing failed: " +
                                              status.ToString() + ")");
  }

  // A full disk is named as such, with what this process meant to write.
  Status ExplainIfOutOfSpace(const Status& status) const {
    if (status.code() != StatusCode::kOutOfSpace) return status;
    return status.WithContext(
        "save of " + request_.path + " ran out of space: process " +
        std::to_string(coordinator_->process_index()) + " had " +
        std::to_string(BytesToWrite(request_.parts, coordinator_->is_primary())) +
        " bytes to write (before compression) into " + target_.folder());
  }

  // Whether this process leaves the syncs of the files it wrote to the
  // commit, which syncs them together with its own files and folders.
  bool PrimaryDefersSyncs() const {
    return coordinator_->is_primary() && target_.renames();
  }

  // Writes this process's files of `part`; those not durable yet go to
  // unsynced_.
  Status WritePart(const CheckpointablePayload& part) {
    const std::string dir = target_.folder() + "/" + part.name;
    if (part.kind == "pytree") {
      const int process = coordinator_->process_index();
      internal::ByteLimiter limiter(options_.ResolvedHostMemoryLimit());
      if (part.feed) {
        SK_ASSIGN_OR_RETURN(
            std::shared_ptr<const format::CheckpointableMeta> meta,
            internal::DecodeMetaCached(part.meta_json, part.name + "/meta.json"));
        const internal::ShardCheck check = [&](const ShardData& shard) {
          return ValidateFedShard(part, *meta, shard);
        };
        return internal::WriteShards(*storage_, dir, process, *part.feed, check, options_,
                                     limiter, unsynced_)
            .status();
      }
      const bool reuses =
          std::any_of(part.shards.begin(), part.shards.end(), [](const ShardData& s) {
            return s.stored_in.has_value() || s.compare_with.has_value();
          });
      if (!reuses) {
        return internal::WriteShards(*storage_, dir, process, part.shards, options_, limiter,
                                     unsynced_)
            .status();
      }
      SK_ASSIGN_OR_RETURN(internal::ReusedShards reused,
                          internal::ReuseStoredShards(storage_, dir, process, part.shards,
                                                      options_));
      return internal::WriteShards(*storage_, dir, process, reused.to_write, options_, limiter,
                                   unsynced_, std::move(reused.linked))
          .status();
    }
    if (!coordinator_->is_primary()) return Status::Ok();
    const std::string file = dir + "/" + ValueFileName(part.kind);
    if (!PrimaryDefersSyncs()) return storage_->WriteAll(file, part.value, true);
    return WriteUnsynced(file, part.value);
  }

  // Creates `path` with `bytes`; unsynced_ syncs it later.
  Status WriteUnsynced(const std::string& path, std::string_view bytes) {
    SK_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                        storage_->OpenForAppend(path));
    SK_RETURN_IF_ERROR(file->Append(bytes.data(), bytes.size()));
    unsynced_.AddFile(std::move(file), path);
    return Status::Ok();
  }

  Status Commit() {
    return target_.renames() ? CommitByRename() : CommitGeneration();
  }

  format::CommitRecord NewRecord() const {
    format::CommitRecord record;
    record.step = request_.step;
    record.created_ns = created_ns_;
    record.process_count = coordinator_->process_count();
    record.custom_metadata = custom_metadata_;
    record.metrics = metrics_;
    for (const CheckpointablePayload& part : request_.parts) {
      record.checkpointables.push_back(
          format::ListCheckpointable(part.name, part.kind, part.meta_json, part.value));
      if (part.kind == "pytree") {
        std::vector<std::string>& files = record.index_files[part.name];
        for (int p = 0; p < record.process_count; ++p) {
          files.push_back(format::IndexFileName(p));
        }
      }
    }
    return record;
  }

  // The primary writes each checkpointable's meta.json into its folder, synced
  // (storage without rename: each object is durable once written).
  Status WriteMetas() {
    for (const CheckpointablePayload& part : request_.parts) {
      SK_RETURN_IF_ERROR(storage_->WriteAll(
          target_.folder() + "/" + part.name + "/" + format::kMetaFileName, part.meta_json,
          true));
    }
    return Status::Ok();
  }

  // Claims the outcome "commit" (see the outcome key above).
  Status ClaimCommit() {
    Status claim = coordinator_->KeyValueSet(Key("outcome"), "commit");
    if (claim.code() == StatusCode::kAlreadyExists) {
      return CancelledError("save of " + request_.path +
                            " not committed: other processes stopped waiting for the "
                            "commit (Options::timeout_s)");
    }
    // Any other failure: the claim may have been stored, so the others may
    // wait for the result, which says "not committed".
    return claim;
  }

  // Every file of the temporary folder and every entry of its folders must
  // be durable before the rename, in no particular order among themselves
  // (the folder is nobody's checkpoint until then). So the primary creates
  // meta.json and _SHARDKEEP first, then syncs them, its own data files and
  // index and values (deferred from WritePart) and every folder in one
  // batch; the other processes synced theirs before "written", after
  // which every entry exists.
  Status CommitByRename() {
    const std::string& tmp = target_.folder();
    format::CommitRecord record = NewRecord();
    for (const CheckpointablePayload& part : request_.parts) {
      SK_RETURN_IF_ERROR(WriteUnsynced(tmp + "/" + part.name + "/" + format::kMetaFileName,
                                       part.meta_json));
    }
    record.committed_ns = NowNs();
    SK_RETURN_IF_ERROR(WriteUnsynced(tmp + "/" + format::kCommitFileName,
                                     format::EncodeCommitRecord(record)));
    for (const CheckpointablePayload& part : request_.parts) {
      const std::string dir = tmp + "/" + part.name;
      for (const char* sub : {"/data", "/index", ""}) unsynced_.AddDir(dir + sub);
    }
    unsynced_.AddDir(tmp);
    SK_RETURN_IF_ERROR(unsynced_.SyncAll(*storage_));
    SK_RETURN_IF_ERROR(ClaimCommit());
    return target_.Commit("", request_.force, CommittedFiles(record));
  }

  // The files the commit point makes a checkpoint of, relative to the
  // folder: what the commit checks are still there (a collector that took
  // the save for a leftover would have removed them). Data files are not
  // listed: each index is written after its data, and a collector removes
  // a whole folder (renaming storage) or starts with its lease.
  std::vector<std::string> CommittedFiles(const format::CommitRecord& record) const {
    std::vector<std::string> files;
    if (target_.renames()) files.push_back(format::kCommitFileName);
    for (const CheckpointablePayload& part : request_.parts) {
      files.push_back(part.name + "/" + format::kMetaFileName);
      if (part.kind != "pytree") files.push_back(part.name + "/" + ValueFileName(part.kind));
      auto index = record.index_files.find(part.name);
      if (index == record.index_files.end()) continue;
      for (const std::string& file : index->second) files.push_back(part.name + "/" + file);
    }
    return files;
  }

  // Step 5 on storage without rename: the conditional creation of
  // <path>/_SHARDKEEP naming this save's generation is the commit point.
  Status CommitGeneration() {
    format::CommitRecord record = NewRecord();
    record.data_folder = target_.data_folder();
    // No folder syncs: on a store that creates objects conditionally, each
    // object is durable once its write returns, and folders are only key
    // prefixes.
    SK_RETURN_IF_ERROR(WriteMetas());
    record.committed_ns = NowNs();
    const std::string bytes = format::EncodeCommitRecord(record);
    SK_RETURN_IF_ERROR(ClaimCommit());
    return target_.Commit(bytes, request_.force, CommittedFiles(record));
  }

  // On storage without rename, a save still writing when another save to
  // the same path commits loses its files to the winner's cleanup, and its
  // writes fail; the cause worth reporting is the lost race. Without
  // `force` the path held no record at "prepared", so a record there now
  // was committed by another save meanwhile. (With `force` the record may
  // be the one being replaced, so the failure stays as it is.)
  Status ExplainIfOvertaken(Status failed) const {
    if (target_.renames() || request_.force) return failed;
    Result<bool> committed = storage_->Exists(RecordFile());
    if (!committed.ok() || !*committed) return failed;
    return AlreadyExistsError("save of " + request_.path + ": another save committed " +
                              request_.path + " first, while this one was writing (" +
                              failed.ToString() + ")");
  }

  std::shared_ptr<Storage> storage_;
  std::shared_ptr<Coordinator> coordinator_;
  SaveRequest request_;
  const Options options_;
  // How and where this save commits; this process writes into its folder.
  internal::CommitTarget target_;
  // Files this process wrote that are not durable yet (see WritePart).
  internal::SyncBatch unsynced_;
  const std::string id_;
  int64_t created_ns_;  // the primary's, once Prepare() has succeeded
  // The request's JSON texts, decoded by Prepare().
  nlohmann::json custom_metadata_ = nlohmann::json::object();
  nlohmann::json metrics_ = nlohmann::json::object();
};

}  // namespace

struct SaveHandle::State {
  Future future;
  std::thread thread;
  std::function<Status()> cancel;
  int64_t created_ns = 0;
};

SaveHandle::SaveHandle(std::unique_ptr<State> state) : state_(std::move(state)) {}

SaveHandle::~SaveHandle() {
  if (state_->thread.joinable()) state_->thread.join();
}

const Future& SaveHandle::future() const { return state_->future; }

Status SaveHandle::Cancel() { return state_->cancel(); }

int64_t SaveHandle::created_ns() const { return state_->created_ns; }

Result<std::unique_ptr<SaveHandle>> StartSave(
    std::shared_ptr<Storage> storage, std::shared_ptr<Coordinator> coordinator,
    SaveRequest request, const Options& options) {
  const std::string path = request.path;
  if (storage == nullptr) {
    return InvalidArgumentError("the save of " + path + " was given no storage");
  }
  if (coordinator == nullptr) coordinator = NewSingleProcessCoordinator();
  auto operation = std::make_shared<SaveOperation>(
      std::move(storage), std::move(coordinator), std::move(request), options);
  const Status prepared = internal::CallCatching(
      "the blocking phase of the save of " + path, [&] { return operation->Prepare(); });
  if (!prepared.ok()) {
    operation->EndFeeds(prepared);
    return prepared;
  }
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
      const Status outcome = internal::CallCatching(
          "the background phase of the save of " + path, [&] { return operation->Run(); });
      operation->EndFeeds(outcome);
      future.Set(outcome);
    });
  } catch (const std::system_error& e) {
    (void)operation->Abandon();
    const Status failed = ResourceExhaustedError(
        "save of " + path + ": cannot start its background thread: " + e.what());
    operation->EndFeeds(failed);
    return failed;
  }
  return std::make_unique<SaveHandle>(std::make_unique<SaveHandle::State>(
      SaveHandle::State{future, std::move(thread), std::move(cancel),
                        operation->created_ns()}));
}

Status Save(std::shared_ptr<Storage> storage,
            std::shared_ptr<Coordinator> coordinator, SaveRequest request,
            const Options& options) {
  SK_ASSIGN_OR_RETURN(auto handle, StartSave(std::move(storage), std::move(coordinator),
                                             std::move(request), options));
  return *handle->future().Wait(-1);
}

}  // namespace shardkeep
