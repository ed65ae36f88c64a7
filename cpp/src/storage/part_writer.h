// The WritableFile of object stores: appended bytes go up in parts, several
// in flight, or as one request when the file stays smaller than a part. A
// store says how parts are sent and joined (PartUpload); this writer owns
// the buffering, the parallelism and the failure handling, for all of them.
//
// Memory stays bounded: appends smaller than a part are gathered into part
// buffers, at most `parts_in_flight` of them uploading while one fills; a
// large append is uploaded straight from the caller's memory, whole parts
// at a time (no staging copy), and the append returns once those parts are
// up. The upload begins with the first full part, so a small file costs one
// request at Close.
//
// Sync() completes the upload (the object is durable when it returns);
// Close() does the same when Sync() was not called. On any failure, and on
// destruction without Close(), the upload is aborted, so no parts are left
// behind on the server.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "shardkeep/storage.h"

namespace shardkeep {

// One object's upload in parts, as a store does it (S3's multipart upload,
// GCS's parts joined by compose). Begin, PutPart (from several threads at
// once), then Complete or Abort.
class PartUpload {
 public:
  virtual ~PartUpload() = default;
  // The object's URL, for messages.
  virtual std::string Name() const = 0;
  // The whole file in one request, for a file smaller than one part
  // (Begin is never called then).
  virtual Status PutWhole(std::string_view data) = 0;
  virtual Status Begin() = 0;
  // Sends part `number` (1, 2, ...); returns what Complete needs of it.
  virtual Result<std::string> PutPart(int number, std::string_view data) = 0;
  // Joins the parts, by number, into the object of `bytes` bytes in all.
  // CommitStateUnknown when it cannot tell whether that happened.
  virtual Status Complete(std::map<int, std::string> parts, uint64_t bytes) = 0;
  // Best effort: removes what Begin and PutPart left on the server.
  virtual void Abort() = 0;
  virtual int max_parts() const = 0;
};

struct PartWriterOptions {
  // S3 wants every part but the last to be at least 5 MiB. Parts double
  // every 1,000, so that files far beyond 1,000 parts fit in 10,000.
  size_t part_size = size_t{8} << 20;
  int parts_in_flight = 4;
};

std::unique_ptr<WritableFile> NewPartWriter(std::unique_ptr<PartUpload> upload,
                                            PartWriterOptions options);

}  // namespace shardkeep
