#include "engine/checked_read.h"

namespace shardkeep::internal {
namespace {

// The failure of a second read: the bytes are damaged where they are
// stored, not on the way.
Status ReadTwice(const Status& status, const std::string& file, uint64_t offset,
                 uint64_t length) {
  return Status(status.code(),
                status.message() + " (read twice, bytes [" + std::to_string(offset) + ", " +
                    std::to_string(offset + length) + ") of " + file +
                    ": the stored object is damaged, not the transfer)");
}

}  // namespace

bool WorthRereading(const Storage& storage, const Status& check) {
  return check.code() == StatusCode::kCorruption && storage.features().remote;
}

Result<CheckedBytes> ReadAllChecked(Storage& storage, const std::string& file,
                                    const std::function<Status(const std::string&)>& check) {
  CheckedBytes read;
  SK_ASSIGN_OR_RETURN(read.bytes, storage.ReadAll(file));
  read.check = check(read.bytes);
  if (!WorthRereading(storage, read.check)) return read;
  SK_ASSIGN_OR_RETURN(read.bytes, storage.ReadAll(file));
  read.check = check(read.bytes);
  if (!read.check.ok()) read.check = ReadTwice(read.check, file, 0, read.bytes.size());
  return read;
}

Status RereadAfterFailedCheck(Storage& storage, const Status& failed,
                              const std::string& file, uint64_t offset, uint64_t length,
                              uint8_t* dst, const std::function<Status()>& check) {
  if (failed.ok() || !WorthRereading(storage, failed)) return failed;
  SK_RETURN_IF_ERROR(storage.ReadAt(file, offset, length, dst));
  const Status second = check();
  if (!second.ok()) return ReadTwice(second, file, offset, length);
  return second;
}

}  // namespace shardkeep::internal
