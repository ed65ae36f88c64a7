// `shardkeep convert SRC DST --from orbax|dcp|safetensors [--allow-pickle]`:
// writes a shardkeep checkpoint from another format's. Orbax checkpoints
// are read with tensorstore and DCP ones with torch, both Python
// libraries, so the conversion runs in the Python package this program was
// installed with (`python -m shardkeep.interop.convert_command`, with the
// environment's interpreter); this command only finds that interpreter and
// hands over its arguments.
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "command.h"

namespace shardkeep::cli {
namespace {

// The Python interpreter of the environment this program is installed in,
// or "" when there is none (a C++-only installation): the one beside this
// program (CMake's install into an environment's bin folder), else the one
// the Python package's launcher names (pip's install keeps this program
// inside the package and starts it from python/scripts/shardkeep).
std::string EnvironmentPython() {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    std::string bin(self, static_cast<size_t>(n));
    bin = bin.substr(0, bin.rfind('/'));
    for (const char* name : {"/python3", "/python"}) {
      if (access((bin + name).c_str(), X_OK) == 0) return bin + name;
    }
  }
  const char* launcher_python = std::getenv("SHARDKEEP_CLI_PYTHON");
  if (launcher_python != nullptr && access(launcher_python, X_OK) == 0) return launcher_python;
  return "";
}

// `step` < 0: none given (the source's own step, if it records one).
int Run(const std::string& src, const std::string& dst, const std::string& from,
        bool allow_pickle, int64_t step) {
  const std::string python = EnvironmentPython();
  if (python.empty()) {
    std::cerr << "shardkeep convert: no Python interpreter beside this program: convert "
                 "runs shardkeep's Python package (Orbax is read with tensorstore, DCP with "
                 "torch); use the shardkeep installed by `pip install shardkeep`\n";
    return kFailed;
  }
  std::vector<std::string> args = {python, "-m", "shardkeep.interop.convert_command", src, dst,
                                   "--from", from};
  if (allow_pickle) args.push_back("--allow-pickle");
  if (step >= 0) {
    args.push_back("--step");
    args.push_back(std::to_string(step));
  }
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  execv(python.c_str(), argv.data());
  std::cerr << "shardkeep convert: cannot run " << python << "\n";
  return kFailed;
}

}  // namespace

void AddConvertCommand(CLI::App& app, int& exit_code) {
  CLI::App* command = app.add_subcommand(
      "convert", "Write a shardkeep checkpoint from an Orbax, PyTorch DCP or safetensors one "
                 "(runs shardkeep's Python package)");
  auto src = std::make_shared<std::string>();
  auto dst = std::make_shared<std::string>();
  auto from = std::make_shared<std::string>();
  auto allow_pickle = std::make_shared<bool>(false);
  auto step = std::make_shared<int64_t>(-1);
  command->add_option("SRC", *src, "The checkpoint to convert (path or s3:// URL)")->required();
  command->add_option("DST", *dst, "Where to write the shardkeep checkpoint")->required();
  command->add_option("--from", *from, "The source's format")
      ->required()
      ->check(CLI::IsMember({"orbax", "dcp", "safetensors"}));
  command->add_flag("--allow-pickle", *allow_pickle,
                    "DCP only: unpickle its metadata file (run code from the checkpoint: "
                    "only for checkpoints you trust)");
  command->add_option("--step", *step,
                      "The step to record in the checkpoint (default: the Orbax step "
                      "folder's number, when there is one)")
      ->check(CLI::NonNegativeNumber);
  command->callback(
      [=, &exit_code] { exit_code = Run(*src, *dst, *from, *allow_pickle, *step); });
}

}  // namespace shardkeep::cli
