// Leases: how a save in flight keeps collectors away from its files.
//
// A save (or a copy) writes into a folder that looks exactly like a
// leftover until it commits: <path>.shardkeep-tmp on storage that renames,
// a generation folder <path>/.shardkeep-g<id> on object stores. Several
// jobs may share a root (an evaluation job polling it, a restarted job
// while the old one finishes, an operator's `shardkeep gc`), so whether a
// folder is garbage is a question about other processes. The protocol:
//
//  1. The committing process creates the folder's first lease file
//     (format/lease.h) before it writes anything else there: on object
//     stores the generation then never exists without its lease.
//  2. A thread renews it every LeaseTiming::renew_every_s: it lists the
//     folder, checks that the newest lease file is still its own, writes
//     the next one and deletes the one before. A renewal that finds its
//     lease gone or replaced marks the lease lost.
//  3. Collectors (checkpoint_root.h: RemoveLeftover, CollectLeftovers,
//     DeleteCheckpoint; the commit target's preparation) read the newest
//     lease of a folder before deleting it and keep the folder while the
//     lease is live (JudgeLease).
//  4. Just before its commit point the holder checks that the lease is
//     still its own and was renewed within its duration by its own
//     monotonic clock (LeaseHolder::Check), and that its folder still holds
//     the files it commits; a save whose lease was lost fails with
//     LeaseLost and commits nothing.
//  5. After the commit (or after a failure has discarded the folder) the
//     holder stops renewing and deletes its lease files. A crash leaves
//     the lease behind, and it expires.
//
// Clocks: a lease carries the holder's wall clock at its last renewal.
// Another machine judges it expired only once its own clock is past that
// time by the lease's duration plus LeaseTiming::clock_allowance_s, so
// the two clocks need to agree within that allowance (minutes), not to
// the second. The holder never trusts the wall clock about its own lease:
// it counts the time since its last successful renewal on its monotonic
// clock. A collector on the holder's own machine (same boot, same pid
// namespace) needs no clock at all: the lease is expired as soon as its
// holder's process is gone.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "format/lease.h"
#include "shardkeep/status.h"
#include "shardkeep/storage.h"

namespace shardkeep::internal {

struct LeaseTiming {
  double duration_s = 30;
  double renew_every_s = 10;
  double clock_allowance_s = 120;
};

// This process, as a lease names its holder (owner and sequence unset).
format::LeaseRecord ThisProcess();

enum class LeaseVerdict {
  kNone,     // the folder holds no readable lease
  kLive,     // a collector must keep the folder
  kExpired,  // the holder is gone or stopped renewing: collectable
};

struct LeaseView {
  LeaseVerdict verdict = LeaseVerdict::kNone;
  std::optional<format::LeaseRecord> newest;
  // Who holds it and why it counts as live or expired, for messages
  // ("held by pid 12 on host a, renewed 3 s ago").
  std::string description;
};

// Whether `lease` still protects its folder at wall-clock time `now_ns`,
// judged by a collector running as `judge` (ThisProcess() outside tests).
LeaseView JudgeLease(const format::LeaseRecord& lease, int64_t now_ns,
                     const format::LeaseRecord& judge, double clock_allowance_s);

// The newest decodable lease file in `folder`, judged now by this process.
// A folder that does not exist, or holds no decodable lease file, has
// kNone. An undecodable lease file is skipped: a crash while writing one
// leaves the previous one in place (format/lease.h). I/O errors return.
Result<LeaseView> ReadLease(Storage& storage, const std::string& folder,
                            const LeaseTiming& timing = {});

// The lease of one folder, held by this process: created by Acquire,
// renewed by a thread of its own until Release or destruction (which
// joins it). Holds `storage` by reference: it must outlive the holder.
class LeaseHolder {
 public:
  // Writes the first lease file into `folder` and starts renewing.
  static Result<std::unique_ptr<LeaseHolder>> Acquire(Storage& storage, std::string folder,
                                                      const LeaseTiming& timing = {});
  ~LeaseHolder();
  LeaseHolder(const LeaseHolder&) = delete;
  LeaseHolder& operator=(const LeaseHolder&) = delete;

  // OK while the newest lease file in the folder is this holder's and it
  // was renewed within its duration; LeaseLost saying what happened
  // otherwise. Reads the folder's leases.
  Status Check();
  // Stops renewing and deletes this holder's lease file (best effort),
  // which now lies in `folder_now` (the folder it was acquired in, or
  // where that folder was renamed to).
  void Release(const std::string& folder_now);
  // Stops renewing and leaves the lease file, for a caller about to delete
  // the whole folder (which must not find a renewal writing into it). The
  // lease counts as unheld from then on (see JudgeLease).
  void StopRenewing();

 private:
  LeaseHolder(Storage& storage, std::string folder, const LeaseTiming& timing);
  Status WriteNext();   // REQUIRES: mu_ held
  void RenewLoop();

  Storage& storage_;
  const std::string folder_;
  const LeaseTiming timing_;
  format::LeaseRecord record_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  Status lost_;  // set once the lease is found lost
  std::chrono::steady_clock::time_point renewed_at_;
  std::thread renewer_;
};

}  // namespace shardkeep::internal
