// How the processes of one job agree. A save or a load talks to the other
// processes only through this interface: single-process jobs use a trivial
// implementation, multi-process JAX jobs one bridged to JAX's coordination
// service, and C++ tests a simulated group of threads.
#pragma once

#include <memory>
#include <string>

#include "shardkeep/status.h"

namespace shardkeep {

class Coordinator {
 public:
  virtual ~Coordinator() = default;
  virtual int process_index() const = 0;
  virtual int process_count() const = 0;
  bool is_primary() const { return process_index() == 0; }

  // Returns once every process has called Barrier with the same `key`, or
  // Timeout naming the key (and the missing processes where known).
  // REQUIRES: keys are unique per operation and identical on all processes.
  virtual Status Barrier(const std::string& key, double timeout_s) = 0;
  virtual Status KeyValueSet(const std::string& key,
                             const std::string& value) = 0;
  // Waits until `key` is set, at most `timeout_s` seconds.
  virtual Result<std::string> KeyValueGet(const std::string& key,
                                          double timeout_s) = 0;
};

std::shared_ptr<Coordinator> NewSingleProcessCoordinator();

}  // namespace shardkeep
