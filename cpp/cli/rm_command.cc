// `shardkeep rm CKPT [--force]`: deletes a committed checkpoint so that a
// crash never leaves a half-deleted checkpoint under its name.
#include <iostream>
#include <string>

#include "cli_support.h"
#include "command.h"
#include "shardkeep/checkpoint_root.h"

namespace shardkeep::cli {

int RunRm(const RmArgs& args) {
  Result<OpenedLocation> location = OpenLocation(args.url);
  if (!location.ok()) {
    PrintError("rm", args.url, location.status());
    return kFailed;
  }
  Storage& storage = *location->storage;
  Result<bool> exists = storage.Exists(location->path);
  if (!exists.ok()) {
    PrintError("rm", args.url, exists.status());
    return kFailed;
  }
  if (!*exists) {
    PrintError("rm", args.url, NotFoundError("nothing to delete: no such checkpoint"));
    return kFailed;
  }
  if (!args.force) {
    // Only a checkpoint a reader would open goes without --force: not a
    // root of checkpoints, someone's folder, or a record this build cannot
    // read (perhaps written by a newer version).
    Result<std::string> record = ReadCommitRecord(storage, location->path);
    if (!record.ok()) {
      const std::string why = record.status().code() == StatusCode::kNotFound
                                  ? "refusing to delete: not a checkpoint (no commit record "
                                    "_SHARDKEEP); --force deletes it anyway"
                                  : "refusing to delete: its commit record is not accepted (" +
                                        record.status().ToString() +
                                        "); --force deletes it anyway";
      std::cerr << "shardkeep rm: " << location->url << ": " << why << "\n";
      return kProblemsFound;
    }
  }
  Status deleted = DeleteCheckpoint(storage, location->path);
  if (!deleted.ok()) {
    PrintError("rm", args.url, deleted);
    return kFailed;
  }
  std::cout << "deleted " << location->url << "\n";
  return kOk;
}

}  // namespace shardkeep::cli
