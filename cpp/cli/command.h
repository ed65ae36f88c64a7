// The subcommands of the `shardkeep` tool. Each Add*Command registers one
// subcommand on the app; its callback stores the process's exit code.
#pragma once

#include <CLI/CLI.hpp>

namespace shardkeep::cli {

// Documented in docs/CLI.md.
enum ExitCode : int {
  kOk = 0,
  kProblemsFound = 1,  // verify found damage; rm/gc refused something; diff: they differ
  kUsage = 2,          // bad arguments
  kFailed = 3,         // the operation failed (the message names what)
};

void AddLsCommand(CLI::App& app, int& exit_code);
void AddInfoCommand(CLI::App& app, int& exit_code);
void AddRmCommand(CLI::App& app, int& exit_code);
void AddGcCommand(CLI::App& app, int& exit_code);
void AddVerifyCommand(CLI::App& app, int& exit_code);
void AddCpCommand(CLI::App& app, int& exit_code);
void AddExportCommand(CLI::App& app, int& exit_code);
void AddConvertCommand(CLI::App& app, int& exit_code);
void AddDiffCommand(CLI::App& app, int& exit_code);

}  // namespace shardkeep::cli
