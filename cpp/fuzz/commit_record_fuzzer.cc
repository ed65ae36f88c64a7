// Fuzzes DecodeCommitRecord. A record that decodes must encode to a
// document that decodes to the same record. Each input's own checksum is
// sealed first (a mutated record would almost never match it), so that
// mutations reach the decoder behind it; the unit tests cover mismatches.
#include <cstdint>
#include <string>

#include "format/commit_record.h"
#include "fuzz_check.h"

using shardkeep::format::CommitRecord;

namespace {

bool Same(const CommitRecord& a, const CommitRecord& b) {
  if (a.checkpointables.size() != b.checkpointables.size()) return false;
  for (size_t i = 0; i < a.checkpointables.size(); ++i) {
    if (a.checkpointables[i].name != b.checkpointables[i].name ||
        a.checkpointables[i].kind != b.checkpointables[i].kind ||
        a.checkpointables[i].meta_checksum != b.checkpointables[i].meta_checksum ||
        a.checkpointables[i].value_checksum != b.checkpointables[i].value_checksum) {
      return false;
    }
  }
  return a.version == b.version && a.step == b.step &&
         a.created_ns == b.created_ns && a.committed_ns == b.committed_ns &&
         a.process_count == b.process_count && a.data_folder == b.data_folder &&
         a.index_files == b.index_files &&
         a.custom_metadata == b.custom_metadata && a.metrics == b.metrics;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  shardkeep::format::SealCommitRecord(bytes);
  auto record = shardkeep::format::DecodeCommitRecord(bytes, "_SHARDKEEP");
  if (!record.ok()) return 0;
  auto again = shardkeep::format::DecodeCommitRecord(
      shardkeep::format::EncodeCommitRecord(*record), "_SHARDKEEP");
  SK_FUZZ_CHECK(again.ok());
  SK_FUZZ_CHECK(Same(*record, *again));
  return 0;
}
