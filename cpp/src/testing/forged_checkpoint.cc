#include "testing/forged_checkpoint.h"

#include "format/checkpointable_meta.h"
#include "format/commit_record.h"

namespace shardkeep::testdata {

Status RelistCheckpointFiles(Storage& storage, const std::string& path) {
  const std::string record_file = path + "/" + format::kCommitFileName;
  SK_ASSIGN_OR_RETURN(std::string bytes, storage.ReadAll(record_file));
  SK_ASSIGN_OR_RETURN(format::CommitRecord record,
                      format::DecodeCommitRecord(bytes, record_file));
  const std::string root = record.data_folder ? path + "/" + *record.data_folder : path;
  for (format::CheckpointableEntry& entry : record.checkpointables) {
    const std::string folder = root + "/" + entry.name;
    SK_ASSIGN_OR_RETURN(std::string meta, storage.ReadAll(folder + "/" + format::kMetaFileName));
    std::string value;
    if (entry.kind != "pytree") {
      SK_ASSIGN_OR_RETURN(value, storage.ReadAll(folder + "/" + (entry.kind == "json"
                                                                     ? "value.json"
                                                                     : "value.bin")));
    }
    entry = format::ListCheckpointable(entry.name, entry.kind, meta, value);
  }
  return storage.WriteAll(record_file, format::EncodeCommitRecord(record), false);
}

}  // namespace shardkeep::testdata
