// shardkeep::Storage over one S3 bucket. Paths are object keys ('/'
// separated, no leading '/'); a "directory" is the set of keys under
// "dir/", so CreateDir and SyncDir have nothing to do, an empty directory
// does not exist, and there is no rename: object stores commit with a
// conditional PUT (WriteIfAbsent) instead.
//
//   ReadAt          ranged GET written straight into the caller's buffer
//   ReadAll         GET;  FileSize: HEAD
//   WriteAll        PUT (multipart with parallel parts when large); a
//                   successful PUT is durable
//   WriteIfAbsent   PUT with If-None-Match: *
//   OpenForAppend   multipart_upload.h
//   Exists          HEAD of the key, else a one-key listing of "path/"
//   List            ListObjectsV2 with delimiter '/', every page
//   DeleteFile      HEAD (for NotFound), then DELETE
//   DeleteRecursive the key and every key under "path/", in DeleteObjects
//                   batches of up to 1000
//
// Keys ending in '/' are refused: some servers (SeaweedFS) treat them as
// directories.
#pragma once

#include <memory>

#include "shardkeep/storage.h"
#include "storage/s3/multipart_upload.h"
#include "storage/s3/s3_client.h"

namespace shardkeep::s3 {

struct S3StorageOptions {
  MultipartOptions multipart;
};

std::shared_ptr<Storage> NewS3Storage(std::shared_ptr<const S3Client> client,
                                      S3StorageOptions options = {});

}  // namespace shardkeep::s3
