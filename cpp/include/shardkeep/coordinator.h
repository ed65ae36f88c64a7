// How the processes of one job agree. A save or a load talks to the other
// processes only through this interface: single-process jobs use a trivial
// implementation, multi-process JAX jobs one bridged to JAX's coordination
// service, and C++ tests a simulated group of threads.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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
  // Keys are write-once: setting a key that is set is AlreadyExists. The
  // commit protocol relies on this to decide a save's outcome exactly once.
  virtual Status KeyValueSet(const std::string& key,
                             const std::string& value) = 0;
  // Waits until `key` is set, at most `timeout_s` seconds.
  virtual Result<std::string> KeyValueGet(const std::string& key,
                                          double timeout_s) = 0;
  // The value of `key` if it is set now, nullopt otherwise; never waits.
  virtual Result<std::optional<std::string>> KeyValueTryGet(
      const std::string& key) = 0;
  // The keys that are set now and start with `prefix`, in any order.
  virtual Result<std::vector<std::string>> KeyValueList(
      const std::string& prefix) = 0;
  // Removes `key` if it is set (OK if it is not). Best effort: a service
  // that cannot delete keeps them, which costs memory, never correctness;
  // callers delete only keys that no process will read again.
  virtual Status KeyValueDelete(const std::string& key) = 0;
};

std::shared_ptr<Coordinator> NewSingleProcessCoordinator();

// A coordinator whose operations are supplied as functions, e.g. bridged to
// JAX's coordination service by the Python front. The functions may be
// called from any thread, one call at a time per function is not assumed.
struct CoordinatorFunctions {
  std::function<Status(const std::string& key, double timeout_s)> barrier;
  std::function<Status(const std::string& key, const std::string& value)> set;
  std::function<Result<std::string>(const std::string& key, double timeout_s)> get;
  std::function<Result<std::optional<std::string>>(const std::string& key)> try_get;
  std::function<Result<std::vector<std::string>>(const std::string& prefix)> list;
  std::function<Status(const std::string& key)> remove;
};
std::shared_ptr<Coordinator> NewCallbackCoordinator(
    int process_index, int process_count, CoordinatorFunctions functions);

}  // namespace shardkeep
