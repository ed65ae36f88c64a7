// The S3 storages of the process: one per resolved configuration and
// bucket, so that every checkpoint in a bucket shares one pool of
// connections however many times its URL is resolved.
#pragma once

#include <memory>
#include <string>

#include "shardkeep/status.h"
#include "shardkeep/storage.h"

namespace shardkeep::s3 {

// Resolves the configuration of `bucket` (overrides, environment, AWS
// files; s3_location.h) and returns the storage for it, created on first
// use. InvalidArgument for a configuration that does not resolve or a
// timeout_s that is not positive.
Result<std::shared_ptr<Storage>> SharedS3Storage(const std::string& bucket,
                                                 const S3Overrides& overrides);

}  // namespace shardkeep::s3
