#include "engine/shard_writer.h"

#include <xxhash.h>
// For ZSTD_estimateCStreamSize_usingCParams (the working memory of a compression
// context, counted against host_memory_limit), ZSTD_c_literalCompressionMode
// and ZSTD_c_stableInBuffer.
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>

#include "engine/byte_limiter.h"
#include "engine/byte_planes.h"
#include "engine/chunking.h"
#include "engine/copy.h"
#include "engine/parallel.h"
#include "engine/sync_batch.h"
#include "format/index.h"
#include "shardkeep/alignment.h"
#include "shardkeep/cancellation.h"
#include "shardkeep/shard_feed.h"

namespace shardkeep::internal {
namespace {

struct ChunkTask {
  const ShardData* shard;
  Box box;
};

struct ZstdContextDeleter {
  void operator()(ZSTD_CCtx* context) const { ZSTD_freeCCtx(context); }
};

// One writer thread's state: its current data file and scratch memory (the
// gather buffer, zstd's output and working memory). The scratch memory is
// held in the save's ByteLimiter for as long as it is allocated.
class ThreadWriter {
 public:
  ThreadWriter(Storage& storage, const std::string& dir, int process,
               const Options& options, std::atomic<uint32_t>& next_file,
               ByteLimiter& limiter)
      : storage_(storage), dir_(dir), process_(process), options_(options),
        file_limit_(FileLimit(storage, options)), next_file_(next_file), limiter_(limiter) {}
  ~ThreadWriter() { FreeScratch(); }

  Status Write(const ChunkTask& task, std::vector<format::ChunkRecord>& out) {
    const ShardData& shard = *task.shard;
    const uint64_t item = DTypeSize(shard.dtype);
    const uint64_t raw_length = task.box.NumElements() * item;
    const bool contiguous = !shard.fill && IsContiguousIn(task.box, shard.box);
    ReserveScratch(raw_length, !contiguous, item);
    const uint8_t* raw = nullptr;
    if (shard.fill) {  // a source: produce just this chunk
      gather_.resize(raw_length);
      SK_RETURN_IF_ERROR(shard.fill(task.box, gather_.data()));
      raw = gather_.data();
    } else if (contiguous) {
      raw = shard.data + RowMajorOffset(task.box, shard.box) * item;
    } else {
      gather_.resize(raw_length);
      CopyRegion(shard.data, shard.box, shard.dtype, gather_.data(), task.box,
                 shard.dtype, task.box);
      raw = gather_.data();
    }
    format::ChunkRecord record;
    record.leaf = shard.leaf;
    record.box = task.box;
    record.raw_length = raw_length;
    const uint8_t* stored = raw;
    uint64_t stored_length = raw_length;
    if (options_.compress) {
      SK_ASSIGN_OR_RETURN(std::optional<uint64_t> compressed,
                          Compress(raw, raw_length, item));
      // Incompressible data is stored raw: smaller and faster to read.
      if (compressed) {
        record.codec = format::Codec::kZstdBytePlanes;
        stored = compressed_.data();
        stored_length = *compressed;
      }
    }
    record.stored_length = stored_length;
    record.checksum = XXH3_64bits(stored, stored_length);
    SK_RETURN_IF_ERROR(EnsureFile(stored_length));
    // Each chunk starts at a multiple of kXlaAlignment, so that a reader
    // can map it and hand it to XLA, which adopts only aligned buffers.
    static constexpr uint8_t kZeros[kXlaAlignment] = {};
    if (const uint64_t pad = -file_bytes_ % kXlaAlignment; pad != 0) {
      SK_RETURN_IF_ERROR(file_->Append(kZeros, pad));
      file_bytes_ += pad;
    }
    record.data_file = file_number_;
    record.offset = file_bytes_;
    SK_RETURN_IF_ERROR(file_->Append(stored, stored_length));
    file_bytes_ += stored_length;
    out.push_back(std::move(record));
    return Status::Ok();
  }

  // After the last chunk: gives back the scratch memory, and the current
  // file (if any) to `batch`, which makes it durable.
  void Finish(SyncBatch& batch) {
    FreeScratch();
    if (file_) batch.AddFile(std::move(file_), FilePath());
  }

 private:
  // Compresses a chunk of `length` bytes of `item`-byte elements into
  // compressed_ as codec 2 (docs/FORMAT.md §5): one zstd frame per block of
  // kBytePlaneBlockElements elements, each of the block's byte planes.
  // Returns the stored size, or nullopt when it would not be smaller than
  // the chunk (which is then stored raw).
  Result<std::optional<uint64_t>> Compress(const uint8_t* raw, uint64_t length, uint32_t item) {
    SK_RETURN_IF_ERROR(PrepareContext());
    compressed_.resize(length);
    ZSTD_outBuffer out{compressed_.data(), compressed_.size(), 0};
    const uint64_t block_bytes = kBytePlaneBlockElements * item;
    for (uint64_t at = 0; at < length; at += block_bytes) {
      const uint64_t bytes = std::min(block_bytes, length - at);
      const uint8_t* input = raw + at;
      if (item > 1) {
        planes_.resize(bytes);
        SplitBytePlanes(raw + at, bytes / item, item, planes_.data());
        input = planes_.data();
      }
      SK_ASSIGN_OR_RETURN(bool fits, CompressFrame(input, bytes, item, out));
      if (!fits) return std::optional<uint64_t>();
    }
    return std::optional<uint64_t>(out.pos);
  }

  // Appends one frame of `planes` equal planes (`length` bytes) to `out`;
  // false when `out` is full first. Each plane ends a zstd block, so that
  // one block's entropy table never serves both a plane of exponents and a
  // plane of random mantissa bits (a block shorter than a full one would
  // otherwise mix them). Literals are entropy-coded at every level: at
  // zstd's fast negative levels they would otherwise be stored raw, and the
  // exponent planes gain nothing (docs/COMPRESSION.md).
  Result<bool> CompressFrame(const uint8_t* input, uint64_t length, uint32_t planes,
                             ZSTD_outBuffer& out) {
    ZSTD_CCtx* context = zstd_.get();
    ZSTD_CCtx_reset(context, ZSTD_reset_session_only);
    ZSTD_CCtx_setPledgedSrcSize(context, length);
    // The input grows plane by plane over one buffer (stableInBuffer).
    ZSTD_inBuffer in{input, 0, 0};
    for (uint32_t plane = 1; plane <= planes; ++plane) {
      in.size = length / planes * plane;
      const ZSTD_EndDirective end = plane == planes ? ZSTD_e_end : ZSTD_e_flush;
      size_t left = 0;
      do {
        left = ZSTD_compressStream2(context, &out, &in, end);
        if (ZSTD_isError(left)) {
          return InternalError(std::string("zstd compression failed: ") +
                               ZSTD_getErrorName(left));
        }
        if (left != 0 && out.pos == out.size) return false;
      } while (left != 0);
    }
    return true;
  }

  Status PrepareContext() {
    if (zstd_) return Status::Ok();
    // zstd would clamp a level out of its range without a word.
    if (options_.zstd_level < ZSTD_minCLevel() || options_.zstd_level > ZSTD_maxCLevel()) {
      return InvalidArgumentError("zstd level " + std::to_string(options_.zstd_level) +
                                  " is outside [" + std::to_string(ZSTD_minCLevel()) + ", " +
                                  std::to_string(ZSTD_maxCLevel()) + "]");
    }
    zstd_.reset(ZSTD_createCCtx());
    if (!zstd_) return ResourceExhaustedError("cannot create a zstd context");
    for (const auto& [parameter, value] :
         {std::pair{ZSTD_c_compressionLevel, options_.zstd_level},
          std::pair{ZSTD_c_literalCompressionMode, static_cast<int>(ZSTD_ps_enable)},
          std::pair{ZSTD_c_stableInBuffer, 1}}) {
      const size_t set = ZSTD_CCtx_setParameter(zstd_.get(), parameter, value);
      if (ZSTD_isError(set)) {
        return InternalError(std::string("cannot configure zstd: ") + ZSTD_getErrorName(set));
      }
    }
    return Status::Ok();
  }

  // Makes the scratch memory held in the limiter cover a chunk of
  // `raw_length` bytes of `item`-byte elements: its gather buffer if it is
  // not contiguous in its shard, and when compressing one block's byte
  // planes, zstd's output and its working memory. To grow, the thread
  // first gives back everything it holds, so it never waits for memory
  // while holding some and threads cannot deadlock on the limiter.
  void ReserveScratch(uint64_t raw_length, bool gather, uint32_t item) {
    uint64_t planes = 0, output = 0, context = 0;
    if (options_.compress) {
      planes = item > 1 ? std::min(raw_length, kBytePlaneBlockElements * item) : 0;
      output = raw_length;
      context = ZSTD_estimateCStreamSize_usingCParams(
          ZSTD_getCParams(options_.zstd_level, raw_length, 0));
    }
    const uint64_t needed =
        std::max<uint64_t>(gather_.capacity(), gather ? raw_length : 0) +
        std::max<uint64_t>(planes_.capacity(), planes) +
        std::max<uint64_t>(compressed_.capacity(), output) +
        std::max<uint64_t>(zstd_ ? held_context_ : 0, context);
    if (needed <= held_) {
      held_context_ = std::max(held_context_, context);
      return;
    }
    FreeScratch();
    held_context_ = context;
    held_ = (gather ? raw_length : 0) + planes + output + context;
    limiter_.Acquire(held_);
  }

  void FreeScratch() {
    gather_ = {};
    planes_ = {};
    compressed_ = {};
    zstd_.reset();
    limiter_.Release(held_);
    held_ = 0;
    held_context_ = 0;
  }

  // A new data file starts past this: the options' limit, or the store's
  // where it is smaller (StorageFeatures::data_file_bytes).
  static uint64_t FileLimit(Storage& storage, const Options& options) {
    const uint64_t store_limit = storage.features().data_file_bytes;
    return store_limit > 0 ? std::min(store_limit, options.data_file_bytes)
                           : options.data_file_bytes;
  }

  std::string FilePath() const {
    return dir_ + "/" + format::DataFileName(process_, file_number_);
  }

  Status EnsureFile(uint64_t next_bytes) {
    if (file_ && file_bytes_ > 0 && file_bytes_ + next_bytes > file_limit_) {
      // A full file is synced at once rather than with the last ones, so
      // that a save of many files never holds them all open.
      SK_RETURN_IF_ERROR(file_->Sync());
      const Status closed = file_->Close();
      file_.reset();
      SK_RETURN_IF_ERROR(closed);
    }
    if (file_) return Status::Ok();
    file_number_ = next_file_.fetch_add(1);
    SK_ASSIGN_OR_RETURN(file_, storage_.OpenForAppend(FilePath()));
    file_bytes_ = 0;
    return Status::Ok();
  }

  Storage& storage_;
  const std::string& dir_;
  const int process_;
  const Options& options_;
  const uint64_t file_limit_;  // FileLimit
  std::atomic<uint32_t>& next_file_;
  std::unique_ptr<WritableFile> file_;
  uint32_t file_number_ = 0;
  uint64_t file_bytes_ = 0;
  ByteLimiter& limiter_;
  uint64_t held_ = 0;          // bytes of limiter_ held for the scratch memory
  uint64_t held_context_ = 0;  // of which for zstd_
  std::vector<uint8_t> gather_;
  std::vector<uint8_t> planes_;
  std::vector<uint8_t> compressed_;
  std::unique_ptr<ZSTD_CCtx, ZstdContextDeleter> zstd_;
};

// Hands the chunks of a feed's shards to the writer threads as the shards
// arrive: one thread at a time waits on the feed, the others for what it
// takes. The shards stay here, where the tasks point, until the end.
class ChunkQueue {
 public:
  ChunkQueue(ShardFeed& feed, const ShardCheck& check, const Options& options)
      : feed_(feed), check_(check), options_(options),
        cancelled_(CancellationScope::Current()) {}

  // The next chunk to write; nullopt once every shard's chunks have been
  // handed out. The feed's failure, a shard that fails the check, or the
  // first writer's failure (Stop) fails every later call.
  Result<std::optional<ChunkTask>> Next() {
    std::unique_lock lock(mutex_);
    while (tasks_.empty()) {
      if (!failed_.ok()) return failed_;
      if (drained_) return std::optional<ChunkTask>();
      if (taking_) {
        refilled_.wait(lock);
        continue;
      }
      taking_ = true;
      lock.unlock();
      Result<std::vector<ShardData>> taken = feed_.Take(options_.timeout_s, [this] {
        return cancelled_.cancelled() || stopped_.load();
      });
      Status checked = taken.status();
      for (size_t i = 0; checked.ok() && i < taken->size(); ++i) checked = check_((*taken)[i]);
      lock.lock();
      taking_ = false;
      if (!checked.ok()) {
        if (failed_.ok()) failed_ = std::move(checked);
      } else if (taken->empty()) {
        drained_ = true;
      } else {
        for (const ShardData& shard : shards_.emplace_back(std::move(*taken))) {
          if (shard.box.NumElements() == 0) continue;  // nothing to store
          for (Box& box : SplitIntoChunks(shard.box, DTypeSize(shard.dtype),
                                          options_.chunk_bytes)) {
            tasks_.push_back({&shard, std::move(box)});
          }
        }
      }
      refilled_.notify_all();
    }
    ChunkTask task = std::move(tasks_.front());
    tasks_.pop_front();
    return std::optional<ChunkTask>(std::move(task));
  }

  // A writer failed: no more chunks are handed out, and a thread waiting on
  // the feed gives up.
  void Stop(const Status& failure) {
    stopped_.store(true);
    std::lock_guard lock(mutex_);
    if (failed_.ok()) failed_ = failure;
    refilled_.notify_all();
  }

 private:
  ShardFeed& feed_;
  const ShardCheck& check_;
  const Options& options_;
  const CancellationToken cancelled_;
  std::atomic<bool> stopped_{false};
  std::mutex mutex_;
  std::condition_variable refilled_;
  std::deque<std::vector<ShardData>> shards_;  // moved in whole: their elements stay put
  std::deque<ChunkTask> tasks_;
  bool taking_ = false;
  bool drained_ = false;
  Status failed_;
};

}  // namespace

Result<std::string> WriteShards(Storage& storage, const std::string& dir,
                                int process_index,
                                const std::vector<ShardData>& shards,
                                const Options& options) {
  ByteLimiter limiter(options.ResolvedHostMemoryLimit());
  SyncBatch unsynced;
  SK_ASSIGN_OR_RETURN(std::string index_name,
                      WriteShards(storage, dir, process_index, shards, options,
                                  limiter, unsynced));
  SK_RETURN_IF_ERROR(unsynced.SyncAll(storage));
  return index_name;
}

Result<std::string> WriteShards(Storage& storage, const std::string& dir,
                                int process_index,
                                const std::vector<ShardData>& shards,
                                const Options& options, ByteLimiter& limiter,
                                SyncBatch& unsynced,
                                std::vector<format::ChunkRecord> linked) {
  // No more writer threads than chunks: a shard has at least one chunk per
  // chunk_bytes of it (none when empty), so a small save starts few.
  uint64_t min_chunks = 0;
  for (const ShardData& shard : shards) {
    const uint64_t bytes = shard.box.NumElements() * DTypeSize(shard.dtype);
    min_chunks += (bytes + options.chunk_bytes - 1) / std::max<uint64_t>(options.chunk_bytes, 1);
  }
  ShardFeed feed;
  SK_RETURN_IF_ERROR(feed.Add(shards));
  feed.Close();
  const ShardCheck accept_all = [](const ShardData&) { return Status::Ok(); };
  return WriteShards(storage, dir, process_index, feed, accept_all, options, limiter, unsynced,
                     std::move(linked), min_chunks);
}

Result<std::string> WriteShards(Storage& storage, const std::string& dir,
                                int process_index, ShardFeed& feed, const ShardCheck& check,
                                const Options& options, ByteLimiter& limiter,
                                SyncBatch& unsynced,
                                std::vector<format::ChunkRecord> linked,
                                uint64_t max_threads) {
  // Each thread takes the next unclaimed chunk and appends it to its own
  // file, so large shards are spread over all threads, the load balances
  // itself, and no two threads share a file.
  const int wanted = options.io_threads > 0
                         ? options.io_threads
                         : std::max(options.ResolvedIoThreads(), storage.features().parallel_writes);
  const int threads = static_cast<int>(std::clamp<uint64_t>(max_threads, 1, wanted));
  uint32_t first_file = 0;
  for (const format::ChunkRecord& record : linked) {
    first_file = std::max(first_file, record.data_file + 1);
  }
  std::atomic<uint32_t> next_file{first_file};
  ChunkQueue queue(feed, check, options);
  std::vector<std::unique_ptr<ThreadWriter>> writers;
  std::vector<std::vector<format::ChunkRecord>> records(threads);
  std::vector<SyncBatch> written(threads);
  for (int t = 0; t < threads; ++t) {
    writers.push_back(std::make_unique<ThreadWriter>(storage, dir, process_index,
                                                     options, next_file, limiter));
  }
  const CancellationToken cancelled = CancellationScope::Current();
  SK_RETURN_IF_ERROR(ParallelFor(threads, threads, [&](size_t t) -> Status {
    Status status = [&]() -> Status {
      while (true) {
        if (cancelled.cancelled()) {
          return CancelledError("writing the shards of " + dir + " was cancelled");
        }
        SK_ASSIGN_OR_RETURN(std::optional<ChunkTask> task, queue.Next());
        if (!task) return Status::Ok();
        SK_RETURN_IF_ERROR(writers[t]->Write(*task, records[t]));
      }
    }();
    if (!status.ok()) queue.Stop(status);
    writers[t]->Finish(written[t]);
    return status;
  }, "writer thread of " + dir));

  std::vector<format::ChunkRecord> all = std::move(linked);
  for (auto& part : records) {
    all.insert(all.end(), std::make_move_iterator(part.begin()),
               std::make_move_iterator(part.end()));
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return std::tie(a.leaf, a.box.origin) < std::tie(b.leaf, b.box.origin);
  });
  const std::string index_name = format::IndexFileName(process_index);
  const std::string index_path = dir + "/" + index_name;
  SK_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> index,
                      storage.OpenForAppend(index_path));
  const std::string encoded = format::EncodeIndex(all);
  SK_RETURN_IF_ERROR(index->Append(encoded.data(), encoded.size()));
  for (SyncBatch& batch : written) unsynced.Take(std::move(batch));
  unsynced.AddFile(std::move(index), index_path);
  return index_name;
}

}  // namespace shardkeep::internal
