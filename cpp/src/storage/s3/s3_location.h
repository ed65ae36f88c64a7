// Where an s3:// checkpoint lives and how to reach it: the URL's bucket and
// key prefix, and the endpoint, region and credentials resolved the way the
// AWS CLI and SDKs resolve them.
//
// Precedence, highest first, for each setting:
//   1. S3Overrides (a per-call override for users with several stores);
//   2. the environment: AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY
//      (+ AWS_SESSION_TOKEN), AWS_REGION then AWS_DEFAULT_REGION,
//      AWS_ENDPOINT_URL_S3 then AWS_ENDPOINT_URL;
//   3. the profile (S3Overrides::profile, else AWS_PROFILE, else "default")
//      in the shared credentials file ("[name]" sections;
//      AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials) and the config
//      file ("[profile name]", "[default]"; AWS_CONFIG_FILE, else
//      ~/.aws/config): aws_access_key_id, aws_secret_access_key,
//      aws_session_token, region, endpoint_url;
//   4. defaults: region us-east-1, the AWS endpoint of the region.
// Credentials are taken whole from one source, never a key id from one
// and a secret from another. A profile named in S3Overrides wins over
// credentials in the environment, like the CLI's --profile.
//
// Addressing: a custom endpoint (MinIO, SeaweedFS, Ceph, GCS) is addressed
// path-style, http(s)://endpoint/bucket/key; AWS itself virtual-hosted,
// https://bucket.s3.region.amazonaws.com/key, unless the bucket name is not
// a DNS label ('.' or '_'), which only path-style reaches.
//
// Secrets (the secret access key and the session token) appear in no error
// message and in no ToString().
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "shardkeep/status.h"
#include "shardkeep/storage.h"
#include "storage/s3/sigv4.h"

namespace shardkeep::s3 {

// "s3://bucket/key/prefix" split up. The prefix has no leading or trailing
// '/' and may be empty (the whole bucket).
struct S3Url {
  std::string bucket;
  std::string prefix;
};

// InvalidArgument naming `url` when it is not "s3://", the bucket name
// breaks S3's rules (3-63 characters of a-z 0-9 . - _, starting and ending
// with a letter or digit, no "..", not an IPv4 address), or the prefix has
// an empty, "." or ".." segment.
Result<S3Url> ParseS3Url(std::string_view url);

// Explicit settings (shardkeep::S3Overrides, storage.h) win over every
// other source.
using shardkeep::S3Overrides;

// What configuration is read from, injectable so that tests do not depend
// on the machine's environment or home directory.
struct ConfigEnvironment {
  // The value of an environment variable, nullopt when unset.
  std::function<std::optional<std::string>(const std::string& name)> get_env;
  // A file's content; nullopt when it does not exist, an error when it
  // exists but cannot be read.
  std::function<Result<std::optional<std::string>>(const std::string& path)>
      read_file;
};

// The process environment and the real filesystem.
ConfigEnvironment ProcessConfigEnvironment();

struct S3Config {
  AwsCredentials credentials;
  std::string region;
  // "scheme://host[:port]" without a trailing '/': the custom endpoint, or
  // the AWS endpoint of the region.
  std::string endpoint;
  bool path_style = false;

  // Everything but the secrets, for logs and error messages: the secret
  // and the session token show only whether they are set.
  std::string ToString() const;
};

// Resolves the configuration for `bucket` (which decides whether AWS can be
// addressed virtual-hosted). InvalidArgument naming the source (variable,
// profile, file) when credentials are missing or half given, the endpoint
// is not http(s)://host[:port], or the named profile exists nowhere; the
// read error of a configuration file that exists but cannot be read.
Result<S3Config> ResolveS3Config(const std::string& bucket,
                                 const S3Overrides& overrides,
                                 const ConfigEnvironment& environment);

// The two parts of an object's URL and the Host header to sign.
struct S3ObjectAddress {
  std::string base_url;  // "https://bucket.s3.us-east-1.amazonaws.com"
  std::string host;      // "bucket.s3.us-east-1.amazonaws.com"
  std::string path;      // decoded: "/key" or "/bucket/key"
};

// Where the object `key` (possibly empty: the bucket itself) of `bucket`
// is reached under `config`.
S3ObjectAddress AddressObject(const S3Config& config,
                              const std::string& bucket,
                              const std::string& key);

}  // namespace shardkeep::s3
