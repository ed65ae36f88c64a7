// `shardkeep convert SRC DST [--from orbax|dcp|safetensors] [--allow-pickle]`:
// writes a shardkeep checkpoint from another format's (found from its files
// by the Python converter when --from is not given). Orbax checkpoints
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

}  // namespace

int RunConvert(const ConvertArgs& args) {
  const std::string python = EnvironmentPython();
  if (python.empty()) {
    std::cerr << "shardkeep convert: no Python interpreter beside this program: convert "
                 "runs shardkeep's Python package (Orbax is read with tensorstore, DCP with "
                 "torch); use the shardkeep installed by `pip install shardkeep`\n";
    return kFailed;
  }
  std::vector<std::string> command = {python, "-m", "shardkeep.interop.convert_command",
                                      args.src, args.dst};
  if (!args.from.empty()) {
    command.push_back("--from");
    command.push_back(args.from);
  }
  if (args.allow_pickle) command.push_back("--allow-pickle");
  if (args.step >= 0) {
    command.push_back("--step");
    command.push_back(std::to_string(args.step));
  }
  std::vector<char*> argv;
  for (std::string& arg : command) argv.push_back(arg.data());
  argv.push_back(nullptr);
  execv(python.c_str(), argv.data());
  std::cerr << "shardkeep convert: cannot run " << python << "\n";
  return kFailed;
}

}  // namespace shardkeep::cli
