// A server program run by the tests (SeaweedFS, fake-gcs-server): found on
// disk, started in its own process group on loopback ports, its output in
// a log, stopped with its whole group.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "shardkeep/status.h"

namespace shardkeep::testing {

// The first of: $<env_var>, <checkout>/<venv_relative> (each a glob with at
// most one '*', e.g. ".venv/lib/python*/site-packages/x/bin/y"), `name` on
// PATH; "" when none is executable.
std::string FindServerBinary(const char* env_var, const std::string& venv_relative,
                             const std::string& name);

// `count` loopback ports free now, all different. Another process may take
// one before the server binds it: callers retry with new ones.
Result<std::vector<int>> FreePorts(size_t count);

class ServerProcess {
 public:
  ServerProcess() = default;
  ~ServerProcess() { (void)Stop(); }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // Starts `args` (args[0] the binary), output appended to `log`.
  Status Launch(const std::vector<std::string>& args, const std::string& log);
  // Whether it is still running; false once it has exited.
  bool Running();
  // SIGTERM to the group, SIGKILL after 10 s.
  Status Stop();
  // The last 2,000 bytes of the log, for messages.
  std::string LogTail() const;

 private:
  pid_t pid_ = -1;
  std::string log_;
};

}  // namespace shardkeep::testing
