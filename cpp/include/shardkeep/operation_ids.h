// Agreed operation ids: what names a collective operation's keys and
// barriers in the coordinator, so that processes that make different calls
// never wait on each other's keys.
//
// Every collective operation (a save, a manager's first listing, a byte
// exchange, a local-tier restore) is named by what every process passes to
// it identically: its kind and its subject (the checkpoint's path, the
// manager's root, the exchange's name). Its id is agreed in the
// coordinator's key-value store before the operation starts, never counted
// by each process for itself:
//
//  1. The id is shardkeep/op/<kind>/<hash of subject>/<n>.<a>: the n-th
//     occurrence of that kind and subject (a forced re-save of one path is
//     its second), at attempt a. Each attempt has a verdict key, written
//     once: "go" when every process arrived, "void" with the processes
//     that arrived and those that did not otherwise.
//  2. A process skips the attempts that already have a verdict ("go": an
//     occurrence it took part in; "void": one abandoned before it came)
//     and records its arrival at the first undecided one.
//  3. Process 0 waits for every arrival and writes "go"; the others wait
//     for the verdict. A process that reaches its deadline (timeout_s from
//     its call) lists the arrivals and writes "void" (or "go" if everyone
//     is there after all); the first verdict written holds for everyone.
//  4. "go": the operation runs under that id, which no other operation
//     uses. "void": a process that had arrived fails with Timeout naming
//     the operation and the processes that did not join; one that arrived
//     after the verdict moves on to the next attempt, within its deadline.
//
// So a call that some processes make and others do not fails within its
// timeout on the processes that made it, and no count moves: the next
// operation that every process makes agrees at once. No barrier key is ever
// used twice. Each OperationIds records how far it has seen the verdicts of
// each kind and subject; once every process has read a "go", the verdict
// and the arrivals are deleted (KeyValueDelete), so a long job does not grow
// the store by keys per operation, and that record is what lets a process
// skip the occurrence. "void" verdicts stay: a process that has not come
// yet needs one to skip its attempt.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "shardkeep/coordinator.h"
#include "shardkeep/status.h"

namespace shardkeep {

// One per process and coordinator (the record of seen verdicts belongs to
// the job: a new coordination service starts a new OperationIds).
// Thread-safe; concurrent calls for one kind and subject are not meant
// (they would be two operations that every process orders alike).
class OperationIds {
 public:
  explicit OperationIds(std::shared_ptr<Coordinator> coordinator);

  // The agreed id of this process's next collective `kind` of `subject`;
  // "" in a single-process job (nothing to agree with). Timeout naming the
  // operation and the processes that did not join when they do not all
  // make this call within `timeout_s` seconds; the coordinator's error when
  // it fails otherwise (Cancelled for an interrupted wait).
  Result<std::string> Agree(const std::string& kind, const std::string& subject,
                            double timeout_s);

  const std::shared_ptr<Coordinator>& coordinator() const { return coordinator_; }

 private:
  // (occurrence, attempt): the first attempt this process has not decided.
  using Position = std::pair<int64_t, int64_t>;

  Position Seen(const std::string& base);
  void Note(const std::string& base, Position position);

  const std::shared_ptr<Coordinator> coordinator_;
  std::mutex mu_;
  std::map<std::string, Position> seen_;  // by shardkeep/op/<kind>/<hash>
};

}  // namespace shardkeep
