// Fuzzes the whole read path: a checkpoint held in the memory backend is
// opened, and every checkpointable's meta.json, values and array leaves
// are read, as a load would.
//
// Input layout (scripts/pack_fuzz_checkpoints.py writes it from real
// checkpoints): a flags byte, then files until the input ends, each a path
// length (u8), the path relative to the checkpoint, a content length (u32
// little-endian; one past the end takes the rest) and the content.
// Flags: bit 0 reseals each index's trailer checksum, bit 1 recomputes
// its chunks' checksums from the data files and bit 2 lists the
// checksums of every meta.json and value file in _SHARDKEEP and seals its
// own, so that mutated inputs get past the checksums to the checks behind
// them.
#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "format/checkpointable_meta.h"
#include "format/commit_record.h"
#include "format/index.h"
#include "shardkeep/checkpoint.h"
#include "testing/forged_checkpoint.h"

namespace shardkeep {
namespace {

constexpr char kPath[] = "ckpt";
// Leaves larger than this are read one element at a time, which keeps a
// run's memory small whatever sizes the input claims.
constexpr uint64_t kMaxLeafBytes = 1 << 20;

struct File {
  std::string path;
  std::string content;
};

std::vector<File> Unpack(std::string_view in) {
  std::vector<File> files;
  while (!in.empty()) {
    const size_t name_length = static_cast<uint8_t>(in[0]);
    in.remove_prefix(1);
    if (in.size() < name_length + 4) break;
    File file{std::string(in.substr(0, name_length)), ""};
    in.remove_prefix(name_length);
    uint32_t length = 0;
    for (int i = 3; i >= 0; --i) length = (length << 8) | static_cast<uint8_t>(in[i]);
    in.remove_prefix(4);
    file.content = std::string(in.substr(0, length));
    in.remove_prefix(std::min<size_t>(length, in.size()));
    files.push_back(std::move(file));
  }
  return files;
}

void Reseal(std::string& index) {
  if (index.size() < 8) return;
  const uint64_t sum = XXH3_64bits(index.data(), index.size() - 8);
  for (int i = 0; i < 8; ++i) index[index.size() - 8 + i] = static_cast<char>(sum >> (8 * i));
}

// "<cp>/index/p<P>.idx" -> "<cp>/data/p<P>-<F>.bin" for each record.
void RecomputeChecksums(Storage& storage, const std::string& index_path,
                        std::string& index) {
  auto records = format::DecodeIndex(index, index_path);
  if (!records.ok()) return;
  const size_t slash = index_path.rfind("/index/p");
  if (slash == std::string::npos) return;
  const std::string process =
      index_path.substr(slash + 8, index_path.size() - slash - 8 - 4);
  for (format::ChunkRecord& record : *records) {
    const std::string data = index_path.substr(0, slash) + "/data/p" + process + "-" +
                             std::to_string(record.data_file) + ".bin";
    auto bytes = storage.ReadAll(data);
    if (!bytes.ok() || record.offset > bytes->size() ||
        record.stored_length > bytes->size() - record.offset) {
      continue;
    }
    record.checksum = XXH3_64bits(bytes->data() + record.offset, record.stored_length);
  }
  index = format::EncodeIndex(*records);
}

std::shared_ptr<Storage> Materialize(std::string_view input) {
  auto storage = NewMemoryStorage();
  if (input.empty()) return storage;
  const uint8_t flags = static_cast<uint8_t>(input[0]);
  std::vector<File> files = Unpack(input.substr(1));
  for (File& file : files) {
    if ((flags & 1) && file.path.ends_with(".idx")) Reseal(file.content);
    (void)storage->WriteAll(std::string(kPath) + "/" + file.path, file.content, false);
  }
  if (flags & 2) {  // after all data files are in place
    for (File& file : files) {
      if (!file.path.ends_with(".idx")) continue;
      const std::string path = std::string(kPath) + "/" + file.path;
      RecomputeChecksums(*storage, path, file.content);
      (void)storage->WriteAll(path, file.content, false);
    }
  }
  if (flags & 4) {  // after every file it covers is in place
    const std::string record = std::string(kPath) + "/" + format::kCommitFileName;
    if (auto bytes = storage->ReadAll(record); bytes.ok()) {
      format::SealCommitRecord(*bytes);
      (void)storage->WriteAll(record, *bytes, false);
      (void)testdata::RelistCheckpointFiles(*storage, kPath);
    }
  }
  return storage;
}

// Reads the whole leaf when it is small, else its first element, in the
// stored dtype and cast to float64.
void ReadLeaf(CheckpointReader& reader, const std::string& name, uint32_t leaf,
              const format::LeafMeta& meta) {
  auto dtype = DTypeFromName(meta.dtype);
  if (!dtype.ok()) return;
  Box box{std::vector<uint64_t>(meta.shape.size(), 0), meta.shape};
  const std::optional<uint64_t> bytes = CheckedByteSize(meta.shape, DTypeSize(*dtype));
  if (!bytes || *bytes > kMaxLeafBytes) {
    std::fill(box.shape.begin(), box.shape.end(), 1);
  }
  Options options;
  options.io_threads = 1;
  options.allow_lossy_cast = true;
  for (DType as : {*dtype, DType::kFloat64}) {
    std::vector<uint8_t> out(box.NumElements() * DTypeSize(as));
    (void)reader.Locate(name, {{leaf, as, box, nullptr}}, options);
    (void)reader.Read(name, {{leaf, as, box, out.data()}}, options);
  }
}

}  // namespace
}  // namespace shardkeep

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardkeep;
  auto storage =
      Materialize(std::string_view(reinterpret_cast<const char*>(data), size));
  auto reader = CheckpointReader::Open(storage, kPath);
  if (!reader.ok()) return 0;
  // The commit record decoded, so this parses; its keys are the names.
  const nlohmann::json commit = nlohmann::json::parse((*reader)->commit_json());
  for (const auto& [name, entry] : commit["checkpointables"].items()) {
    (void)(*reader)->ReadValue(name);
    auto meta_json = (*reader)->MetaJson(name);
    if (!meta_json.ok()) continue;
    auto meta = format::DecodeCheckpointableMeta(*meta_json, name);
    if (!meta.ok()) continue;
    for (uint32_t leaf = 0; leaf < meta->leaves.size(); ++leaf) {
      if (meta->leaves[leaf].kind == format::LeafKind::kArray) {
        ReadLeaf(**reader, name, leaf, meta->leaves[leaf]);
      }
    }
  }
  return 0;
}
