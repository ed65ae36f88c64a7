// Placeholders for the subcommands still being written: each is removed
// from here when its own file lands.
#include <iostream>

#include "command.h"

namespace shardkeep::cli {
namespace {

void AddPlaceholder(CLI::App& app, int& exit_code, const char* name) {
  CLI::App* command = app.add_subcommand(name, "(not built yet)");
  command->allow_extras();
  command->callback([&exit_code, name] {
    std::cerr << "shardkeep " << name << ": not built yet\n";
    exit_code = kFailed;
  });
}

}  // namespace

void AddLsCommand(CLI::App& app, int& exit_code) { AddPlaceholder(app, exit_code, "ls"); }
void AddInfoCommand(CLI::App& app, int& exit_code) { AddPlaceholder(app, exit_code, "info"); }
void AddRmCommand(CLI::App& app, int& exit_code) { AddPlaceholder(app, exit_code, "rm"); }
void AddGcCommand(CLI::App& app, int& exit_code) { AddPlaceholder(app, exit_code, "gc"); }

}  // namespace shardkeep::cli
