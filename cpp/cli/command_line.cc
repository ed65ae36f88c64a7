// `shardkeep`: look into, check, copy, export and clean up checkpoints from
// a shell, without Python or JAX. Every command takes local paths and
// s3:// URLs (see docs/CLI.md).
//
// The whole command line is registered here, and only here: CLI11 is
// header-only, and each file that registers options compiles much of it
// again (seconds per file). The commands' own files take parsed arguments
// (command.h).
#include <map>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "command.h"

namespace shardkeep::cli {
namespace {

// Registers a subcommand whose options fill an `Args`; when it is the one
// given, `run` gets them and its result becomes the exit code.
template <typename Args>
CLI::App* AddCommand(CLI::App& app, const std::string& name, const std::string& help,
                     int (*run)(const Args&), int& exit_code, std::shared_ptr<Args>& args) {
  args = std::make_shared<Args>();
  CLI::App* command = app.add_subcommand(name, help);
  command->callback([run, args, &exit_code] { exit_code = run(*args); });
  return command;
}

void AddLs(CLI::App& app, int& exit_code) {
  std::shared_ptr<LsArgs> args;
  CLI::App* command = AddCommand(
      app, "ls",
      "List the checkpoints under a root folder (step, commit time, size, processes, "
      "checkpointables) and flag the leftovers of failed saves",
      RunLs, exit_code, args);
  command->add_option("ROOT", args->url, "Folder holding checkpoints: a path or s3://bucket/prefix")
      ->required();
  command->add_flag("--json", args->json, "Machine-readable output (fields in docs/CLI.md)");
}

void AddInfo(CLI::App& app, int& exit_code) {
  std::shared_ptr<InfoArgs> args;
  CLI::App* command = AddCommand(
      app, "info",
      "Show a checkpoint's commit record (step, times, processes, metadata, metrics) and its "
      "trees: leaves with dtype, shape, saved sharding, size and compression",
      RunInfo, exit_code, args);
  command->add_option("CKPT", args->url, "The checkpoint: a path or s3://bucket/prefix")
      ->required();
  command->add_option("--checkpointable", args->checkpointable, "Show only this checkpointable");
  command->add_flag("--json", args->json, "Machine-readable output (fields in docs/CLI.md)");
}

void AddVerify(CLI::App& app, int& exit_code) {
  std::shared_ptr<VerifyArgs> args;
  CLI::App* command = AddCommand(
      app, "verify",
      "Check a committed checkpoint completely: commit record, every meta.json and index, "
      "the tiling of every leaf, every chunk's checksum (and zstd frame). Exit 0 when "
      "intact, 1 listing every problem (file, leaf, offset), 3 when it cannot be read.",
      RunVerify, exit_code, args);
  command->add_option("checkpoint", args->checkpoint, "checkpoint path or s3:// URL")
      ->required();
  command->add_flag("--json", args->json, "print the report as JSON on stdout");
  command->add_option("--threads", args->threads,
                      "chunks checked at once (default: one per core, more on S3)")
      ->check(CLI::NonNegativeNumber);
}

void AddCp(CLI::App& app, int& exit_code) {
  std::shared_ptr<CpArgs> args;
  CLI::App* command = AddCommand(
      app, "cp",
      "Copy a committed checkpoint to another path or storage (local paths, s3:// URLs), "
      "in parallel, checking every chunk's checksum on the way and committing at the "
      "destination as a save does.",
      RunCp, exit_code, args);
  command->add_option("source", args->source, "checkpoint path or s3:// URL")->required();
  command->add_option("destination", args->destination,
                      "where the copy goes (path or s3:// URL); must not exist")
      ->required();
  command->add_flag("--force", args->force,
                    "replace a checkpoint (or anything else) at the destination");
  command->add_option("--threads", args->threads,
                      "files copied at once (default: one per core, more on S3)")
      ->check(CLI::NonNegativeNumber);
}

void AddRm(CLI::App& app, int& exit_code) {
  std::shared_ptr<RmArgs> args;
  CLI::App* command = AddCommand(
      app, "rm",
      "Delete a committed checkpoint (refuses anything without a commit record unless "
      "--force)",
      RunRm, exit_code, args);
  command->add_option("CKPT", args->url, "The checkpoint: a path or s3://bucket/prefix")
      ->required();
  command->add_flag("--force", args->force,
                    "Delete the folder even without a readable commit record (a leftover, a "
                    "damaged checkpoint, or any folder)");
}

void AddGc(CLI::App& app, int& exit_code) {
  std::shared_ptr<GcArgs> args;
  CLI::App* command = AddCommand(
      app, "gc",
      "Remove the leftovers of failed saves under a root (temporary, replaced, being-deleted "
      "and unfinished folders); never a committed checkpoint nor the only copy of one",
      RunGc, exit_code, args);
  command->add_option("ROOT", args->url, "Folder holding checkpoints: a path or s3://bucket/prefix")
      ->required();
  const std::map<std::string, double> units{
      {"s", 1}, {"m", 60}, {"h", 3600}, {"d", 86400}, {"w", 604800}};
  command
      ->add_option("--older-than", args->min_age_s,
                   "Also keep leftovers in which something was written less than this long "
                   "ago (30m, 2h, 7d; default 0: saves in flight hold leases, which gc "
                   "always honours; use it for saves by versions without leases)")
      ->transform(CLI::AsNumberWithUnit(units, CLI::AsNumberWithUnit::CASE_SENSITIVE,
                                        "DURATION"))
      ->check(CLI::NonNegativeNumber)
      ->type_name("DURATION");
  command->add_flag("--dry-run", args->dry_run, "Report what would be removed; remove nothing");
}

void AddExport(CLI::App& app, int& exit_code) {
  std::shared_ptr<ExportArgs> args;
  CLI::App* command = AddCommand(
      app, "export",
      "Write the full arrays of a pytree checkpointable in another format (safetensors), "
      "in several files with a Hugging Face index when large, streaming with bounded memory.",
      RunExport, exit_code, args);
  command->add_option("checkpoint", args->checkpoint, "checkpoint path or s3:// URL")
      ->required();
  command->add_option("out", args->out, "output folder (path or s3:// URL)")->required();
  command->add_option("--format", args->format, "output format")
      ->check(CLI::IsMember({"safetensors"}))
      ->required();
  command->add_option("--checkpointable", args->checkpointable,
                      "the pytree to export (default: the checkpoint's only pytree)");
  command->add_option("--max-file-size", args->max_file_size,
                      "split into files of at most this size (e.g. 5GB, 500MB, 1GiB); "
                      "default 5GB")
      ->capture_default_str();
  command->add_flag("--skip-unsupported", args->skip_unsupported,
                    "leave out leaves whose dtype safetensors cannot express (int4, "
                    "complex128, some float8 and float4 types) instead of failing");
  command->add_flag("--force", args->force, "replace the files of an earlier export in OUT");
}

void AddConvert(CLI::App& app, int& exit_code) {
  std::shared_ptr<ConvertArgs> args;
  CLI::App* command = AddCommand(
      app, "convert",
      "Write a shardkeep checkpoint from an Orbax, PyTorch DCP or safetensors one (runs "
      "shardkeep's Python package)",
      RunConvert, exit_code, args);
  command->add_option("SRC", args->src, "The checkpoint to convert (path or s3:// URL)")
      ->required();
  command->add_option("DST", args->dst, "Where to write the shardkeep checkpoint")->required();
  command
      ->add_option("--from", args->from, "The source's format (default: found from its files)")
      ->check(CLI::IsMember({"orbax", "dcp", "safetensors"}));
  command->add_flag("--allow-pickle", args->allow_pickle,
                    "DCP only: unpickle its metadata file (run code from the checkpoint: "
                    "only for checkpoints you trust)");
  command->add_option("--step", args->step,
                      "The step to record in the checkpoint (default: the Orbax step "
                      "folder's number, when there is one)")
      ->check(CLI::NonNegativeNumber);
}

void AddDiff(CLI::App& app, int& exit_code) {
  std::shared_ptr<DiffArgs> args;
  CLI::App* command = AddCommand(
      app, "diff",
      "Compare two checkpoints leaf by leaf: identical, differs (how many elements, the "
      "largest absolute and relative difference), changed dtype or shape, or only in one. "
      "Chunks whose checksums match are not read. Exit 0 when identical, 1 when they "
      "differ, 3 when either cannot be read.",
      RunDiff, exit_code, args);
  command->add_option("a", args->a, "checkpoint path or s3:// URL")->required();
  command->add_option("b", args->b, "checkpoint path or s3:// URL")->required();
  command->add_flag("--json", args->json, "print every leaf's comparison as JSON on stdout");
  command->add_flag("--all", args->all, "list identical leaves too");
  command->add_option("--threads", args->threads, "chunks read at once (default: one per core)")
      ->check(CLI::NonNegativeNumber);
}

}  // namespace
}  // namespace shardkeep::cli

int main(int argc, char** argv) {
  using namespace shardkeep::cli;
  CLI::App app{"shardkeep: inspect, verify, compare, copy, export and clean up checkpoints"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "shardkeep 0.1.0");
  int exit_code = kOk;
  AddLs(app, exit_code);
  AddInfo(app, exit_code);
  AddVerify(app, exit_code);
  AddCp(app, exit_code);
  AddRm(app, exit_code);
  AddGc(app, exit_code);
  AddExport(app, exit_code);
  AddConvert(app, exit_code);
  AddDiff(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kUsage;
  }
  return exit_code;
}
