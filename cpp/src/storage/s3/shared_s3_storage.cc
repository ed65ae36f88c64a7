#include "storage/s3/shared_s3_storage.h"

#include <map>
#include <mutex>
#include <utility>

#include "storage/s3/curl_transport.h"
#include "storage/s3/s3_client.h"
#include "storage/s3/s3_location.h"
#include "storage/s3/s3_storage.h"

namespace shardkeep::s3 {

Result<std::shared_ptr<Storage>> SharedS3Storage(
    const std::string& bucket, const S3Overrides& overrides) {
  SK_ASSIGN_OR_RETURN(
      S3Config config,
      ResolveS3Config(bucket, overrides, ProcessConfigEnvironment()));
  S3ClientOptions options;
  options.timeout_s = overrides.timeout_s.value_or(kDefaultTimeoutS);
  if (!(options.timeout_s > 0)) {
    return InvalidArgumentError("S3 timeout_s must be positive, not " +
                                std::to_string(options.timeout_s));
  }
  // The secret is part of the key (two secrets are two stores) but the key
  // is never printed.
  const std::string key =
      bucket + '\n' + config.endpoint + '\n' + config.region + '\n' +
      (config.path_style ? "path" : "host") + '\n' +
      config.credentials.access_key_id + '\n' +
      config.credentials.secret_access_key + '\n' +
      config.credentials.session_token + '\n' +
      std::to_string(options.timeout_s);
  // Never destroyed: storages may still be in use by threads at exit.
  static std::mutex mu;
  static auto* storages = new std::map<std::string, std::shared_ptr<Storage>>;
  static const auto* transport =
      new std::shared_ptr<HttpTransport>(NewCurlTransport());
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<Storage>& storage = (*storages)[key];
  if (storage == nullptr) {
    storage = NewS3Storage(std::make_shared<S3Client>(std::move(config), bucket,
                                                      *transport, options));
  }
  return storage;
}

}  // namespace shardkeep::s3
