// `shardkeep cp SRC DST`: copies a committed checkpoint between storage
// backends (CopyCheckpoint), checking chunk checksums on the way and
// committing at DST as a save would. Exit codes: 0 copied, 3 failed or
// refused (DST occupied without --force); nothing is left at DST then.
#include <chrono>
#include <iostream>

#include "command.h"
#include "progress.h"
#include "shardkeep/copy_checkpoint.h"

namespace shardkeep::cli {
namespace {

struct CpArgs {
  std::string source;
  std::string destination;
  bool force = false;
  int threads = 0;
};

int RunCp(const CpArgs& args) {
  Result<StorageLocation> from = ResolveStorage(args.source);
  Result<StorageLocation> to =
      from.ok() ? ResolveStorage(args.destination) : from;
  if (!to.ok()) {
    std::cerr << "shardkeep cp: " << to.status().ToString() << "\n";
    return kFailed;
  }
  const auto start = std::chrono::steady_clock::now();
  ProgressBar bar("cp");
  CopyOptions options;
  options.force = args.force;
  options.threads = args.threads;
  options.progress = bar.Callback();
  Result<CopyReport> report =
      CopyCheckpoint(from->storage, from->path, to->storage, to->path, options);
  bar.Finish();
  if (!report.ok()) {
    std::cerr << "shardkeep cp: " << args.source << " -> " << args.destination << ": "
              << report.status().ToString() << "\n";
    return kFailed;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char elapsed[32];
  std::snprintf(elapsed, sizeof(elapsed), "%.1f s", seconds);
  std::cout << "copied " << args.source << " to " << args.destination << ": "
            << report->files << " files, " << report->bytes << " bytes, "
            << report->chunks_verified << " chunk checksums checked, in " << elapsed << "\n";
  return kOk;
}

}  // namespace

void AddCpCommand(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<CpArgs>();
  CLI::App* command = app.add_subcommand(
      "cp",
      "Copy a committed checkpoint to another path or storage (local paths, s3:// URLs), "
      "in parallel, checking every chunk's checksum on the way and committing at the "
      "destination as a save does.");
  command->add_option("source", args->source, "checkpoint path or s3:// URL")->required();
  command->add_option("destination", args->destination,
                      "where the copy goes (path or s3:// URL); must not exist")
      ->required();
  command->add_flag("--force", args->force,
                    "replace a checkpoint (or anything else) at the destination");
  command->add_option("--threads", args->threads,
                      "files copied at once (default: one per core, more on S3)")
      ->check(CLI::NonNegativeNumber);
  command->callback([args, &exit_code] { exit_code = RunCp(*args); });
}

}  // namespace shardkeep::cli
