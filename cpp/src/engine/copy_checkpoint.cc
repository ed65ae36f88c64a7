// Copying a committed checkpoint. The files to copy come from the commit
// record and the indexes (never from listing folders, which could pick up
// another save's files); the destination commits through make_visible.h,
// as a save does.
#include "shardkeep/copy_checkpoint.h"

#include <xxhash.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "engine/checked_read.h"
#include "engine/chunk_checks.h"
#include "engine/make_visible.h"
#include "engine/parallel.h"
#include "format/checkpointable_meta.h"
#include "format/commit_record.h"
#include "format/index.h"
#include "shardkeep/checkpoint_root.h"
#include "shardkeep/options.h"

namespace shardkeep {
namespace {

constexpr char kForceHint[] = "copy with force (shardkeep cp --force) to replace it";

// A checksummed span of a streamed file, and its recorded checksum: a
// chunk's stored bytes within a data file, or a whole value file.
struct ChunkSpan {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t checksum = 0;
  std::string what;  // "chunk of leaf #3", "value", for messages
};

// One file to copy, relative to the checkpoint's data root. Small files
// (meta.json, indexes) were read while planning and are written from
// memory; the others are streamed.
struct FileCopy {
  std::string relative;
  std::optional<std::string> bytes;
  uint64_t size = 0;
  std::vector<ChunkSpan> chunks;  // data files: sorted by offset
};

// Checks the chunks of one data file against the bytes streaming past:
// each chunk's XXH3-64 state is fed the part of every piece it covers.
class ChunkHasher {
 public:
  explicit ChunkHasher(const std::vector<ChunkSpan>& chunks) : chunks_(chunks) {
    states_.reserve(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      states_.emplace_back(XXH3_createState(), &XXH3_freeState);
      XXH3_64bits_reset(states_.back().get());
    }
  }

  // `piece` holds the file's bytes [start, start + size).
  void Feed(uint64_t start, const uint8_t* piece, uint64_t size) {
    const uint64_t end = start + size;
    // Chunks never overlap in a file a save wrote, so once one ends before
    // this piece every earlier one has too.
    while (first_ < chunks_.size() &&
           chunks_[first_].offset + chunks_[first_].length <= start) {
      ++first_;
    }
    for (size_t i = first_; i < chunks_.size() && chunks_[i].offset < end; ++i) {
      const uint64_t from = std::max(start, chunks_[i].offset);
      const uint64_t to = std::min(end, chunks_[i].offset + chunks_[i].length);
      if (from < to) XXH3_64bits_update(states_[i].get(), piece + (from - start), to - from);
    }
  }

  // Corruption naming the first chunk whose checksum differs.
  Status Check(const std::string& file) const {
    for (size_t i = 0; i < chunks_.size(); ++i) {
      if (XXH3_64bits_digest(states_[i].get()) == chunks_[i].checksum) continue;
      return CorruptionError("checksum mismatch: " + chunks_[i].what + " in " + file +
                             " at offset " + std::to_string(chunks_[i].offset) + ", length " +
                             std::to_string(chunks_[i].length) +
                             ", has changed since it was written; nothing was copied");
    }
    return Status::Ok();
  }

 private:
  const std::vector<ChunkSpan>& chunks_;
  std::vector<std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)>> states_;
  size_t first_ = 0;
};

class CheckpointCopy {
 public:
  CheckpointCopy(std::shared_ptr<Storage> from, std::string from_path,
                 std::shared_ptr<Storage> to, std::string to_path, const CopyOptions& options)
      : from_(std::move(from)), from_path_(std::move(from_path)), to_(std::move(to)),
        to_path_(std::move(to_path)), options_(options),
        context_("copy to " + to_path_), target_(*to_, to_path_, context_) {}

  Result<CopyReport> Run() {
    SK_RETURN_IF_ERROR(ReadSource());
    SK_RETURN_IF_ERROR(Plan());
    SK_RETURN_IF_ERROR(PrepareDestination());
    Status copied = CopyFiles();
    if (copied.ok()) copied = Commit();
    if (!copied.ok() && copied.code() != StatusCode::kCommitStateUnknown) {
      target_.Discard();
    }
    SK_RETURN_IF_ERROR(copied);
    return report_;
  }

 private:
  Status ReadSource() {
    const std::string file = from_path_ + "/" + format::kCommitFileName;
    Result<internal::CheckedBytes> read =
        internal::ReadAllChecked(*from_, file, [&](const std::string& bytes) {
          Result<format::CommitRecord> decoded = format::DecodeCommitRecord(bytes, file);
          if (decoded.ok()) commit_ = std::move(*decoded);
          return decoded.status();
        });
    if (read.status().code() == StatusCode::kNotFound) {
      return NotFoundError("no committed checkpoint at " + from_path_ + ": " + file +
                           " does not exist");
    }
    SK_RETURN_IF_ERROR(read.status());
    SK_RETURN_IF_ERROR(read->check);
    record_json_ = std::move(read->bytes);
    src_root_ = commit_.data_folder ? from_path_ + "/" + *commit_.data_folder : from_path_;
    return Status::Ok();
  }

  // Reads a small file of the source, to be checked (twice on remote
  // storage, ReadAllChecked) and written from memory.
  Status AddSmallFile(const std::string& relative,
                      const std::function<Status(const std::string&, const std::string&)>& check) {
    const std::string file = src_root_ + "/" + relative;
    SK_ASSIGN_OR_RETURN(internal::CheckedBytes read,
                        internal::ReadAllChecked(*from_, file, [&](const std::string& bytes) {
                          return check(bytes, file);
                        }));
    SK_RETURN_IF_ERROR(read.check);
    FileCopy copy{relative, std::move(read.bytes), 0, {}};
    copy.size = copy.bytes->size();
    files_.push_back(std::move(copy));
    return Status::Ok();
  }

  // A file copied in pieces, each span of `chunks` checked as it streams
  // past; with `checksum`, the whole file is one such span (a value file).
  Status AddStreamedFile(const std::string& relative, std::vector<ChunkSpan> chunks,
                         std::optional<uint64_t> checksum = std::nullopt) {
    const std::string file = src_root_ + "/" + relative;
    SK_ASSIGN_OR_RETURN(const uint64_t size, from_->FileSize(file));
    if (checksum) chunks.push_back({0, size, *checksum, "value"});
    std::sort(chunks.begin(), chunks.end(),
              [](const ChunkSpan& a, const ChunkSpan& b) { return a.offset < b.offset; });
    for (const ChunkSpan& chunk : chunks) {
      if (chunk.offset > size || chunk.length > size - chunk.offset) {
        return CorruptionError(chunk.what + " in " + file + " at offset " +
                               std::to_string(chunk.offset) + " of " +
                               std::to_string(chunk.length) + " bytes lies past the end of the file (" +
                               std::to_string(size) + " bytes); nothing was copied");
      }
    }
    files_.push_back({relative, std::nullopt, size, std::move(chunks)});
    return Status::Ok();
  }

  // Lists the files of every checkpointable, reading and checking the
  // small ones.
  Status Plan() {
    for (const format::CheckpointableEntry& entry : commit_.checkpointables) {
      const std::string& name = entry.name;
      auto meta_check = [&entry](const std::string& bytes, const std::string& file) {
        SK_RETURN_IF_ERROR(format::CheckListedChecksum(bytes, entry.meta_checksum, file));
        return format::DecodeCheckpointableMeta(bytes, file).status();
      };
      SK_RETURN_IF_ERROR(AddSmallFile(name + "/" + format::kMetaFileName, meta_check));
      if (entry.kind == "json" || entry.kind == "bytes") {
        SK_RETURN_IF_ERROR(
            AddStreamedFile(name + (entry.kind == "json" ? "/value.json" : "/value.bin"), {},
                            entry.value_checksum));
        continue;
      }
      auto listed = commit_.index_files.find(name);
      if (listed == commit_.index_files.end()) continue;
      std::map<std::string, std::vector<ChunkSpan>> data_files;
      for (const std::string& index : listed->second) {
        const int process = internal::ProcessOfIndexFile(index);
        auto collect = [&](const std::string& bytes, const std::string& file) -> Status {
          SK_ASSIGN_OR_RETURN(std::vector<format::ChunkRecord> records,
                              format::DecodeIndex(bytes, file));
          for (const format::ChunkRecord& record : records) {
            data_files[name + "/" + format::DataFileName(process, record.data_file)]
                .push_back({record.offset, record.stored_length, record.checksum,
                            "chunk of leaf #" + std::to_string(record.leaf)});
          }
          return Status::Ok();
        };
        SK_RETURN_IF_ERROR(AddSmallFile(name + "/" + index, collect));
      }
      for (auto& [relative, chunks] : data_files) {
        SK_RETURN_IF_ERROR(AddStreamedFile(relative, std::move(chunks)));
      }
    }
    // The largest first, so that no big file starts last.
    std::stable_sort(files_.begin(), files_.end(),
                     [](const FileCopy& a, const FileCopy& b) { return a.size > b.size; });
    return Status::Ok();
  }

  Status PrepareDestination() {
    SK_RETURN_IF_ERROR(target_.CheckUsable());
    SK_RETURN_IF_ERROR(target_.Prepare(options_.force, kForceHint));
    if (!target_.renames()) return Status::Ok();  // keys need no folders
    std::set<std::string> dirs;
    for (const FileCopy& file : files_) {
      dirs.insert(target_.folder() + "/" + file.relative.substr(0, file.relative.rfind('/')));
    }
    for (const std::string& dir : dirs) SK_RETURN_IF_ERROR(to_->CreateDir(dir));
    return Status::Ok();
  }

  Status CopyFiles() {
    uint64_t total = 0;
    for (const FileCopy& file : files_) total += file.size;
    const int threads = options_.threads > 0
                            ? options_.threads
                            : std::max({Options().ResolvedIoThreads(),
                                        from_->features().parallel_reads,
                                        to_->features().parallel_reads});
    uint64_t done = 0;
    std::mutex progress_mu;
    auto advance = [&](uint64_t bytes) {
      std::lock_guard<std::mutex> lock(progress_mu);
      done += bytes;
      if (options_.progress) options_.progress(done, total);
    };
    advance(0);
    SK_RETURN_IF_ERROR(internal::ParallelFor(
        files_.size(), threads, [&](size_t i) { return CopyFile(files_[i], advance); },
        "copying a file"));
    report_.files = files_.size() + 1;
    report_.bytes = total;
    for (const FileCopy& file : files_) report_.chunks_verified += file.chunks.size();
    return Status::Ok();
  }

  Status CopyFile(const FileCopy& file, const std::function<void(uint64_t)>& advance) {
    const std::string dst = target_.folder() + "/" + file.relative;
    if (file.bytes) {
      SK_RETURN_IF_ERROR(to_->WriteAll(dst, *file.bytes, /*sync=*/true));
      advance(file.size);
      return Status::Ok();
    }
    const std::string src = src_root_ + "/" + file.relative;
    SK_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, to_->OpenForAppend(dst));
    const uint64_t piece = std::max<uint64_t>(options_.piece_bytes, 1);
    auto buffer = std::make_unique_for_overwrite<uint8_t[]>(std::min(piece, file.size) + 1);
    ChunkHasher hasher(file.chunks);
    for (uint64_t offset = 0; offset < file.size; offset += piece) {
      const uint64_t size = std::min(piece, file.size - offset);
      SK_RETURN_IF_ERROR(from_->ReadAt(src, offset, size, buffer.get()));
      hasher.Feed(offset, buffer.get(), size);
      SK_RETURN_IF_ERROR(out->Append(buffer.get(), size));
      advance(size);
    }
    SK_RETURN_IF_ERROR(hasher.Check(src));
    SK_RETURN_IF_ERROR(out->Sync());
    return out->Close();
  }

  // The record as the destination's layout needs it: the source's bytes
  // when the layouts agree, else re-encoded with the new data folder.
  std::string DestinationRecord() const {
    const std::optional<std::string> folder = target_.data_folder();
    if (commit_.data_folder == folder) return record_json_;
    format::CommitRecord record = commit_;
    record.data_folder = folder;
    return format::EncodeCommitRecord(record);
  }

  Status Commit() {
    const std::string record = DestinationRecord();
    std::vector<std::string> files;
    for (const FileCopy& file : files_) files.push_back(file.relative);
    if (!target_.renames()) return target_.Commit(record, options_.force, files);
    files.push_back(format::kCommitFileName);
    const std::string& tmp = target_.folder();
    SK_RETURN_IF_ERROR(
        to_->WriteAll(tmp + "/" + format::kCommitFileName, record, /*sync=*/true));
    // Every entry must be durable before the rename makes the folder a
    // checkpoint; the deepest folders first.
    std::set<std::string, std::greater<>> dirs = {tmp};
    for (const FileCopy& file : files_) {
      std::string dir = tmp + "/" + file.relative.substr(0, file.relative.rfind('/'));
      while (dir.size() > tmp.size()) {
        dirs.insert(dir);
        dir = dir.substr(0, dir.rfind('/'));
      }
    }
    for (const std::string& dir : dirs) SK_RETURN_IF_ERROR(to_->SyncDir(dir));
    return target_.Commit(record, options_.force, files);
  }

  std::shared_ptr<Storage> from_;
  const std::string from_path_;
  std::shared_ptr<Storage> to_;
  const std::string to_path_;
  const CopyOptions& options_;
  const std::string context_;
  format::CommitRecord commit_;
  std::string record_json_;  // the source's _SHARDKEEP as stored
  std::string src_root_;     // the folder holding the source's checkpointables
  // How and where the copy commits; written into its folder first.
  internal::CommitTarget target_;
  std::vector<FileCopy> files_;
  CopyReport report_;
};

}  // namespace

Result<CopyReport> CopyCheckpoint(std::shared_ptr<Storage> from, const std::string& from_path,
                                  std::shared_ptr<Storage> to, const std::string& to_path,
                                  const CopyOptions& options) {
  if (from == nullptr || to == nullptr) {
    return InvalidArgumentError("copy of " + from_path + " to " + to_path +
                                " was given no storage");
  }
  CheckpointCopy copy(std::move(from), from_path, std::move(to), to_path, options);
  return copy.Run();
}

}  // namespace shardkeep
