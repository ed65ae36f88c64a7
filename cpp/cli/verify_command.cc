// `shardkeep verify CKPT`: checks a committed checkpoint completely
// (VerifyCheckpoint) and lists every problem found. Exit codes: 0 intact,
// 1 problems found, 3 the checkpoint could not be opened or read.
#include <chrono>
#include <iostream>

#include <nlohmann/json.hpp>

#include "command.h"
#include "other_formats.h"
#include "progress.h"
#include "shardkeep/verify.h"

namespace shardkeep::cli {
namespace {

nlohmann::json ProblemJson(const VerifyProblem& problem) {
  nlohmann::json out = {{"file", problem.file},
                        {"checkpointable", problem.checkpointable},
                        {"leaf", problem.leaf},
                        {"offset", nullptr},
                        {"message", problem.message}};
  if (problem.offset) out["offset"] = *problem.offset;
  return out;
}

void PrintText(const std::string& checkpoint, const VerifyReport& report, double seconds) {
  char elapsed[32];
  std::snprintf(elapsed, sizeof(elapsed), "%.1f s", seconds);
  const std::string checked = std::to_string(report.chunks_checked) + " chunks (" +
                              std::to_string(report.bytes_checked) + " bytes) read in " +
                              elapsed;
  if (report.ok()) {
    std::cout << checkpoint << ": intact; " << checked << "\n";
    return;
  }
  std::cout << checkpoint << ": " << report.problems.size()
            << (report.problems.size() == 1 ? " problem" : " problems") << "; " << checked
            << "\n";
  for (const VerifyProblem& problem : report.problems) {
    std::cout << "\n  file:   " << problem.file << "\n";
    if (!problem.leaf.empty()) {
      std::cout << "  leaf:   " << problem.leaf << " (of " << problem.checkpointable << ")\n";
    }
    if (problem.offset) std::cout << "  offset: " << *problem.offset << "\n";
    std::cout << "  " << problem.message << "\n";
  }
}

}  // namespace

int RunVerify(const VerifyArgs& args) {
  Result<StorageLocation> location = ResolveStorage(args.checkpoint);
  if (!location.ok()) {
    std::cerr << "shardkeep verify: " << location.status().ToString() << "\n";
    return kFailed;
  }
  const auto start = std::chrono::steady_clock::now();
  ProgressBar bar("verify");
  VerifyOptions options;
  options.threads = args.threads;
  options.progress = bar.Callback();
  Result<VerifyReport> report =
      VerifyCheckpoint(location->storage, location->path, options);
  bar.Finish();
  if (!report.ok()) {
    if (ExplainOtherFormat("verify", args.checkpoint)) return kFailed;
    std::cerr << "shardkeep verify: cannot verify " << args.checkpoint << ": "
              << report.status().ToString() << "\n";
    return kFailed;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (args.json) {
    nlohmann::json out = {{"checkpoint", args.checkpoint},
                          {"ok", report->ok()},
                          {"chunks_checked", report->chunks_checked},
                          {"bytes_checked", report->bytes_checked},
                          {"problems", nlohmann::json::array()}};
    for (const VerifyProblem& problem : report->problems) {
      out["problems"].push_back(ProblemJson(problem));
    }
    std::cout << out.dump(2) << "\n";
  } else {
    PrintText(args.checkpoint, *report, seconds);
  }
  return report->ok() ? kOk : kProblemsFound;
}

}  // namespace shardkeep::cli
