// The subcommands of the `shardkeep` tool: each one's arguments, as parsed,
// and the function that runs it and returns the process's exit code. The
// command line itself (names, help texts, checks) is registered in one
// file, command_line.cc: CLI11 is header-only and costs seconds to compile
// in every file that uses it.
#pragma once

#include <cstdint>
#include <string>

namespace shardkeep::cli {

// Documented in docs/CLI.md.
enum ExitCode : int {
  kOk = 0,
  kProblemsFound = 1,  // verify found damage; rm/gc refused something; diff: they differ
  kUsage = 2,          // bad arguments
  kFailed = 3,         // the operation failed (the message names what)
};

struct LsArgs {
  std::string url;  // a root of checkpoints
  bool json = false;
};
int RunLs(const LsArgs& args);

struct InfoArgs {
  std::string url;  // a checkpoint
  std::string checkpointable;  // empty: all of them
  bool json = false;
};
int RunInfo(const InfoArgs& args);

struct VerifyArgs {
  std::string checkpoint;
  bool json = false;
  int threads = 0;  // 0: the default for the storage
};
int RunVerify(const VerifyArgs& args);

struct CpArgs {
  std::string source;
  std::string destination;
  bool force = false;
  int threads = 0;
};
int RunCp(const CpArgs& args);

struct RmArgs {
  std::string url;  // a checkpoint
  bool force = false;
};
int RunRm(const RmArgs& args);

struct GcArgs {
  std::string url;  // a root of checkpoints
  double min_age_s = 0;  // leases decide (checkpoint_root.h)
  bool dry_run = false;
};
int RunGc(const GcArgs& args);

struct ExportArgs {
  std::string checkpoint;
  std::string out;
  std::string format = "safetensors";
  std::string checkpointable;
  std::string max_file_size = "5GB";
  bool skip_unsupported = false;
  bool force = false;
};
int RunExport(const ExportArgs& args);

struct ConvertArgs {
  std::string src;
  std::string dst;
  std::string from;  // orbax, dcp or safetensors; empty: the Python converter finds it
  bool allow_pickle = false;
  int64_t step = -1;  // < 0: none given (the source's own step, if it records one)
};
int RunConvert(const ConvertArgs& args);

struct DiffArgs {
  std::string a, b;
  bool json = false;
  bool all = false;
  int threads = 0;
};
int RunDiff(const DiffArgs& args);

}  // namespace shardkeep::cli
