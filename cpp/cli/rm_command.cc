// `shardkeep rm CKPT [--force]`: deletes a committed checkpoint so that a
// crash never leaves a half-deleted checkpoint under its name.
#include <iostream>
#include <memory>
#include <string>

#include "cli_support.h"
#include "command.h"
#include "shardkeep/checkpoint_root.h"

namespace shardkeep::cli {
namespace {

int Run(const std::string& url, bool force) {
  Result<Location> location = OpenLocation(url);
  if (!location.ok()) {
    PrintError("rm", url, location.status());
    return kFailed;
  }
  Storage& storage = *location->storage;
  Result<bool> exists = storage.Exists(location->path);
  if (!exists.ok()) {
    PrintError("rm", url, exists.status());
    return kFailed;
  }
  if (!*exists) {
    PrintError("rm", url, NotFoundError("nothing to delete: no such checkpoint"));
    return kFailed;
  }
  if (!force) {
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
    PrintError("rm", url, deleted);
    return kFailed;
  }
  std::cout << "deleted " << location->url << "\n";
  return kOk;
}

}  // namespace

void AddRmCommand(CLI::App& app, int& exit_code) {
  CLI::App* command = app.add_subcommand(
      "rm", "Delete a committed checkpoint (refuses anything without a commit record unless "
            "--force)");
  auto url = std::make_shared<std::string>();
  auto force = std::make_shared<bool>(false);
  command->add_option("CKPT", *url, "The checkpoint: a path or s3://bucket/prefix")->required();
  command->add_flag("--force", *force,
                    "Delete the folder even without a readable commit record (a leftover, a "
                    "damaged checkpoint, or any folder)");
  command->callback([&exit_code, url, force] { exit_code = Run(*url, *force); });
}

}  // namespace shardkeep::cli
