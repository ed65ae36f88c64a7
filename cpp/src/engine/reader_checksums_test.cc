// The reader against damaged bytes: every bit of the commit record, of
// each meta.json and of each value file is covered by a checksum (format
// version 2 on), and on remote storage a chunk, index or small file whose
// check fails is read once more before the load fails.
#include <gtest/gtest.h>

#include <atomic>
#include <numeric>

#include "format/commit_record.h"
#include "shardkeep/checkpoint.h"
#include "storage/fault_injection.h"
#include "testing/payloads.h"
#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

const std::string kPath = "root/ckpt";
const std::string kRecord = kPath + "/_SHARDKEEP";
const std::string kData = kPath + "/state/data/p0-0.bin";
const std::string kIndex = kPath + "/state/index/p0.idx";
constexpr uint64_t kRows = 12, kCols = 10;

void ExpectCorruptionNaming(const Status& status, const std::vector<std::string>& parts) {
  ASSERT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  for (const std::string& part : parts) {
    ASSERT_NE(status.message().find(part), std::string::npos)
        << "'" << part << "' not in: " << status.message();
  }
}

// A real save of a small checkpoint: a pytree "state" (a 12x10 float32
// leaf "w" in four row blocks, one chunk each), a json "config" and a
// bytes "blob".
Status SaveSmallCheckpoint(const std::shared_ptr<Storage>& storage,
                           const std::vector<float>& w) {
  SaveRequest request;
  request.path = kPath;
  CheckpointablePayload state =
      testdata::PytreePayload("state", {{"w", "float32", {kRows, kCols}}});
  for (uint64_t r = 0; r < kRows; r += 3) {
    state.shards.push_back({0, DType::kFloat32, Box{{r, 0}, {3, kCols}},
                            reinterpret_cast<const uint8_t*>(w.data() + r * kCols)});
  }
  request.parts.push_back(std::move(state));
  request.parts.push_back({"config", "json", R"({"kind": "json"})", {}, R"({"lr": 0.5})"});
  request.parts.push_back(testdata::BytesPayload("blob", "\x01\x02\x03 bytes"));
  Options options;
  options.io_threads = 1;
  return Save(storage, NewSingleProcessCoordinator(), std::move(request), options);
}

class ReaderChecksumsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::iota(w_.begin(), w_.end(), 0.5f);
    SK_ASSERT_OK(SaveSmallCheckpoint(base_, w_));
  }

  // Reads `box` of "w" through `storage`; checks the values read.
  Status ReadW(const std::shared_ptr<Storage>& storage,
               const Box& box = Box{{0, 0}, {kRows, kCols}}) {
    SK_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(storage, kPath));
    std::vector<float> out(box.NumElements(), -1.f);
    SK_RETURN_IF_ERROR(reader->Read(
        "state", {{0, DType::kFloat32, box, reinterpret_cast<uint8_t*>(out.data())}},
        Options()));
    for (uint64_t r = 0; r < box.shape[0]; ++r) {
      for (uint64_t c = 0; c < box.shape[1]; ++c) {
        EXPECT_EQ(out[r * box.shape[1] + c],
                  w_[(box.origin[0] + r) * kCols + box.origin[1] + c]);
      }
    }
    return Status::Ok();
  }

  // Flips one bit of each byte of `file` in turn (bit i % 8 of byte i)
  // and expects `load` to fail with Corruption naming the file.
  void ExpectEveryFlipRefused(const std::string& file,
                              const std::function<Status()>& load) {
    SK_ASSERT_OK_AND_ASSIGN(const std::string intact, base_->ReadAll(file));
    ASSERT_FALSE(intact.empty());
    for (size_t i = 0; i < intact.size(); ++i) {
      SCOPED_TRACE(file + " byte " + std::to_string(i));
      std::string flipped = intact;
      flipped[i] = static_cast<char>(flipped[i] ^ (1 << (i % 8)));
      SK_ASSERT_OK(base_->WriteAll(file, flipped, false));
      ExpectCorruptionNaming(load(), {file});
      if (HasFatalFailure()) break;
    }
    SK_ASSERT_OK(base_->WriteAll(file, intact, false));
    SK_EXPECT_OK(load());
  }

  // `base_` behind a fault-injecting wrapper that reports itself remote
  // (or local), as an object store does.
  std::shared_ptr<FaultInjectionStorage> Wrapped(bool remote) {
    auto storage = std::make_shared<FaultInjectionStorage>(base_);
    StorageFeatures features = base_->features();
    features.remote = remote;
    storage->OverrideFeatures(features);
    return storage;
  }

  // Damages the next `count` reads of `file` (every read: -1).
  static void Corrupt(FaultInjectionStorage& storage, const std::string& file, int count) {
    auto left = std::make_shared<std::atomic<int>>(count);
    storage.CorruptReadsOn([=](std::string_view, const std::string& path, uint64_t, uint64_t) {
      return path == file && (count < 0 || left->fetch_sub(1) > 0);
    });
  }

  std::shared_ptr<Storage> base_ = NewMemoryStorage();
  std::vector<float> w_ = std::vector<float>(kRows * kCols);
};

TEST_F(ReaderChecksumsTest, EveryFlippedBitOfTheCommitRecordIsRefused) {
  ExpectEveryFlipRefused(kRecord, [&] { return CheckpointReader::Open(base_, kPath).status(); });
}

// A flip inside meta.json would mostly still parse (a digit of a shape, a
// letter of a path): the record's checksum of its bytes refuses it.
TEST_F(ReaderChecksumsTest, EveryFlippedBitOfEachMetaJsonIsRefused) {
  for (const std::string name : {"state", "config", "blob"}) {
    ExpectEveryFlipRefused(kPath + "/" + name + "/meta.json", [&]() -> Status {
      SK_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(base_, kPath));
      return reader->MetaJson(name).status();
    });
  }
  // The load of the pytree stops there too.
  SK_ASSERT_OK_AND_ASSIGN(std::string meta, base_->ReadAll(kPath + "/state/meta.json"));
  meta[meta.find("10")] = '9';  // shape [12, 10] -> [12, 90]: still valid JSON
  SK_ASSERT_OK(base_->WriteAll(kPath + "/state/meta.json", meta, false));
  ExpectCorruptionNaming(ReadW(base_),
                         {kPath + "/state/meta.json: checksum mismatch", "_SHARDKEEP"});
}

TEST_F(ReaderChecksumsTest, EveryFlippedBitOfEachValueIsRefused) {
  for (const auto& [name, file] : {std::pair<std::string, std::string>{"config", "value.json"},
                                   {"blob", "value.bin"}}) {
    const std::string part = name;  // clang 14 cannot capture a structured binding
    ExpectEveryFlipRefused(kPath + "/" + part + "/" + file, [&]() -> Status {
      SK_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(base_, kPath));
      return reader->ReadValue(part).status();
    });
  }
}

TEST_F(ReaderChecksumsTest, TheRecordListsWhatItCovers) {
  SK_ASSERT_OK_AND_ASSIGN(std::string bytes, base_->ReadAll(kRecord));
  SK_ASSERT_OK_AND_ASSIGN(auto record, format::DecodeCommitRecord(bytes, kRecord));
  EXPECT_EQ(record.version, format::kFormatVersion);
  ASSERT_EQ(record.checkpointables.size(), 3u);
  for (const format::CheckpointableEntry& entry : record.checkpointables) {
    SK_ASSERT_OK_AND_ASSIGN(std::string meta,
                            base_->ReadAll(kPath + "/" + entry.name + "/meta.json"));
    EXPECT_EQ(entry.meta_checksum, format::FileChecksum(meta)) << entry.name;
    EXPECT_EQ(entry.value_checksum.has_value(), entry.kind != "pytree") << entry.name;
  }
}

// Version-1 checkpoints carry no checksums and still load.
TEST(ReaderChecksumsCompat, VersionOneCheckpointLoads) {
  auto storage = NewFileStorage();
  const std::string path = std::string(SHARDKEEP_TESTDATA_DIR) + "/compat/v1/small";
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage, path));
  SK_EXPECT_OK(reader->MetaJson("state").status());
  SK_ASSERT_OK_AND_ASSIGN(std::string blob, reader->ReadValue("blob"));
  EXPECT_EQ(blob, "xy");
}

// --- Remote storage: a damaged transfer is read again -------------------

// A chunk read straight into its destination (whole row blocks).
TEST_F(ReaderChecksumsTest, RemoteChunkDamagedOnceIsReadAgain) {
  auto storage = Wrapped(/*remote=*/true);
  Corrupt(*storage, kData, 1);
  SK_EXPECT_OK(ReadW(storage));
  EXPECT_EQ(storage->Count("ReadAt"), 5);  // four chunks, one of them twice
}

// A chunk read into a buffer and copied out (part of a row block).
TEST_F(ReaderChecksumsTest, RemoteBufferedChunkDamagedOnceIsReadAgain) {
  auto storage = Wrapped(/*remote=*/true);
  Corrupt(*storage, kData, 1);
  SK_EXPECT_OK(ReadW(storage, Box{{1, 2}, {4, 5}}));  // rows 1-4: two chunks
  // One read of the range holding both chunks, one of the damaged chunk.
  EXPECT_EQ(storage->Count("ReadAt"), 2);
}

TEST_F(ReaderChecksumsTest, RemoteChunkDamagedEveryTimeNamesObjectAndByteRange) {
  auto storage = Wrapped(/*remote=*/true);
  Corrupt(*storage, kData, -1);
  // Rows 0-2: the chunk at offset 0, 3 x 10 float32.
  ExpectCorruptionNaming(ReadW(storage, Box{{0, 0}, {3, kCols}}),
                         {"checksum mismatch", kData, "at offset 0, length 120",
                          "read twice, bytes [0, 120) of " + kData,
                          "the stored object is damaged"});
  EXPECT_EQ(storage->Count("ReadAt"), 2);
}

// On local storage a second read would repeat the first: none is made.
TEST_F(ReaderChecksumsTest, LocalChunkIsNotReadAgain) {
  auto storage = Wrapped(/*remote=*/false);
  Corrupt(*storage, kData, 1);
  const Status read = ReadW(storage, Box{{0, 0}, {3, kCols}});
  ExpectCorruptionNaming(read, {kData, "at offset 0, length 120"});
  EXPECT_EQ(read.message().find("read twice"), std::string::npos) << read.message();
  EXPECT_EQ(storage->Count("ReadAt"), 1);
}

TEST_F(ReaderChecksumsTest, RemoteIndexDamagedOnceIsReadAgain) {
  auto storage = Wrapped(/*remote=*/true);
  Corrupt(*storage, kIndex, 1);
  SK_EXPECT_OK(ReadW(storage));
  Corrupt(*storage, kIndex, -1);
  SK_ASSERT_OK_AND_ASSIGN(const uint64_t size, base_->FileSize(kIndex));
  ExpectCorruptionNaming(ReadW(storage),
                         {kIndex, "read twice, bytes [0, " + std::to_string(size) + ")"});
}

TEST_F(ReaderChecksumsTest, RemoteSmallFilesDamagedOnceAreReadAgain) {
  auto storage = Wrapped(/*remote=*/true);
  for (const std::string file : {kRecord, kPath + "/state/meta.json",
                                 kPath + "/config/value.json", kPath + "/blob/value.bin"}) {
    SCOPED_TRACE(file);
    Corrupt(*storage, file, 1);
    SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage, kPath));
    SK_EXPECT_OK(reader->MetaJson("state").status());
    SK_ASSERT_OK_AND_ASSIGN(std::string config, reader->ReadValue("config"));
    EXPECT_EQ(config, R"({"lr": 0.5})");
    SK_ASSERT_OK_AND_ASSIGN(std::string blob, reader->ReadValue("blob"));
    EXPECT_EQ(blob, "\x01\x02\x03 bytes");
  }
  Corrupt(*storage, kRecord, -1);
  ExpectCorruptionNaming(CheckpointReader::Open(storage, kPath).status(),
                         {kRecord, "checksum mismatch", "read twice"});
}

}  // namespace
}  // namespace shardkeep
