// `shardkeep`: look into, check, copy, export and clean up checkpoints from
// a shell, without Python or JAX. Every command takes local paths and
// s3:// URLs (see docs/CLI.md).
#include <CLI/CLI.hpp>

#include "command.h"

int main(int argc, char** argv) {
  CLI::App app{"shardkeep: inspect, verify, compare, copy, export and clean up checkpoints"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "shardkeep 0.1.0");
  int exit_code = shardkeep::cli::kOk;
  shardkeep::cli::AddLsCommand(app, exit_code);
  shardkeep::cli::AddInfoCommand(app, exit_code);
  shardkeep::cli::AddVerifyCommand(app, exit_code);
  shardkeep::cli::AddCpCommand(app, exit_code);
  shardkeep::cli::AddRmCommand(app, exit_code);
  shardkeep::cli::AddGcCommand(app, exit_code);
  shardkeep::cli::AddExportCommand(app, exit_code);
  shardkeep::cli::AddConvertCommand(app, exit_code);
  shardkeep::cli::AddDiffCommand(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return shardkeep::cli::kUsage;
  }
  return exit_code;
}
