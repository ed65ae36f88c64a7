// The WritableFile of the S3 backend: appended bytes go up as a multipart
// upload with several parts in flight, or as one PUT when the file stays
// smaller than a part.
//
// Memory stays bounded: appends smaller than a part are gathered into part
// buffers, at most `parts_in_flight` of them uploading while one fills; a
// large append is uploaded straight from the caller's memory, whole parts
// at a time (no staging copy), and the append returns once those parts are
// up. The upload is created with the first full part, so a small file
// costs one PUT at Close.
//
// Sync() completes the upload (the object is durable when it returns);
// Close() does the same when Sync() was not called. On any failure, and on
// destruction without Close(), the upload is aborted, so no parts are
// left behind on the server.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "shardkeep/storage.h"
#include "storage/s3/s3_client.h"

namespace shardkeep::s3 {

struct MultipartOptions {
  // S3 wants every part but the last to be at least 5 MiB.
  size_t part_size = size_t{8} << 20;
  int parts_in_flight = 4;
};

std::unique_ptr<WritableFile> NewMultipartWriter(
    std::shared_ptr<const S3Client> client, std::string key,
    MultipartOptions options);

}  // namespace shardkeep::s3
