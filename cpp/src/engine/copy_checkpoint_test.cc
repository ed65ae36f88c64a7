// CopyCheckpoint: bit-exact copies between backends (a folder, an object
// store's layout, a real S3 server), refusal of an occupied destination,
// and checksums checked on the way.
#include "shardkeep/copy_checkpoint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <numeric>
#include <random>

#include "format/commit_record.h"
#include "format/index.h"
#include "shardkeep/checkpoint.h"
#include "shardkeep/verify.h"
#include "testing/payloads.h"
#include "testing/seaweed_server.h"
#include "testing/status_matchers.h"
#include "testing/storage_conformance.h"

namespace shardkeep {
namespace {

using testing::Has;

// Every file below `dir` (relative path → bytes), found by listing.
void Collect(Storage& storage, const std::string& dir, const std::string& prefix,
             std::map<std::string, std::string>& out) {
  Result<std::vector<std::string>> entries = storage.List(dir);
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  for (const std::string& entry : *entries) {
    const std::string path = dir + "/" + entry;
    Result<std::string> bytes = storage.ReadAll(path);
    if (bytes.ok()) {
      out[prefix + entry] = *bytes;
    } else {
      Collect(storage, path, prefix + entry + "/", out);
    }
  }
}

std::map<std::string, std::string> Files(Storage& storage, const std::string& dir) {
  std::map<std::string, std::string> out;
  Collect(storage, dir, "", out);
  return out;
}

// The checkpointable files of a checkpoint, relative to its data folder
// (the generation on object stores), and its commit record decoded.
std::map<std::string, std::string> DataFiles(Storage& storage, const std::string& path) {
  Result<std::string> record = storage.ReadAll(path + "/_SHARDKEEP");
  EXPECT_TRUE(record.ok());
  if (!record.ok()) return {};
  Result<format::CommitRecord> commit = format::DecodeCommitRecord(*record, "_SHARDKEEP");
  EXPECT_TRUE(commit.ok());
  const std::string root =
      commit->data_folder ? path + "/" + *commit->data_folder : path;
  std::map<std::string, std::string> files = Files(storage, root);
  files.erase("_SHARDKEEP");
  return files;
}

// A checkpoint of two leaves in several chunks (two data files, one
// compressed leaf) and a bytes value.
void WriteSource(const std::shared_ptr<Storage>& storage, const std::string& path) {
  static std::vector<float> w(64 * 33);
  static std::vector<int16_t> v(1000);
  std::iota(w.begin(), w.end(), 0.25f);
  std::iota(v.begin(), v.end(), -500);
  SaveRequest request;
  request.path = path;
  request.step = 7;
  request.custom_metadata_json = R"({"note": "copied"})";
  CheckpointablePayload part = testdata::PytreePayload(
      "state", {{"w", "float32", {64, 33}}, {"v", "int16", {1000}}});
  for (uint64_t r = 0; r < 64; r += 16) {
    part.shards.push_back({0, DType::kFloat32, Box{{r, 0}, {16, 33}},
                           reinterpret_cast<const uint8_t*>(w.data() + r * 33)});
  }
  part.shards.push_back({1, DType::kInt16, Box{{0}, {1000}},
                         reinterpret_cast<const uint8_t*>(v.data())});
  request.parts.push_back(std::move(part));
  request.parts.push_back(testdata::BytesPayload("blob", std::string(5000, 'x')));
  Options options;
  options.io_threads = 2;
  options.chunk_bytes = 1000;  // several chunks per shard
  SK_ASSERT_OK(Save(storage, nullptr, std::move(request), options));
}

CopyOptions SmallPieces() {
  CopyOptions options;
  options.piece_bytes = 777;  // pieces that straddle chunk boundaries
  options.threads = 3;
  return options;
}

TEST(CopyCheckpoint, FolderToFolderIsBitExact) {
  auto from = NewMemoryStorage();
  auto to = NewMemoryStorage();
  WriteSource(from, "a/ckpt");
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  CopyOptions options = SmallPieces();
  options.progress = [&](uint64_t done, uint64_t total) { calls.push_back({done, total}); };
  SK_ASSERT_OK_AND_ASSIGN(CopyReport report, CopyCheckpoint(from, "a/ckpt", to, "b/copy", options));
  EXPECT_EQ(Files(*to, "b/copy"), Files(*from, "a/ckpt"));  // _SHARDKEEP included
  EXPECT_GT(report.chunks_verified, 8u);
  EXPECT_EQ(report.files, Files(*from, "a/ckpt").size());
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.back().first, calls.back().second);
  EXPECT_EQ(calls.back().first, report.bytes);
  EXPECT_FALSE(*to->Exists("b/copy.shardkeep-tmp"));
}

TEST(CopyCheckpoint, OccupiedDestinationIsRefusedUnlessForced) {
  auto storage = NewMemoryStorage();
  WriteSource(storage, "src");
  SK_ASSERT_OK(storage->CreateDir("dst"));
  SK_ASSERT_OK(storage->WriteAll("dst/notes.txt", "mine", false));
  Result<CopyReport> refused = CopyCheckpoint(storage, "src", storage, "dst");
  EXPECT_EQ(refused.status().code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(Has(refused.status().message(), "--force"));
  EXPECT_EQ(*storage->ReadAll("dst/notes.txt"), "mine");

  SK_ASSERT_OK(CopyCheckpoint(storage, "src", storage, "copy").status());
  Result<CopyReport> again = CopyCheckpoint(storage, "src", storage, "copy");
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(Has(again.status().message(), "already committed at copy"));

  CopyOptions force;
  force.force = true;
  SK_ASSERT_OK(CopyCheckpoint(storage, "src", storage, "dst", force).status());
  EXPECT_EQ(Files(*storage, "dst"), Files(*storage, "src"));
}

TEST(CopyCheckpoint, NoCheckpointAtTheSourceIsNotFound) {
  auto storage = NewMemoryStorage();
  Result<CopyReport> copied = CopyCheckpoint(storage, "nothing", storage, "dst");
  EXPECT_EQ(copied.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Has(copied.status().message(), "nothing/_SHARDKEEP"));
}

TEST(CopyCheckpoint, DamagedChunkFailsTheCopyAndLeavesNothing) {
  auto storage = NewMemoryStorage();
  WriteSource(storage, "src");
  const std::string index = "src/state/index/p0.idx";
  SK_ASSERT_OK_AND_ASSIGN(std::string index_bytes, storage->ReadAll(index));
  SK_ASSERT_OK_AND_ASSIGN(auto records, format::DecodeIndex(index_bytes, index));
  ASSERT_FALSE(records.empty());
  const format::ChunkRecord& victim = records.back();
  const std::string data = "src/state/" + format::DataFileName(0, victim.data_file);
  SK_ASSERT_OK_AND_ASSIGN(std::string bytes, storage->ReadAll(data));
  bytes[victim.offset + victim.stored_length / 2] ^= 0x10;
  SK_ASSERT_OK(storage->WriteAll(data, bytes, false));

  Result<CopyReport> copied = CopyCheckpoint(storage, "src", storage, "dst", SmallPieces());
  EXPECT_EQ(copied.status().code(), StatusCode::kCorruption);
  EXPECT_TRUE(Has(copied.status().message(), "checksum mismatch"));
  EXPECT_TRUE(Has(copied.status().message(), data));
  EXPECT_TRUE(Has(copied.status().message(), "at offset " + std::to_string(victim.offset)));
  EXPECT_FALSE(*storage->Exists("dst"));
  EXPECT_FALSE(*storage->Exists("dst.shardkeep-tmp"));
}

// meta.json and a value file whose bytes changed but still decode are
// refused by the checksums the record lists, before anything is copied.
TEST(CopyCheckpoint, ChangedMetaJsonOrValueFailsTheCopy) {
  for (const std::string file : {"src/state/meta.json", "src/blob/value.bin"}) {
    SCOPED_TRACE(file);
    auto storage = NewMemoryStorage();
    WriteSource(storage, "src");
    SK_ASSERT_OK_AND_ASSIGN(std::string bytes, storage->ReadAll(file));
    bytes[bytes.size() / 2] ^= 0x01;
    SK_ASSERT_OK(storage->WriteAll(file, bytes, false));
    Result<CopyReport> copied = CopyCheckpoint(storage, "src", storage, "dst", SmallPieces());
    EXPECT_EQ(copied.status().code(), StatusCode::kCorruption);
    EXPECT_TRUE(Has(copied.status().message(), file)) << copied.status().ToString();
    EXPECT_TRUE(Has(copied.status().message(), "checksum mismatch"));
    EXPECT_FALSE(*storage->Exists("dst"));
  }
}

// A folder to an object store's layout (a generation committed by a
// conditional create) and back: the same files, the same record.
TEST(CopyCheckpoint, FolderToObjectStoreAndBackIsBitExact) {
  auto folder = NewMemoryStorage();
  auto bucket = NewMemoryStorage(MemoryStorageMode::kObjectStore);
  WriteSource(folder, "src");
  SK_ASSERT_OK(CopyCheckpoint(folder, "src", bucket, "ckpts/1", SmallPieces()).status());
  SK_ASSERT_OK_AND_ASSIGN(std::string record, bucket->ReadAll("ckpts/1/_SHARDKEEP"));
  SK_ASSERT_OK_AND_ASSIGN(auto commit, format::DecodeCommitRecord(record, "_SHARDKEEP"));
  ASSERT_TRUE(commit.data_folder.has_value());
  EXPECT_EQ(DataFiles(*bucket, "ckpts/1"), DataFiles(*folder, "src"));
  SK_ASSERT_OK_AND_ASSIGN(VerifyReport verified, VerifyCheckpoint(bucket, "ckpts/1"));
  EXPECT_TRUE(verified.ok());

  // Over a committed one only with force, which replaces its generation.
  EXPECT_EQ(CopyCheckpoint(folder, "src", bucket, "ckpts/1").status().code(),
            StatusCode::kAlreadyExists);
  CopyOptions force;
  force.force = true;
  SK_ASSERT_OK(CopyCheckpoint(folder, "src", bucket, "ckpts/1", force).status());
  SK_ASSERT_OK_AND_ASSIGN(std::vector<std::string> entries, bucket->List("ckpts/1"));
  EXPECT_EQ(entries.size(), 2u);  // _SHARDKEEP and the one generation

  SK_ASSERT_OK(CopyCheckpoint(bucket, "ckpts/1", folder, "back", SmallPieces()).status());
  EXPECT_EQ(Files(*folder, "back"), Files(*folder, "src"));  // _SHARDKEEP included
}

// The same round trip through a real S3 server, with local files at both
// ends, and a load of the copy.
TEST(CopyCheckpoint, LocalToS3AndBackIsBitExact) {
  SK_ASSERT_OK_AND_ASSIGN(auto server, testing::SeaweedServer::Start());
  SK_ASSERT_OK(server->CreateBucket("copies"));
  S3Overrides s3;
  s3.endpoint_url = server->endpoint();
  s3.region = "us-east-1";
  s3.access_key_id = testing::SeaweedServer::kAccessKeyId;
  s3.secret_access_key = testing::SeaweedServer::kSecretAccessKey;
  SK_ASSERT_OK_AND_ASSIGN(StorageLocation remote,
                          ResolveStorage("s3://copies/run/ckpt", s3));
  auto local = NewFileStorage();
  const std::string dir = MakeTempDir();
  WriteSource(local, dir + "/src");

  CopyOptions options;
  options.piece_bytes = 1000;
  SK_ASSERT_OK(CopyCheckpoint(local, dir + "/src", remote.storage, remote.path, options).status());
  SK_ASSERT_OK_AND_ASSIGN(VerifyReport verified, VerifyCheckpoint(remote.storage, remote.path));
  EXPECT_TRUE(verified.ok());
  SK_ASSERT_OK(CopyCheckpoint(remote.storage, remote.path, local, dir + "/back", options).status());
  EXPECT_EQ(Files(*local, dir + "/back"), Files(*local, dir + "/src"));

  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(remote.storage, remote.path));
  std::vector<int16_t> v(1000);
  SK_ASSERT_OK(reader->ReadLeaf("state", "v", DType::kInt16, v.data(), Options()));
  EXPECT_EQ(v[0], -500);
  EXPECT_EQ(v[999], 499);
}

}  // namespace
}  // namespace shardkeep
