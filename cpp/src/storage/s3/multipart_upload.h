// The WritableFile of the S3 backend: a part writer (storage/part_writer.h)
// over S3's multipart upload, or one PUT when the file stays smaller than a
// part.
#pragma once

#include <memory>
#include <string>

#include "shardkeep/storage.h"
#include "storage/part_writer.h"
#include "storage/s3/s3_client.h"

namespace shardkeep::s3 {

using MultipartOptions = PartWriterOptions;

std::unique_ptr<WritableFile> NewMultipartWriter(
    std::shared_ptr<const S3Client> client, std::string key,
    MultipartOptions options);

}  // namespace shardkeep::s3
