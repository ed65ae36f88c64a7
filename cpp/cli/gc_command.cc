// `shardkeep gc ROOT [--older-than DURATION] [--dry-run]`: removes the
// leftovers of failed saves under a root, never a committed checkpoint.
//
// A save under way looks exactly like a leftover (its temporary or
// generation folder has no commit record yet). What tells them apart is
// time: a running save keeps writing files, so by default gc removes only
// leftovers in which nothing was written for an hour. Where the storage
// does not report modification times (object stores, through the Storage
// interface) no age is known and only `--older-than 0` removes leftovers:
// the caller then vouches that no save is writing under the root.
#include <iostream>
#include <map>
#include <memory>
#include <string>

#include "cli_support.h"
#include "command.h"
#include "root_survey.h"
#include "shardkeep/checkpoint_root.h"

namespace shardkeep::cli {
namespace {

constexpr double kDefaultMinAgeS = 3600;

struct GcOptions {
  std::string url;
  double min_age_s = kDefaultMinAgeS;
  bool dry_run = false;
};

int Run(const GcOptions& options) {
  Result<Location> root = OpenLocation(options.url);
  if (!root.ok()) {
    PrintError("gc", options.url, root.status());
    return kFailed;
  }
  Result<std::vector<SurveyedEntry>> entries = SurveyRoot(*root);
  if (!entries.ok()) {
    PrintError("gc", options.url, entries.status());
    return kFailed;
  }
  const int64_t now = NowNs();
  int exit_code = kOk;
  uint64_t removed = 0, removed_bytes = 0, kept = 0;
  const char* verb = options.dry_run ? "would remove" : "removed";
  for (const SurveyedEntry& s : *entries) {
    const std::string state = EntryStateName(s.entry.state);
    if (s.entry.state == EntryState::kRejected) {
      ++kept;
      std::cout << "kept " << s.url << " (rejected: " << s.entry.problem.ToString()
                << "): not a leftover, it may be a newer version's checkpoint; "
                << "`shardkeep rm --force` deletes it\n";
      continue;
    }
    if (!IsLeftover(s.entry.state)) continue;
    if (options.min_age_s > 0) {
      if (!s.modified_ns) {
        ++kept;
        std::cout << "kept " << s.url << " (" << state
                  << "): its age is unknown on this storage; --older-than 0 removes it, "
                  << "when no save is writing under " << root->url << "\n";
        continue;
      }
      const double age_s = (now - *s.modified_ns) / 1e9;
      if (age_s < options.min_age_s) {
        ++kept;
        std::cout << "kept " << s.url << " (" << state << "): last written "
                  << HumanDuration(age_s) << " ago, newer than --older-than "
                  << HumanDuration(options.min_age_s) << " (a save may still be writing it)\n";
        continue;
      }
    }
    const uint64_t bytes = s.usage ? s.usage->bytes : 0;
    if (!options.dry_run) {
      Status status = RemoveLeftover(*root->storage, root->path + "/" + s.entry.name);
      if (!status.ok()) {
        PrintError("gc", s.url, status);
        exit_code = kFailed;
        continue;
      }
    }
    ++removed;
    removed_bytes += bytes;
    std::cout << verb << " " << s.url << " (" << state << ", " << HumanBytes(bytes) << ")\n";
  }
  std::cout << verb << " " << removed << " leftover" << (removed == 1 ? "" : "s") << ", "
            << HumanBytes(removed_bytes) << "; kept " << kept << "\n";
  return exit_code;
}

}  // namespace

void AddGcCommand(CLI::App& app, int& exit_code) {
  CLI::App* command = app.add_subcommand(
      "gc", "Remove the leftovers of failed saves under a root (temporary, replaced, "
            "being-deleted and unfinished folders); never a committed checkpoint");
  auto options = std::make_shared<GcOptions>();
  command->add_option("ROOT", options->url, "Folder holding checkpoints: a path or "
                                            "s3://bucket/prefix")
      ->required();
  const std::map<std::string, double> units{
      {"s", 1}, {"m", 60}, {"h", 3600}, {"d", 86400}, {"w", 604800}};
  command
      ->add_option("--older-than", options->min_age_s,
                   "Remove only leftovers in which nothing was written for this long (30m, "
                   "2h, 7d; default 1h), so that a save still writing is left alone. 0 "
                   "removes every leftover: only when no save is writing under ROOT")
      ->transform(CLI::AsNumberWithUnit(units, CLI::AsNumberWithUnit::CASE_SENSITIVE,
                                        "DURATION"))
      ->check(CLI::NonNegativeNumber)
      ->type_name("DURATION");
  command->add_flag("--dry-run", options->dry_run, "Report what would be removed; remove nothing");
  command->callback([&exit_code, options] { exit_code = Run(*options); });
}

}  // namespace shardkeep::cli
