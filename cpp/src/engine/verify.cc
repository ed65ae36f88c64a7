// Verification of a whole checkpoint. The checks are the reader's
// (engine/chunk_checks.h), applied to every file and chunk, with each
// failure recorded as a problem instead of ending the run. Only a failure
// to read that is not a missing or short file (a network or permission
// error) ends it: the verdict would be unknown.
#include "shardkeep/verify.h"

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>

#include <nlohmann/json.hpp>

#include "engine/byte_limiter.h"
#include "engine/checked_read.h"
#include "engine/chunk_checks.h"
#include "engine/parallel.h"
#include "format/checkpointable_meta.h"
#include "format/commit_record.h"
#include "format/index.h"
#include "shardkeep/options.h"

namespace shardkeep {
namespace {

constexpr uint64_t kIndexHeaderBytes = 16;

// A fault found by a check: a problem to report, not a reason to stop.
bool IsDamage(const Status& status) {
  return status.code() == StatusCode::kNotFound || status.code() == StatusCode::kCorruption;
}

// Where an index record starts in its file: records follow the header back
// to back, 48 + 16·rank bytes each (docs/FORMAT.md §2).
std::vector<uint64_t> RecordOffsets(const std::vector<format::ChunkRecord>& records) {
  std::vector<uint64_t> offsets;
  offsets.reserve(records.size());
  uint64_t offset = kIndexHeaderBytes;
  for (const format::ChunkRecord& record : records) {
    offsets.push_back(offset);
    offset += 48 + 16 * record.box.rank();
  }
  return offsets;
}

// One chunk whose stored bytes are to be read and checked.
struct ChunkJob {
  std::string checkpointable;
  std::string leaf;  // key path, or "#<n>" when meta.json is unreadable
  std::string file;  // its data file
  format::ChunkRecord record;
};

class Verifier {
 public:
  Verifier(std::shared_ptr<Storage> storage, std::string path, const VerifyOptions& options)
      : storage_(std::move(storage)), path_(std::move(path)), options_(options) {}

  Result<VerifyReport> Run() {
    const std::string record_file = path_ + "/" + format::kCommitFileName;
    std::optional<format::CommitRecord> commit;
    Result<internal::CheckedBytes> read =
        internal::ReadAllChecked(*storage_, record_file, [&](const std::string& bytes) {
          Result<format::CommitRecord> decoded = format::DecodeCommitRecord(bytes, record_file);
          if (decoded.ok()) commit = std::move(*decoded);
          return decoded.status();
        });
    if (read.status().code() == StatusCode::kNotFound) {
      return NotFoundError("no committed checkpoint at " + path_ + ": " + record_file +
                           " does not exist");
    }
    SK_RETURN_IF_ERROR(read.status());
    // A newer format is not damage: this build cannot judge it.
    if (read->check.code() == StatusCode::kIncompatible) return read->check;
    if (!read->check.ok()) {
      Add({record_file, "", "", std::nullopt, read->check.ToString()});
      return Finish();
    }
    const std::string root =
        commit->data_folder ? path_ + "/" + *commit->data_folder : path_;
    for (const format::CheckpointableEntry& entry : commit->checkpointables) {
      auto listed = commit->index_files.find(entry.name);
      SK_RETURN_IF_ERROR(CheckCheckpointable(
          entry, root + "/" + entry.name,
          listed != commit->index_files.end() ? listed->second : std::vector<std::string>()));
    }
    SK_RETURN_IF_ERROR(CheckChunks());
    return Finish();
  }

 private:
  void Add(VerifyProblem problem) {
    std::lock_guard<std::mutex> lock(mu_);
    report_.problems.push_back(std::move(problem));
  }

  // Records `status` as a problem when it is damage; returns it otherwise.
  Status AddIfDamage(const Status& status, const std::string& file,
                     const std::string& checkpointable, const std::string& leaf = "",
                     std::optional<uint64_t> offset = std::nullopt) {
    if (status.ok()) return Status::Ok();
    if (!IsDamage(status)) return status;
    Add({file, checkpointable, leaf, offset, status.ToString()});
    return Status::Ok();
  }

  // A decoder or check refused bytes that were read: damage, whatever
  // the status code.
  void AddDecodeFailure(const Status& status, const std::string& file,
                        const std::string& checkpointable, const std::string& leaf = "",
                        std::optional<uint64_t> offset = std::nullopt) {
    Add({file, checkpointable, leaf, offset, status.ToString()});
  }

  // Reads `file` and has `check` (a checksum test, a decoder) judge its
  // bytes, read twice on remote storage when they look corrupt
  // (ReadAllChecked); nullopt, with the problem recorded, when the file is
  // missing or `check` refuses it.
  Result<std::optional<std::string>> ReadListed(
      const std::string& file, const std::string& checkpointable,
      const std::function<Status(const std::string&)>& check) {
    Result<internal::CheckedBytes> read = internal::ReadAllChecked(*storage_, file, check);
    if (read.status().code() == StatusCode::kNotFound) {
      Add({file, checkpointable, "", std::nullopt,
           "Corruption: checkpoint " + path_ + " is incomplete: " + file +
               " is missing"});
      return std::optional<std::string>();
    }
    SK_RETURN_IF_ERROR(read.status());
    if (!read->check.ok()) {
      AddDecodeFailure(read->check, file, checkpointable);
      return std::optional<std::string>();
    }
    return std::optional<std::string>(std::move(read->bytes));
  }

  Status CheckCheckpointable(const format::CheckpointableEntry& entry,
                             const std::string& folder,
                             const std::vector<std::string>& index_files) {
    const std::string meta_file = folder + "/" + format::kMetaFileName;
    std::optional<format::CheckpointableMeta> meta;
    SK_RETURN_IF_ERROR(ReadListed(meta_file, entry.name, [&](const std::string& bytes) {
                         SK_RETURN_IF_ERROR(
                             format::CheckListedChecksum(bytes, entry.meta_checksum, meta_file));
                         Result<format::CheckpointableMeta> decoded =
                             format::DecodeCheckpointableMeta(bytes, meta_file);
                         if (decoded.ok()) meta = std::move(*decoded);
                         return decoded.status();
                       }).status());
    if (meta && meta->kind != entry.kind) {
      Add({meta_file, entry.name, "", std::nullopt,
           "Corruption: " + meta_file + " says kind '" + meta->kind + "' but " + path_ +
               "/_SHARDKEEP lists '" + entry.name + "' as '" + entry.kind + "'"});
      meta.reset();
    }
    if (entry.kind == "json" || entry.kind == "bytes") return CheckValue(entry, folder);
    if (entry.kind != "pytree") return Status::Ok();
    return CheckIndexes(entry.name, folder, index_files, meta ? &*meta : nullptr);
  }

  Status CheckValue(const format::CheckpointableEntry& entry, const std::string& folder) {
    const bool json = entry.kind == "json";
    const std::string file = folder + (json ? "/value.json" : "/value.bin");
    if (!json && !entry.value_checksum) {
      // Version 1: nothing to check a blob against but its presence.
      Result<uint64_t> size = storage_->FileSize(file);
      if (size.status().code() != StatusCode::kNotFound) return size.status();
    }
    return ReadListed(file, entry.name, [&](const std::string& bytes) {
             SK_RETURN_IF_ERROR(format::CheckListedChecksum(bytes, entry.value_checksum, file));
             if (json && !nlohmann::json::accept(bytes)) {
               return CorruptionError(file + " is not a JSON document");
             }
             return Status::Ok();
           }).status();
  }

  // Decodes every index of a pytree checkpointable and checks each record
  // against meta.json (when it decoded), then the tiling of every leaf.
  // Every record that addresses a data file safely becomes a chunk job.
  Status CheckIndexes(const std::string& name, const std::string& folder,
                      const std::vector<std::string>& index_files,
                      const format::CheckpointableMeta* meta) {
    std::vector<std::vector<internal::StoredChunk>> by_leaf(meta ? meta->leaves.size() : 0);
    bool every_index_read = true;
    for (const std::string& index : index_files) {
      const std::string file = folder + "/" + index;
      std::optional<std::vector<format::ChunkRecord>> records;
      SK_RETURN_IF_ERROR(ReadListed(file, name, [&](const std::string& read) {
                           Result<std::vector<format::ChunkRecord>> decoded =
                               format::DecodeIndex(read, file);
                           if (decoded.ok()) records = std::move(*decoded);
                           return decoded.status();
                         }).status());
      if (!records) {
        every_index_read = false;
        continue;
      }
      const int process = internal::ProcessOfIndexFile(index);
      const std::vector<uint64_t> offsets = RecordOffsets(*records);
      for (size_t i = 0; i < records->size(); ++i) {
        format::ChunkRecord& record = (*records)[i];
        std::string leaf = "#";  // (not "#" + ...: GCC 12 warns falsely)
        leaf += std::to_string(record.leaf);
        if (meta && record.leaf < meta->leaves.size()) leaf = meta->leaves[record.leaf].path;
        if (meta) {
          const Status agrees = internal::CheckChunkRecord(*meta, record, file);
          if (!agrees.ok()) {
            AddDecodeFailure(agrees, file, name, leaf, offsets[i]);
            continue;
          }
        }
        jobs_.push_back({name, leaf, folder + "/" + format::DataFileName(process, record.data_file),
                         record});
        if (meta) by_leaf[record.leaf].push_back({std::move(record), process});
      }
    }
    if (!meta || !every_index_read) return Status::Ok();
    const std::string tiling_file =
        index_files.size() == 1 ? folder + "/" + index_files[0] : folder + "/index";
    for (size_t leaf = 0; leaf < meta->leaves.size(); ++leaf) {
      const format::LeafMeta& spec = meta->leaves[leaf];
      const Status tiled = internal::CheckLeafTiling(
          spec, by_leaf[leaf], "checkpoint " + path_ + ": leaf '" + spec.path + "' of " + name,
          folder, index_files);
      if (!tiled.ok()) AddDecodeFailure(tiled, tiling_file, name, spec.path);
    }
    return Status::Ok();
  }

  // Drops the jobs whose bytes lie outside their data file (or whose file
  // is missing), recording each fault; returns the stored bytes left.
  Result<uint64_t> CheckChunkBounds() {
    std::map<std::string, std::optional<uint64_t>> sizes;  // nullopt: missing
    std::vector<ChunkJob> kept;
    uint64_t total = 0;
    for (ChunkJob& job : jobs_) {
      auto known = sizes.find(job.file);
      if (known == sizes.end()) {
        Result<uint64_t> size = storage_->FileSize(job.file);
        if (!size.ok() && size.status().code() != StatusCode::kNotFound) {
          return size.status();
        }
        known = sizes.emplace(job.file, size.ok() ? std::optional<uint64_t>(*size)
                                                  : std::nullopt).first;
        if (!size.ok()) {
          Add({job.file, job.checkpointable, "", std::nullopt,
               "Corruption: checkpoint " + path_ + " is incomplete: data file " + job.file +
                   ", which its index names, is missing"});
        }
      }
      if (!known->second) continue;
      const uint64_t size = *known->second;
      const format::ChunkRecord& record = job.record;
      if (record.offset > size || record.stored_length > size - record.offset) {
        Add({job.file, job.checkpointable, job.leaf, record.offset,
             "Corruption: " + internal::DescribeChunk(record, job.leaf, job.file) + " of " +
                 std::to_string(record.stored_length) +
                 " bytes lies past the end of the file (" + std::to_string(size) +
                 " bytes)"});
        continue;
      }
      total += record.stored_length;
      kept.push_back(std::move(job));
    }
    jobs_ = std::move(kept);
    return total;
  }

  Status CheckChunks() {
    SK_ASSIGN_OR_RETURN(const uint64_t total, CheckChunkBounds());
    // Neighbouring chunks one after another: sequential reads of each file.
    std::sort(jobs_.begin(), jobs_.end(), [](const ChunkJob& a, const ChunkJob& b) {
      return std::tie(a.file, a.record.offset) < std::tie(b.file, b.record.offset);
    });
    internal::ByteLimiter limiter(options_.memory_limit ? options_.memory_limit
                                                        : uint64_t{1} << 30);
    const int threads =
        options_.threads > 0
            ? options_.threads
            : std::max(Options().ResolvedIoThreads(), storage_->features().parallel_reads);
    uint64_t done = 0;
    std::mutex progress_mu;
    if (options_.progress) options_.progress(0, total);
    SK_RETURN_IF_ERROR(internal::ParallelFor(jobs_.size(), threads, [&](size_t i) -> Status {
      SK_RETURN_IF_ERROR(CheckChunk(jobs_[i], limiter));
      std::lock_guard<std::mutex> lock(progress_mu);
      done += jobs_[i].record.stored_length;
      if (options_.progress) options_.progress(done, total);
      return Status::Ok();
    }, "verifying a chunk"));
    report_.chunks_checked = jobs_.size();
    report_.bytes_checked = total;
    return Status::Ok();
  }

  Status CheckChunk(const ChunkJob& job, internal::ByteLimiter& limiter) {
    const format::ChunkRecord& record = job.record;
    const bool compressed = record.codec != format::Codec::kRaw;
    internal::ScopedBytes hold(limiter,
                               record.stored_length + (compressed ? record.raw_length : 0));
    auto stored = std::make_unique_for_overwrite<uint8_t[]>(record.stored_length);
    const Status read = storage_->ReadAt(job.file, record.offset, record.stored_length,
                                         stored.get());
    auto add = [&](const Status& status) {
      return AddIfDamage(status, job.file, job.checkpointable, job.leaf, record.offset);
    };
    if (!read.ok()) return add(read);
    auto check = [&] {
      return internal::CheckChunkChecksum(record, stored.get(), job.leaf, job.file);
    };
    const Status checksum = internal::RereadAfterFailedCheck(
        *storage_, check(), job.file, record.offset, record.stored_length, stored.get(), check);
    // A chunk whose bytes changed cannot be expected to decompress.
    if (!checksum.ok() || !compressed) return add(checksum);
    // Decompressing every frame is the check; the leaf's dtype (which the
    // verifier may not know) would only add joining its byte planes.
    auto raw = std::make_unique_for_overwrite<uint8_t[]>(record.raw_length);
    return add(internal::DecodeChunk(record, stored.get(), /*item_size=*/0, raw.get(),
                                     /*planes=*/nullptr, job.leaf, job.file));
  }

  Result<VerifyReport> Finish() {
    std::stable_sort(report_.problems.begin(), report_.problems.end(),
                     [](const VerifyProblem& a, const VerifyProblem& b) {
                       return std::tie(a.file, a.offset) < std::tie(b.file, b.offset);
                     });
    return std::move(report_);
  }

  std::shared_ptr<Storage> storage_;
  const std::string path_;
  const VerifyOptions& options_;
  std::vector<ChunkJob> jobs_;
  std::mutex mu_;  // guards report_.problems (chunk threads add to it)
  VerifyReport report_;
};

}  // namespace

Result<VerifyReport> VerifyCheckpoint(std::shared_ptr<Storage> storage,
                                      const std::string& path,
                                      const VerifyOptions& options) {
  if (storage == nullptr) {
    return InvalidArgumentError("verification of " + path + " was given no storage");
  }
  Verifier verifier(std::move(storage), path, options);
  return verifier.Run();
}

}  // namespace shardkeep
