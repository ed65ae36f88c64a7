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

}  // namespace shardkeep::cli
