// Storage faults armed for a whole process, for failure and crash tests of
// programs that reach storage through URLs (the Python front, whose binding
// resolves every path with ResolveStorage). A test arms a plan; from then on
// every storage the binding resolves is wrapped in a FaultInjectionStorage
// that follows the plan. A process that never arms a plan gets its storage
// unwrapped, so the production path pays one atomic load.
//
// The crash torture (scripts/torture.sh) arms "SIGKILL at the k-th Rename"
// and the like in its writer process; Python tests arm injected failures.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardkeep/status.h"
#include "shardkeep/storage.h"

namespace shardkeep {

struct FaultRule {
  enum class Action {
    kFail,        // the call returns a StorageError instead of running
    kKill,        // SIGKILL before the call runs
    kKillDuring,  // SIGKILL after a random delay while the call runs
  };
  // A Storage or WritableFile method name ("Rename", "Append", ...; see
  // FaultInjectionStorage), or "*" for every call.
  std::string op = "*";
  // Searched (ECMAScript syntax) in the call's path; empty matches any.
  std::string path_regex;
  // The rule acts on the `nth` matching call counted from arming (1-based)
  // and on the `times - 1` matching calls after it; times < 0: on every
  // matching call from the nth on.
  int64_t nth = 1;
  int64_t times = 1;
  Action action = Action::kFail;
  int64_t max_delay_us = 0;  // kKillDuring: the delay is in [0, max_delay_us]
};

// Replaces the plan (an invalid regex is InvalidArgument and arms nothing);
// counts start again from zero. Before killing, a line naming the call is
// written to stderr.
Status ArmProcessFaults(std::vector<FaultRule> rules);
// Empties the plan; storages already wrapped let every call through.
void DisarmProcessFaults();
// Calls per operation since the plan was last armed.
std::map<std::string, int64_t> ProcessFaultCounts();

// `storage` itself while no plan was ever armed in this process, else a
// wrapper that follows the plan in force at each call.
std::shared_ptr<Storage> WithProcessFaults(std::shared_ptr<Storage> storage);

}  // namespace shardkeep
