// Reads whose bytes a checksum or decoder checks, read once more when the
// check fails on remote storage (StorageFeatures::remote): there a
// transfer can damage bytes that are intact in the store, and a second
// read tells the two apart. The one rule for every reader of checkpoint
// files (the restore pipeline, the verifier, copies).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "shardkeep/status.h"
#include "shardkeep/storage.h"

namespace shardkeep::internal {

// What `check` said of bytes read from `storage`, when a second read
// cannot help: anything but Corruption, or local storage.
bool WorthRereading(const Storage& storage, const Status& check);

// The bytes of a file and `check`'s verdict on them.
struct CheckedBytes {
  std::string bytes;
  Status check;
};

// Reads `file` whole and applies `check` (a checksum test or decoder) to
// its bytes. A Corruption from `check` on remote storage reads the file
// again and checks that; a failure that persists says so (the stored
// object is damaged, from byte 0 for its whole size). An error of a read
// itself is the Result's; a refusal by `check` is CheckedBytes::check.
Result<CheckedBytes> ReadAllChecked(Storage& storage, const std::string& file,
                                    const std::function<Status(const std::string&)>& check);

// After `check` failed with `failed` on the `length` bytes at `offset` of
// `file` held at `dst`: on remote storage reads them into `dst` again and
// returns `check`'s verdict on the new bytes, marked as a second read;
// otherwise returns `failed`.
Status RereadAfterFailedCheck(Storage& storage, const Status& failed,
                              const std::string& file, uint64_t offset, uint64_t length,
                              uint8_t* dst, const std::function<Status()>& check);

}  // namespace shardkeep::internal
