// A lease file: the record a save in flight keeps beside its files so that
// collectors (a manager opening, retention, `shardkeep gc`, the local
// tier) leave them alone. Pure encode/decode, no I/O; the protocol that
// writes, renews and judges leases is engine/lease.h.
//
// A lease is a series of write-once files in the folder it covers,
// `.shardkeep-lease-<sequence as 16 hex digits>`: each renewal creates the
// next one and then deletes the one before, so no reader ever sees a
// lease being rewritten, and a crash at any instant leaves at least one
// whole lease file (or, before the first was written, none).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "shardkeep/checkpoint_root.h"  // kLeaseFilePrefix
#include "shardkeep/status.h"

namespace shardkeep::format {

inline constexpr const char* kLeasePrefix = kLeaseFilePrefix;

// Who holds a lease, and since when it is valid for how long.
struct LeaseRecord {
  // Drawn at random by the holder; the same in every renewal. How a
  // holder knows a lease is still its own.
  std::string owner;
  // Where the holder runs, for messages and for the liveness check of a
  // collector on the same machine: the host name, the boot's id
  // (/proc/sys/kernel/random/boot_id) and the pid namespace, which
  // together say whether `pid` can be looked up here.
  std::string host;
  std::string boot_id;
  std::string pid_namespace;
  int64_t pid = 0;
  // The process's start time in clock ticks since boot (/proc/<pid>/stat),
  // so that a reused pid is not taken for the holder. 0 when unknown.
  uint64_t pid_start = 0;
  uint64_t sequence = 0;
  // The holder's wall clock when it wrote this renewal, and how long the
  // renewal lasts: the holder writes the next one well before then.
  int64_t renewed_ns = 0;
  double duration_s = 0;
};

std::string EncodeLease(const LeaseRecord& lease);

// Corruption naming `file` unless `bytes` is a lease record of this
// format (unknown fields are ignored).
Result<LeaseRecord> DecodeLease(std::string_view bytes, const std::string& file);

// `.shardkeep-lease-` and the sequence as 16 lower-case hex digits.
std::string LeaseFileName(uint64_t sequence);

// The sequence of a lease file's name; nullopt for any other name.
std::optional<uint64_t> LeaseSequenceOf(std::string_view name);

}  // namespace shardkeep::format
