// An in-process group of N simulated processes, for testing code that
// coordinates through a Coordinator (the commit protocol above all). Each
// member is one process's Coordinator; tests run each "process" on its own
// thread and may kill one to see how the others cope.
//
//   SimulatedGroup group(4);
//   std::vector<std::thread> processes;
//   for (int p = 0; p < 4; ++p) {
//     processes.emplace_back([&, p] { Save(storage, group.Member(p), ...); });
//   }
//
// Semantics, those of a coordination service that enforces deadlines for
// the whole group (the key-value store behaves like JAX's):
//  - Barrier(key) returns OK once every member has called it with `key`.
//    When the first waiting member's timeout expires the barrier fails for
//    the whole group: every member waiting on it, and every member that
//    arrives later, gets the same TimeoutError naming the key and the
//    members that did not arrive. A completed key is spent: calling
//    Barrier with it again is InvalidArgument (keys are unique per
//    operation), as is a member arriving twice.
//  - The key-value store is shared by the group. A key is set once:
//    setting it again is AlreadyExists. KeyValueGet waits for the key, at
//    most its timeout. KeyValueList lists the keys under a prefix;
//    KeyValueDelete removes a key (so it may be set again).
//  - Kill(i) makes member i a dead process: every later call of member i
//    returns Cancelled, a call it is blocked in returns Cancelled at once,
//    and it never counts as arrived at a barrier that has not completed.
//
// Thread-safe: members may be called from any number of threads. Waits
// block on a condition variable of the barrier or key waited for, never
// spin; a barrier of n members costs O(n) in all, so groups of a thousand
// simulated processes stay cheap.
#pragma once

#include <memory>
#include <vector>

#include "shardkeep/coordinator.h"

namespace shardkeep {

class SimulatedGroup {
 public:
  // REQUIRES: process_count >= 1.
  explicit SimulatedGroup(int process_count);
  ~SimulatedGroup();
  SimulatedGroup(const SimulatedGroup&) = delete;
  SimulatedGroup& operator=(const SimulatedGroup&) = delete;

  int process_count() const;

  // Process i's coordinator: process_index() == i. The same object on
  // every call; it shares the group's state and may outlive the group.
  // REQUIRES: 0 <= i < process_count().
  std::shared_ptr<Coordinator> Member(int i) const;

  // Makes process i dead from now on (see above). Idempotent.
  // REQUIRES: 0 <= i < process_count().
  void Kill(int i);

  // The number of keys set in the key-value store now.
  size_t KeyCount() const;

  class State;

 private:
  const std::shared_ptr<State> state_;
  std::vector<std::shared_ptr<Coordinator>> members_;
};

}  // namespace shardkeep
