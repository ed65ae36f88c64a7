#include "testing/storage_conformance.h"

#include <stdlib.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "testing/status_matchers.h"

namespace shardkeep {

void StorageConformanceTest::SetUp() {
  StorageLocation location = GetParam().make();
  storage_ = std::move(location.storage);
  root_ = std::move(location.path);
  ASSERT_NE(storage_, nullptr);
}

void StorageConformanceTest::TearDown() {
  if (storage_ != nullptr) SK_EXPECT_OK(storage_->DeleteRecursive(root_));
}

std::string StorageConformanceTest::Path(std::string_view name) const {
  return root_ + "/" + std::string(name);
}

void StorageConformanceTest::ExpectRenameRefused(const std::string& from,
                                                 const std::string& to) {
  Result<bool> from_before = storage_->Exists(from);
  Result<bool> to_before = storage_->Exists(to);
  ASSERT_TRUE(from_before.ok() && to_before.ok());
  const Status status = storage_->Rename(from, to);
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(testing::Has(status.message(), "rename"));
  Result<bool> from_after = storage_->Exists(from);
  Result<bool> to_after = storage_->Exists(to);
  ASSERT_TRUE(from_after.ok() && to_after.ok());
  EXPECT_EQ(*from_after, *from_before) << from;
  EXPECT_EQ(*to_after, *to_before) << to;
}

std::string StorageTestBackendName(
    const ::testing::TestParamInfo<StorageTestBackend>& info) {
  return info.param.name;
}

void PrintTo(const StorageTestBackend& backend, std::ostream* os) {
  *os << backend.name;
}

std::string MakeTempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
      "/shardkeep_test_XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << pattern << " failed";
  }
  return pattern;
}

std::string TestBytes(size_t n, uint32_t seed) {
  std::string bytes(n, '\0');
  uint64_t state = 0x9E3779B97F4A7C15ull * (seed + 1);
  for (char& byte : bytes) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    byte = static_cast<char>(state >> 56);
  }
  return bytes;
}

// Test binaries that link this file without a backend to test run nothing.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StorageConformanceTest);

namespace {

using Names = std::vector<std::string>;

TEST_P(StorageConformanceTest, WriteAllThenReadAll) {
  SK_ASSERT_OK(storage_->WriteAll(Path("f"), "hello world", /*sync=*/false));
  SK_ASSERT_OK_AND_ASSIGN(std::string content, storage_->ReadAll(Path("f")));
  EXPECT_EQ(content, "hello world");
  SK_ASSERT_OK_AND_ASSIGN(uint64_t size, storage_->FileSize(Path("f")));
  EXPECT_EQ(size, 11u);

  // A shorter rewrite replaces the content entirely.
  SK_ASSERT_OK(storage_->WriteAll(Path("f"), "hi", /*sync=*/true));
  SK_ASSERT_OK_AND_ASSIGN(content, storage_->ReadAll(Path("f")));
  EXPECT_EQ(content, "hi");
}

TEST_P(StorageConformanceTest, EmptyFile) {
  SK_ASSERT_OK(storage_->WriteAll(Path("empty"), "", /*sync=*/false));
  SK_ASSERT_OK_AND_ASSIGN(std::string content,
                          storage_->ReadAll(Path("empty")));
  EXPECT_EQ(content, "");
  SK_ASSERT_OK_AND_ASSIGN(uint64_t size, storage_->FileSize(Path("empty")));
  EXPECT_EQ(size, 0u);
  SK_EXPECT_OK(storage_->ReadAt(Path("empty"), 0, 0, nullptr));
}

TEST_P(StorageConformanceTest, ReadAtReadsRanges) {
  const std::string data = TestBytes(1000);
  SK_ASSERT_OK(storage_->WriteAll(Path("f"), data, /*sync=*/false));
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = {
      {0, 1000}, {0, 1}, {10, 90}, {999, 1}, {500, 0}, {1000, 0}};
  for (const auto& [offset, size] : ranges) {
    std::string got(size, '\0');
    SK_ASSERT_OK(storage_->ReadAt(Path("f"), offset, size, got.data()));
    EXPECT_EQ(got, data.substr(offset, size)) << offset << "+" << size;
  }
}

TEST_P(StorageConformanceTest, ReadPastEndIsCorruption) {
  SK_ASSERT_OK(storage_->WriteAll(Path("f"), TestBytes(1000), false));
  std::string buffer(100, '\0');
  const Status status = storage_->ReadAt(Path("f"), 990, 20, buffer.data());
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  EXPECT_NE(status.message().find(Path("f")), std::string::npos)
      << status.ToString();
  EXPECT_NE(status.message().find("990"), std::string::npos)
      << status.ToString();
  EXPECT_NE(status.message().find("20"), std::string::npos)
      << status.ToString();
  EXPECT_EQ(storage_->ReadAt(Path("f"), 5000, 1, buffer.data()).code(),
            StatusCode::kCorruption);
  // Like pread, an empty read succeeds at any offset.
  SK_EXPECT_OK(storage_->ReadAt(Path("f"), 5000, 0, buffer.data()));
}

// Pieces in order, gaps skipped, more pieces than one vectored read takes
// (IOV_MAX is 1024 on Linux), and a span past the end is Corruption.
TEST_P(StorageConformanceTest, ReadScatterFillsPiecesInOrder) {
  const std::string data = TestBytes(5000);
  SK_ASSERT_OK(storage_->WriteAll(Path("f"), data, false));
  std::string got(5000, '\0');
  std::vector<ScatterPiece> pieces;
  std::string expected;
  uint64_t at = 3;  // the read starts at offset 3
  for (int i = 0; i < 1500; ++i) {
    const uint64_t size = 1 + i % 3;
    const bool skipped = i % 7 == 6;
    pieces.push_back({skipped ? nullptr : got.data() + expected.size(), size});
    if (!skipped) expected += data.substr(at, size);
    at += size;
  }
  SK_ASSERT_OK(storage_->ReadScatter(Path("f"), 3, pieces));
  EXPECT_EQ(got.substr(0, expected.size()), expected);

  const Status status =
      storage_->ReadScatter(Path("f"), 4990, {{got.data(), 5}, {nullptr, 2}, {got.data(), 9}});
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  EXPECT_NE(status.message().find(Path("f")), std::string::npos) << status.ToString();
}

TEST_P(StorageConformanceTest, MissingFileIsNotFound) {
  char byte;
  EXPECT_EQ(storage_->ReadAt(Path("missing"), 0, 1, &byte).code(),
            StatusCode::kNotFound);
  EXPECT_EQ(storage_->ReadAll(Path("missing")).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(storage_->FileSize(Path("missing")).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(storage_->DeleteFile(Path("missing")).code(),
            StatusCode::kNotFound);
}

TEST_P(StorageConformanceTest, AppendInPiecesThenRead) {
  const std::string data = TestBytes(1 << 20);
  // Sizes around the file backend's 64 KiB buffer: below, across, above.
  const std::vector<size_t> pieces = {1, 100, 70000, 5, 65536, 300000, 3};
  SK_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file,
                          storage_->OpenForAppend(Path("f")));
  size_t written = 0;
  for (const size_t piece : pieces) {
    SK_ASSERT_OK(file->Append(data.data() + written, piece));
    written += piece;
  }
  SK_ASSERT_OK(file->Sync());
  SK_ASSERT_OK(file->Close());
  SK_ASSERT_OK_AND_ASSIGN(std::string content, storage_->ReadAll(Path("f")));
  EXPECT_TRUE(content == data.substr(0, written))
      << "size " << content.size() << ", want " << written;
}

// Create-only: a data file shared by several checkpoints (a hard link) is
// never truncated by a write meant for a new one.
TEST_P(StorageConformanceTest, OpenForAppendCreatesOnlyNewFiles) {
  SK_ASSERT_OK(storage_->WriteAll(Path("f"), "old content", false));
  EXPECT_EQ(storage_->OpenForAppend(Path("f")).status().code(), StatusCode::kAlreadyExists);
  SK_ASSERT_OK_AND_ASSIGN(std::string content, storage_->ReadAll(Path("f")));
  EXPECT_EQ(content, "old content");
  SK_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file,
                          storage_->OpenForAppend(Path("g")));
  SK_ASSERT_OK_AND_ASSIGN(uint64_t size, storage_->FileSize(Path("g")));
  EXPECT_EQ(size, 0u);
  SK_ASSERT_OK(file->Append("new", 3));
  SK_ASSERT_OK(file->Close());
  SK_ASSERT_OK_AND_ASSIGN(content, storage_->ReadAll(Path("g")));
  EXPECT_EQ(content, "new");
}

TEST_P(StorageConformanceTest, ListReturnsSortedChildren) {
  SK_ASSERT_OK(storage_->CreateDir(Path("sub/deeper")));
  for (const char* name : {"b", "a", "c.txt", "sub/x", "sub/deeper/y"}) {
    SK_ASSERT_OK(storage_->WriteAll(Path(name), name, false));
  }
  SK_ASSERT_OK(storage_->CreateDir(Path("empty")));
  SK_ASSERT_OK_AND_ASSIGN(Names names, storage_->List(root_));
  EXPECT_EQ(names, (HasDirs() ? Names{"a", "b", "c.txt", "empty", "sub"}
                              : Names{"a", "b", "c.txt", "sub"}));
  SK_ASSERT_OK_AND_ASSIGN(names, storage_->List(Path("sub")));
  EXPECT_EQ(names, (Names{"deeper", "x"}));
  SK_ASSERT_OK_AND_ASSIGN(names, storage_->List(Path("sub/")));
  EXPECT_EQ(names, (Names{"deeper", "x"}));
  if (HasDirs()) {
    SK_ASSERT_OK_AND_ASSIGN(names, storage_->List(Path("empty")));
    EXPECT_EQ(names, Names{});
  } else {
    EXPECT_EQ(storage_->List(Path("empty")).status().code(),
              StatusCode::kNotFound);
  }
}

TEST_P(StorageConformanceTest, ListOfMissingDirIsNotFound) {
  EXPECT_EQ(storage_->List(Path("missing")).status().code(),
            StatusCode::kNotFound);
}

TEST_P(StorageConformanceTest, ExistsSeesFilesAndDirs) {
  SK_ASSERT_OK(storage_->CreateDir(Path("d/e")));
  SK_ASSERT_OK(storage_->WriteAll(Path("d/f"), "x", false));
  for (const char* name : {"d", "d/e", "d/f"}) {
    SK_ASSERT_OK_AND_ASSIGN(bool exists, storage_->Exists(Path(name)));
    // "d/e" is an empty directory, which object stores do not keep.
    EXPECT_EQ(exists, HasDirs() || std::string(name) != "d/e") << name;
  }
  for (const char* name : {"missing", "d/missing", "missing/below", "d/f/x"}) {
    SK_ASSERT_OK_AND_ASSIGN(bool exists, storage_->Exists(Path(name)));
    EXPECT_FALSE(exists) << name;
  }
}

TEST_P(StorageConformanceTest, DeleteFileRemovesOnlyThatFile) {
  SK_ASSERT_OK(storage_->WriteAll(Path("a"), "a", false));
  SK_ASSERT_OK(storage_->WriteAll(Path("b"), "b", false));
  SK_ASSERT_OK(storage_->DeleteFile(Path("a")));
  SK_ASSERT_OK_AND_ASSIGN(Names names, storage_->List(root_));
  EXPECT_EQ(names, Names{"b"});
}

TEST_P(StorageConformanceTest, DeleteRecursiveRemovesTree) {
  SK_ASSERT_OK(storage_->CreateDir(Path("tree/a/b")));
  SK_ASSERT_OK(storage_->CreateDir(Path("tree/empty")));
  SK_ASSERT_OK(storage_->WriteAll(Path("tree/top"), "1", false));
  SK_ASSERT_OK(storage_->WriteAll(Path("tree/a/b/leaf"), "2", false));
  // Siblings whose names start with "tree" stay.
  SK_ASSERT_OK(storage_->WriteAll(Path("tree.keep"), "3", false));
  SK_ASSERT_OK(storage_->CreateDir(Path("tree2")));

  SK_ASSERT_OK(storage_->DeleteRecursive(Path("tree")));
  SK_ASSERT_OK_AND_ASSIGN(Names names, storage_->List(root_));
  EXPECT_EQ(names, (HasDirs() ? Names{"tree.keep", "tree2"}
                              : Names{"tree.keep"}));
  SK_ASSERT_OK_AND_ASSIGN(bool exists, storage_->Exists(Path("tree/a")));
  EXPECT_FALSE(exists);

  SK_EXPECT_OK(storage_->DeleteRecursive(Path("tree")));
  SK_EXPECT_OK(storage_->DeleteRecursive(Path("never/was")));
  SK_EXPECT_OK(storage_->DeleteRecursive(Path("tree.keep")));
}

TEST_P(StorageConformanceTest, RenameMovesFile) {
  SK_ASSERT_OK(storage_->WriteAll(Path("from"), "payload", false));
  if (!HasDirs()) return ExpectRenameRefused(Path("from"), Path("to"));
  SK_ASSERT_OK(storage_->Rename(Path("from"), Path("to")));
  SK_ASSERT_OK_AND_ASSIGN(std::string content, storage_->ReadAll(Path("to")));
  EXPECT_EQ(content, "payload");
  SK_ASSERT_OK_AND_ASSIGN(bool exists, storage_->Exists(Path("from")));
  EXPECT_FALSE(exists);
}

TEST_P(StorageConformanceTest, RenameMovesDirWithContents) {
  SK_ASSERT_OK(storage_->CreateDir(Path("tmp/sub")));
  SK_ASSERT_OK(storage_->CreateDir(Path("tmp/empty")));
  SK_ASSERT_OK(storage_->WriteAll(Path("tmp/a"), "a", false));
  SK_ASSERT_OK(storage_->WriteAll(Path("tmp/sub/b"), "b", false));
  SK_ASSERT_OK(storage_->WriteAll(Path("tmp.other"), "stays", false));
  if (!HasDirs()) return ExpectRenameRefused(Path("tmp"), Path("final"));

  SK_ASSERT_OK(storage_->Rename(Path("tmp"), Path("final")));
  SK_ASSERT_OK_AND_ASSIGN(Names names, storage_->List(root_));
  EXPECT_EQ(names, (Names{"final", "tmp.other"}));
  SK_ASSERT_OK_AND_ASSIGN(names, storage_->List(Path("final")));
  EXPECT_EQ(names, (Names{"a", "empty", "sub"}));
  SK_ASSERT_OK_AND_ASSIGN(std::string content,
                          storage_->ReadAll(Path("final/sub/b")));
  EXPECT_EQ(content, "b");
  SK_ASSERT_OK_AND_ASSIGN(names, storage_->List(Path("final/empty")));
  EXPECT_EQ(names, Names{});
}

TEST_P(StorageConformanceTest, RenameOntoExistingFileFails) {
  SK_ASSERT_OK(storage_->WriteAll(Path("from"), "new", false));
  SK_ASSERT_OK(storage_->WriteAll(Path("to"), "old", false));
  if (!HasDirs()) {
    ExpectRenameRefused(Path("from"), Path("to"));
  } else {
    EXPECT_EQ(storage_->Rename(Path("from"), Path("to")).code(),
              StatusCode::kAlreadyExists);
  }
  SK_ASSERT_OK_AND_ASSIGN(std::string content, storage_->ReadAll(Path("to")));
  EXPECT_EQ(content, "old");
  SK_ASSERT_OK_AND_ASSIGN(content, storage_->ReadAll(Path("from")));
  EXPECT_EQ(content, "new");
}

TEST_P(StorageConformanceTest, RenameOntoExistingDirFails) {
  SK_ASSERT_OK(storage_->CreateDir(Path("from")));
  SK_ASSERT_OK(storage_->WriteAll(Path("from/x"), "x", false));
  SK_ASSERT_OK(storage_->CreateDir(Path("empty")));
  SK_ASSERT_OK(storage_->CreateDir(Path("full")));
  SK_ASSERT_OK(storage_->WriteAll(Path("full/y"), "y", false));
  if (!HasDirs()) return ExpectRenameRefused(Path("from"), Path("full"));

  EXPECT_EQ(storage_->Rename(Path("from"), Path("empty")).code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(storage_->Rename(Path("from"), Path("full")).code(),
            StatusCode::kAlreadyExists);
  SK_ASSERT_OK_AND_ASSIGN(Names names, storage_->List(Path("full")));
  EXPECT_EQ(names, Names{"y"});
  SK_ASSERT_OK_AND_ASSIGN(names, storage_->List(Path("from")));
  EXPECT_EQ(names, Names{"x"});
}

TEST_P(StorageConformanceTest, RenameOfMissingIsNotFound) {
  if (!HasDirs()) return ExpectRenameRefused(Path("missing"), Path("to"));
  EXPECT_EQ(storage_->Rename(Path("missing"), Path("to")).code(),
            StatusCode::kNotFound);
}

// A backend that can exchange swaps whole trees; one that cannot (or a
// file system under it that cannot) answers false and changes nothing.
TEST_P(StorageConformanceTest, ExchangeSwapsDirsOrChangesNothing) {
  SK_ASSERT_OK(storage_->CreateDir(Path("new/empty")));
  SK_ASSERT_OK(storage_->WriteAll(Path("new/a"), "new", false));
  SK_ASSERT_OK(storage_->CreateDir(Path("old/sub")));
  SK_ASSERT_OK(storage_->WriteAll(Path("old/sub/b"), "old", false));
  SK_ASSERT_OK_AND_ASSIGN(bool swapped,
                          storage_->Exchange(Path("new"), Path("old")));
  if (!storage_->features().atomic_exchange) EXPECT_FALSE(swapped);
  const std::string now_new = swapped ? "old" : "new";
  const std::string now_old = swapped ? "new" : "old";
  SK_ASSERT_OK_AND_ASSIGN(Names names, storage_->List(Path(now_new)));
  EXPECT_EQ(names, (HasDirs() ? Names{"a", "empty"} : Names{"a"}));
  SK_ASSERT_OK_AND_ASSIGN(std::string content,
                          storage_->ReadAll(Path(now_new + "/a")));
  EXPECT_EQ(content, "new");
  SK_ASSERT_OK_AND_ASSIGN(names, storage_->List(Path(now_old)));
  EXPECT_EQ(names, Names{"sub"});
  SK_ASSERT_OK_AND_ASSIGN(content, storage_->ReadAll(Path(now_old + "/sub/b")));
  EXPECT_EQ(content, "old");
  SK_ASSERT_OK_AND_ASSIGN(names, storage_->List(root_));
  EXPECT_EQ(names, (Names{"new", "old"}));
}

TEST_P(StorageConformanceTest, ExchangeWithMissingIsNotFoundOrUnsupported) {
  SK_ASSERT_OK(storage_->CreateDir(Path("here")));
  SK_ASSERT_OK(storage_->WriteAll(Path("here/f"), "x", false));
  Result<bool> swapped = storage_->Exchange(Path("here"), Path("missing"));
  if (swapped.ok()) {
    EXPECT_FALSE(*swapped);
  } else {
    EXPECT_EQ(swapped.status().code(), StatusCode::kNotFound)
        << swapped.status().ToString();
  }
  SK_ASSERT_OK_AND_ASSIGN(bool exists, storage_->Exists(Path("here")));
  EXPECT_TRUE(exists);
}

// A link is a second file with the first's bytes, whole on its own: it
// outlives the deletion of the first. A backend that cannot link says so
// and creates nothing.
TEST_P(StorageConformanceTest, LinkMakesAFileThatOutlivesItsSourceOrNothing) {
  const std::string data = TestBytes(100000, 3);
  SK_ASSERT_OK(storage_->CreateDir(Path("a")));
  SK_ASSERT_OK(storage_->CreateDir(Path("b")));
  SK_ASSERT_OK(storage_->WriteAll(Path("a/data"), data, /*sync=*/true));
  SK_ASSERT_OK_AND_ASSIGN(bool linked, storage_->Link(Path("a/data"), Path("b/data")));
  SK_ASSERT_OK_AND_ASSIGN(bool exists, storage_->Exists(Path("b/data")));
  EXPECT_EQ(exists, linked);
  if (!linked) return;
  const Result<bool> again = storage_->Link(Path("a/data"), Path("b/data"));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists) << again.status().ToString();
  const Result<bool> missing = storage_->Link(Path("a/missing"), Path("b/other"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
  SK_ASSERT_OK(storage_->DeleteRecursive(Path("a")));
  SK_ASSERT_OK_AND_ASSIGN(std::string content, storage_->ReadAll(Path("b/data")));
  EXPECT_TRUE(content == data);
}

TEST_P(StorageConformanceTest, CreateDirCreatesParentsAndIsIdempotent) {
  SK_ASSERT_OK(storage_->CreateDir(Path("a/b/c")));
  SK_ASSERT_OK(storage_->CreateDir(Path("a/b/c")));
  SK_ASSERT_OK(storage_->CreateDir(Path("a")));
  if (!HasDirs()) {
    // Nothing to see until a key lands below.
    EXPECT_EQ(storage_->List(Path("a")).status().code(), StatusCode::kNotFound);
    SK_ASSERT_OK(storage_->WriteAll(Path("a/b/c/f"), "x", false));
    SK_ASSERT_OK_AND_ASSIGN(Names names, storage_->List(Path("a")));
    EXPECT_EQ(names, Names{"b"});
    return;
  }
  SK_ASSERT_OK_AND_ASSIGN(Names names, storage_->List(Path("a")));
  EXPECT_EQ(names, Names{"b"});
  SK_ASSERT_OK_AND_ASSIGN(names, storage_->List(Path("a/b/c")));
  EXPECT_EQ(names, Names{});
}

TEST_P(StorageConformanceTest, CreateDirOverFileFails) {
  SK_ASSERT_OK(storage_->WriteAll(Path("f"), "x", false));
  if (HasDirs()) {
    EXPECT_FALSE(storage_->CreateDir(Path("f")).ok());
  } else {
    // A prefix "f/" may hold keys beside the object "f"; creating it is a
    // no-op that leaves the file alone.
    SK_EXPECT_OK(storage_->CreateDir(Path("f")));
  }
  SK_ASSERT_OK_AND_ASSIGN(std::string content, storage_->ReadAll(Path("f")));
  EXPECT_EQ(content, "x");
}

TEST_P(StorageConformanceTest, SyncDirSucceeds) {
  SK_ASSERT_OK(storage_->CreateDir(Path("d")));
  SK_ASSERT_OK(storage_->WriteAll(Path("d/f"), "x", /*sync=*/true));
  SK_EXPECT_OK(storage_->SyncDir(Path("d")));
  SK_EXPECT_OK(storage_->SyncDir(root_));
}

TEST_P(StorageConformanceTest, ConcurrentReadAt) {
  const std::string data = TestBytes(1 << 20);
  SK_ASSERT_OK(storage_->WriteAll(Path("f"), data, false));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      uint64_t state = t + 1;
      std::string buffer;
      for (int i = 0; i < 200; ++i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        const uint64_t offset = (state >> 33) % data.size();
        const uint64_t size = std::min<uint64_t>((state >> 13) % 65536,
                                                 data.size() - offset);
        buffer.assign(size, '\0');
        const Status status =
            storage_->ReadAt(Path("f"), offset, size, buffer.data());
        if (!status.ok() || buffer != data.substr(offset, size)) ++failures;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_P(StorageConformanceTest, LargeFileRoundTrip) {
  const std::string data = TestBytes(16 << 20);
  SK_ASSERT_OK(storage_->WriteAll(Path("whole"), data, /*sync=*/false));
  SK_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file,
                          storage_->OpenForAppend(Path("appended")));
  for (size_t offset = 0; offset < data.size(); offset += 1 << 20) {
    SK_ASSERT_OK(file->Append(data.data() + offset, 1 << 20));
  }
  SK_ASSERT_OK(file->Close());

  for (const char* name : {"whole", "appended"}) {
    SK_ASSERT_OK_AND_ASSIGN(std::string content, storage_->ReadAll(Path(name)));
    EXPECT_TRUE(content == data) << name << ": size " << content.size();
    std::string tail(1 << 20, '\0');
    SK_ASSERT_OK(storage_->ReadAt(Path(name), data.size() - tail.size(),
                                  tail.size(), tail.data()));
    EXPECT_TRUE(tail == data.substr(data.size() - tail.size())) << name;
  }
}

// Of writers racing to create one path, exactly one succeeds; the others
// get AlreadyExists and the content stays the winner's.
TEST_P(StorageConformanceTest, WriteIfAbsentCreatesExactlyOnce) {
  if (!storage_->features().conditional_create) {
    // The default refuses and creates nothing.
    EXPECT_FALSE(storage_->WriteIfAbsent(Path("once"), "x").ok());
    SK_ASSERT_OK_AND_ASSIGN(bool exists, storage_->Exists(Path("once")));
    EXPECT_FALSE(exists);
    return;
  }
  SK_ASSERT_OK(storage_->WriteIfAbsent(Path("once"), "first"));
  const Status second = storage_->WriteIfAbsent(Path("once"), "second");
  EXPECT_EQ(second.code(), StatusCode::kAlreadyExists) << second.ToString();
  EXPECT_TRUE(testing::Has(second.message(), "once"));
  SK_ASSERT_OK_AND_ASSIGN(std::string content, storage_->ReadAll(Path("once")));
  EXPECT_EQ(content, "first");

  constexpr int kWriters = 8;
  std::vector<Status> results(kWriters);
  std::vector<std::thread> threads;
  for (int i = 0; i < kWriters; ++i) {
    threads.emplace_back([&, i] {
      results[i] = storage_->WriteIfAbsent(Path("race"),
                                           "writer " + std::to_string(i));
    });
  }
  for (std::thread& thread : threads) thread.join();
  int winner = -1;
  for (int i = 0; i < kWriters; ++i) {
    if (results[i].ok()) {
      EXPECT_EQ(winner, -1) << "writers " << winner << " and " << i
                            << " both created the path";
      winner = i;
    } else {
      EXPECT_EQ(results[i].code(), StatusCode::kAlreadyExists)
          << results[i].ToString();
    }
  }
  ASSERT_NE(winner, -1);
  SK_ASSERT_OK_AND_ASSIGN(content, storage_->ReadAll(Path("race")));
  EXPECT_EQ(content, "writer " + std::to_string(winner));
}

}  // namespace
}  // namespace shardkeep
