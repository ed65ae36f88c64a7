// `shardkeep export CKPT OUT --format safetensors`: writes the full arrays
// of a pytree checkpointable as safetensors files in folder OUT, split into
// model-0000k-of-0000N.safetensors with model.safetensors.index.json (Hugging
// Face's convention) when they exceed --max-file-size. Each leaf is read in
// blocks of whole rows (CheckpointReader::Read) and appended, so memory
// stays bounded whatever the model's size. docs/CLI.md gives the naming
// and dtype rules.
//
// A safetensors file: an 8-byte little-endian header length, a JSON header
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
// {...}} (padded with spaces to a multiple of 8 bytes), then the tensors'
// bytes back to back, row-major, little-endian.
#include <algorithm>
#include <chrono>
#include <cctype>
#include <iostream>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "command.h"
#include "progress.h"
#include "shardkeep/checkpoint.h"
#include "shardkeep/safetensors.h"

namespace shardkeep::cli {
namespace {

// The most bytes of one leaf read at once.
constexpr uint64_t kBlockBytes = 64ull << 20;
constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

// "5GB" (10^9), "512MiB" (2^20), "1000" (bytes); nullopt when malformed.
std::optional<uint64_t> ParseSize(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) {
    ++digits;
  }
  if (digits == 0 || digits > 15) return std::nullopt;
  std::string unit = text.substr(digits);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::map<std::string, uint64_t> kUnits = {
      {"", 1},          {"B", 1},           {"KB", 1000},       {"MB", 1000000},
      {"GB", 1000000000}, {"TB", 1000000000000}, {"KIB", 1ull << 10}, {"MIB", 1ull << 20},
      {"GIB", 1ull << 30}, {"TIB", 1ull << 40}};
  auto found = kUnits.find(unit);
  if (found == kUnits.end()) return std::nullopt;
  const uint64_t value = std::stoull(text.substr(0, digits));
  if (value == 0 || value > UINT64_MAX / found->second) return std::nullopt;
  return value * found->second;
}

struct Tensor {
  const LeafInfo* leaf;
  std::string name;
  uint64_t bytes;
};

struct OutputFile {
  std::string name;
  std::vector<const Tensor*> tensors;
  uint64_t bytes = 0;
};

// The leaves to export, in the tree's order. Non-array leaves are skipped
// (listed in `skipped`); so are unsupported dtypes with --skip-unsupported,
// and without it they make the export fail before anything is written.
Result<std::vector<Tensor>> ChooseTensors(const PytreeInfo& tree, const std::string& checkpointable,
                                          bool skip_unsupported,
                                          std::vector<std::string>& skipped) {
  std::vector<Tensor> tensors;
  std::vector<std::string> unsupported;
  std::map<std::string, std::string> paths_by_name;
  for (const LeafInfo& leaf : tree.leaves) {
    const std::string shown = leaf.path.empty() ? "(the root)" : "'" + leaf.path + "'";
    if (leaf.kind != LeafKind::kArray) {
      skipped.push_back("leaf " + shown + ": a " + std::string(LeafKindName(leaf.kind)) +
                        ", not an array");
      continue;
    }
    std::optional<std::string_view> dtype = SafetensorsDTypeName(*leaf.dtype);
    if (!dtype) {
      const std::string what = "leaf " + shown + ": dtype " +
                               std::string(DTypeName(*leaf.dtype)) +
                               " has no safetensors equivalent";
      (skip_unsupported ? skipped : unsupported).push_back(what);
      continue;
    }
    std::string name = leaf.path.empty() ? checkpointable : leaf.path;
    std::replace(name.begin(), name.end(), '/', '.');
    auto [clash, fresh] = paths_by_name.emplace(name, leaf.path);
    if (!fresh) {
      return InvalidArgumentError("leaves '" + clash->second + "' and '" + leaf.path +
                                  "' would both be tensor '" + name +
                                  "' (a key holds a '.'); nothing was written");
    }
    tensors.push_back({&leaf, name, leaf.nbytes()});
  }
  if (!unsupported.empty()) {
    std::string list;
    for (const std::string& what : unsupported) list += "\n  " + what;
    return InvalidArgumentError("cannot export to safetensors:" + list +
                                "\n(--skip-unsupported leaves them out); nothing was written");
  }
  return tensors;
}

// Fills files in tree order, starting a new one when the next tensor would
// take the current one past `max_bytes` (a larger tensor gets a file alone).
std::vector<OutputFile> Pack(const std::vector<Tensor>& tensors, uint64_t max_bytes) {
  std::vector<OutputFile> files(1);
  for (const Tensor& tensor : tensors) {
    if (!files.back().tensors.empty() && files.back().bytes + tensor.bytes > max_bytes) {
      files.emplace_back();
    }
    files.back().tensors.push_back(&tensor);
    files.back().bytes += tensor.bytes;
  }
  for (size_t i = 0; i < files.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, files.size());
    files[i].name = files.size() == 1 ? kSingleFile : name;
  }
  return files;
}

// The file's header, by the core's safetensors codec (the reader's own).
std::string Header(const OutputFile& file, const CheckpointInfo& info) {
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (info.step) metadata["shardkeep_step"] = std::to_string(*info.step);
  std::vector<SafetensorsTensor> tensors;
  for (const Tensor* tensor : file.tensors) {
    tensors.push_back({tensor->name, *tensor->leaf->dtype, tensor->leaf->shape, 0,
                       tensor->bytes});
  }
  return EncodeSafetensorsHeader(tensors, metadata);
}

// Calls `block` with boxes of whole rows of `shape` in row-major order,
// each at most kBlockBytes when a row allows it, so that appending their
// bytes in turn writes the whole array row-major.
Status ForEachBlock(const std::vector<uint64_t>& shape, uint64_t itemsize,
                    const std::function<Status(const Box&)>& block) {
  const size_t rank = shape.size();
  for (uint64_t extent : shape) {
    if (extent == 0) return Status::Ok();
  }
  if (rank == 0) return block(Box{});
  // The outermost dimension d whose sub-arrays (one index of d) fit a block.
  size_t d = 0;
  uint64_t inner = itemsize;
  for (size_t i = rank - 1; i > 0; --i) inner *= shape[i];
  while (d + 1 < rank && inner > kBlockBytes) inner /= shape[++d];
  const uint64_t step = std::clamp<uint64_t>(kBlockBytes / inner, 1, shape[d]);
  std::vector<uint64_t> prefix(d, 0);  // indices of the dimensions before d
  while (true) {
    for (uint64_t i = 0; i < shape[d]; i += step) {
      Box box{std::vector<uint64_t>(rank, 0), shape};
      for (size_t k = 0; k < d; ++k) {
        box.origin[k] = prefix[k];
        box.shape[k] = 1;
      }
      box.origin[d] = i;
      box.shape[d] = std::min(step, shape[d] - i);
      SK_RETURN_IF_ERROR(block(box));
    }
    size_t k = d;
    while (k > 0 && ++prefix[k - 1] == shape[k - 1]) prefix[--k] = 0;
    if (k == 0) return Status::Ok();
  }
}

class Exporter {
 public:
  Exporter(const ExportArgs& args, std::unique_ptr<CheckpointReader> reader,
           StorageLocation out)
      : args_(args), reader_(std::move(reader)), out_(std::move(out)) {}

  Status Run() {
    SK_ASSIGN_OR_RETURN(const std::string name, ChooseCheckpointable());
    SK_ASSIGN_OR_RETURN(const uint64_t max_bytes, MaxFileSize());
    SK_ASSIGN_OR_RETURN(tree_, reader_->Pytree(name));
    std::vector<std::string> skipped;
    SK_ASSIGN_OR_RETURN(tensors_,
                        ChooseTensors(tree_, name, args_.skip_unsupported, skipped));
    for (const std::string& what : skipped) {
      std::cerr << "shardkeep export: skipped " << what << "\n";
    }
    const std::vector<OutputFile> files = Pack(tensors_, max_bytes);
    SK_RETURN_IF_ERROR(ClearOutput());
    uint64_t total = 0;
    for (const Tensor& tensor : tensors_) total += tensor.bytes;
    ProgressBar bar("export");
    uint64_t done = 0;
    for (const OutputFile& file : files) {
      SK_RETURN_IF_ERROR(WriteFile(name, file, [&](uint64_t bytes) {
        done += bytes;
        bar.Update(done, total);
      }));
    }
    bar.Finish();
    if (files.size() > 1) SK_RETURN_IF_ERROR(WriteIndex(files, total));
    std::cout << "exported " << tensors_.size() << " tensors (" << total << " bytes) of '"
              << name << "' to " << args_.out << ": "
              << (files.size() == 1 ? std::string(kSingleFile)
                                    : std::to_string(files.size()) + " files and " + kIndexFile)
              << "\n";
    return Status::Ok();
  }

 private:
  // --checkpointable, else the checkpoint's only pytree.
  Result<std::string> ChooseCheckpointable() const {
    if (!args_.checkpointable.empty()) return args_.checkpointable;
    std::vector<std::string> pytrees;
    for (const CheckpointableInfo& entry : reader_->Info().checkpointables) {
      if (entry.kind == "pytree") pytrees.push_back(entry.name);
    }
    if (pytrees.size() == 1) return pytrees[0];
    std::string names;
    for (const std::string& name : pytrees) names += (names.empty() ? "" : ", ") + name;
    return InvalidArgumentError(args_.checkpoint + " holds " +
                                (pytrees.empty() ? std::string("no pytree")
                                                 : "several pytrees (" + names + ")") +
                                ": name one with --checkpointable");
  }

  Result<uint64_t> MaxFileSize() const {
    std::optional<uint64_t> size = ParseSize(args_.max_file_size);
    if (!size) {
      return InvalidArgumentError("--max-file-size '" + args_.max_file_size +
                                  "' is not a size such as 5GB, 500MB or 1GiB");
    }
    return *size;
  }

  static bool IsExportFile(const std::string& name) {
    return name.starts_with("model") && (name.ends_with(".safetensors") || name == kIndexFile);
  }

  // Files of an earlier export in OUT would mix with this one's: refused,
  // or removed with --force.
  Status ClearOutput() {
    Result<std::vector<std::string>> entries = out_.storage->List(out_.path);
    if (entries.status().code() == StatusCode::kNotFound) {
      return out_.storage->CreateDir(out_.path);
    }
    SK_RETURN_IF_ERROR(entries.status());
    for (const std::string& entry : *entries) {
      if (!IsExportFile(entry)) continue;
      if (!args_.force) {
        return AlreadyExistsError(args_.out + " already holds " + entry +
                                  "; pass --force to replace an earlier export");
      }
      SK_RETURN_IF_ERROR(out_.storage->DeleteFile(out_.path + "/" + entry));
    }
    return Status::Ok();
  }

  Status WriteFile(const std::string& checkpointable, const OutputFile& file,
                   const std::function<void(uint64_t)>& advance) {
    const std::string path = out_.path + "/" + file.name;
    SK_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, out_.storage->OpenForAppend(path));
    const std::string header = Header(file, reader_->Info());
    SK_RETURN_IF_ERROR(out->Append(header.data(), header.size()));
    std::vector<uint8_t> buffer;
    Options options;
    options.host_memory_limit = 256ull << 20;
    for (const Tensor* tensor : file.tensors) {
      const LeafInfo& leaf = *tensor->leaf;
      const uint64_t itemsize = DTypeSize(*leaf.dtype);
      SK_RETURN_IF_ERROR(ForEachBlock(leaf.shape, itemsize, [&](const Box& box) -> Status {
        const uint64_t bytes = box.NumElements() * itemsize;
        buffer.resize(bytes);
        SK_RETURN_IF_ERROR(reader_->Read(
            checkpointable, {ReadRequest{leaf.index, *leaf.dtype, box, buffer.data()}}, options));
        SK_RETURN_IF_ERROR(out->Append(buffer.data(), bytes));
        advance(bytes);
        return Status::Ok();
      }));
    }
    SK_RETURN_IF_ERROR(out->Sync());
    return out->Close().WithContext("writing " + path);
  }

  Status WriteIndex(const std::vector<OutputFile>& files, uint64_t total) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
    for (const OutputFile& file : files) {
      for (const Tensor* tensor : file.tensors) weight_map[tensor->name] = file.name;
    }
    index["weight_map"] = weight_map;
    return out_.storage->WriteAll(out_.path + "/" + kIndexFile, index.dump(2) + "\n", true);
  }

  const ExportArgs& args_;
  std::unique_ptr<CheckpointReader> reader_;
  StorageLocation out_;
  PytreeInfo tree_;
  std::vector<Tensor> tensors_;  // point into tree_
};

}  // namespace

int RunExport(const ExportArgs& args) {
  auto fail = [](const std::string& what, const Status& status) {
    std::cerr << "shardkeep export: " << what << status.ToString() << "\n";
    return kFailed;
  };
  Result<StorageLocation> from = ResolveStorage(args.checkpoint);
  if (!from.ok()) return fail("", from.status());
  Result<StorageLocation> out = ResolveStorage(args.out);
  if (!out.ok()) return fail("", out.status());
  Result<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(from->storage, from->path);
  if (!reader.ok()) return fail("", reader.status());
  Exporter exporter(args, std::move(*reader), std::move(*out));
  const Status status = exporter.Run();
  if (!status.ok()) return fail(args.checkpoint + " -> " + args.out + ": ", status);
  return kOk;
}

}  // namespace shardkeep::cli
