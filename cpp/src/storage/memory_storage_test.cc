#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "shardkeep/storage.h"
#include "testing/status_matchers.h"
#include "testing/storage_conformance.h"

namespace shardkeep {
namespace {

SK_INSTANTIATE_STORAGE_CONFORMANCE(
    Memory, (StorageTestBackend{"memory", [] {
               return StorageLocation{NewMemoryStorage(), "root"};
             }}));

// The object-store mode stands in for S3 in the engine's tests, so it must
// pass the suite as S3 does.
SK_INSTANTIATE_STORAGE_CONFORMANCE(
    MemoryObjects,
    (StorageTestBackend{"memory_objects",
                        [] {
                          return StorageLocation{
                              NewMemoryStorage(MemoryStorageMode::kObjectStore),
                              "root"};
                        },
                        /*object_store=*/true}));

TEST(MemoryStorageTest, Features) {
  const StorageFeatures features = NewMemoryStorage()->features();
  EXPECT_TRUE(features.atomic_rename);
  EXPECT_FALSE(features.durable_sync);
  EXPECT_TRUE(features.atomic_exchange);
  EXPECT_TRUE(features.conditional_create);
}

TEST(MemoryStorageTest, WriteIfAbsentCreatesOnce) {
  auto storage = NewMemoryStorage();
  SK_ASSERT_OK(storage->WriteIfAbsent("d/f", "first"));
  const Status again = storage->WriteIfAbsent("d/f", "second");
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again.ToString();
  SK_ASSERT_OK_AND_ASSIGN(std::string content, storage->ReadAll("d/f"));
  EXPECT_EQ(content, "first");
  // A directory is in the way as much as a file.
  EXPECT_EQ(storage->WriteIfAbsent("d", "x").code(), StatusCode::kAlreadyExists);
}

// Of many writers racing to create one key, exactly one wins.
TEST(MemoryStorageTest, WriteIfAbsentRaceHasOneWinner) {
  for (MemoryStorageMode mode :
       {MemoryStorageMode::kFileSystem, MemoryStorageMode::kObjectStore}) {
    auto storage = NewMemoryStorage(mode);
    std::atomic<int> wins{0};
    std::vector<std::thread> writers;
    for (int i = 0; i < 8; ++i) {
      writers.emplace_back([&, i] {
        const Status s = storage->WriteIfAbsent("commit", std::to_string(i));
        if (s.ok()) {
          ++wins;
        } else {
          EXPECT_EQ(s.code(), StatusCode::kAlreadyExists) << s.ToString();
        }
      });
    }
    for (std::thread& t : writers) t.join();
    EXPECT_EQ(wins, 1);
  }
}

TEST(MemoryObjectStorageTest, FeaturesSayObjectStore) {
  const StorageFeatures features =
      NewMemoryStorage(MemoryStorageMode::kObjectStore)->features();
  EXPECT_FALSE(features.atomic_rename);
  EXPECT_FALSE(features.atomic_exchange);
  EXPECT_TRUE(features.conditional_create);
  EXPECT_FALSE(features.durable_sync);
}

TEST(MemoryObjectStorageTest, DirectoriesAreTheKeysBelowThem) {
  auto storage = NewMemoryStorage(MemoryStorageMode::kObjectStore);
  // Creating a folder stores nothing.
  SK_ASSERT_OK(storage->CreateDir("empty/sub"));
  SK_ASSERT_OK_AND_ASSIGN(bool exists, storage->Exists("empty"));
  EXPECT_FALSE(exists);
  EXPECT_EQ(storage->List("empty").status().code(), StatusCode::kNotFound);

  SK_ASSERT_OK(storage->WriteAll("a/b/c", "1", false));
  SK_ASSERT_OK(storage->WriteAll("a/b-x", "2", false));
  SK_ASSERT_OK(storage->WriteAll("a/b/d/e", "3", false));
  SK_ASSERT_OK(storage->WriteAll("a/f", "4", false));
  SK_ASSERT_OK_AND_ASSIGN(exists, storage->Exists("a/b"));
  EXPECT_TRUE(exists);
  SK_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, storage->List("a"));
  EXPECT_EQ(names, (std::vector<std::string>{"b", "b-x", "f"}));
  SK_ASSERT_OK_AND_ASSIGN(names, storage->List("a/b/"));
  EXPECT_EQ(names, (std::vector<std::string>{"c", "d"}));
  SK_ASSERT_OK_AND_ASSIGN(names, storage->List(""));
  EXPECT_EQ(names, std::vector<std::string>{"a"});

  // A key and a "folder" of the same name may coexist, as in S3.
  SK_ASSERT_OK(storage->WriteAll("a/b", "file", false));
  SK_ASSERT_OK_AND_ASSIGN(names, storage->List("a"));
  EXPECT_EQ(names, (std::vector<std::string>{"b", "b-x", "f"}));
  SK_ASSERT_OK_AND_ASSIGN(std::string content, storage->ReadAll("a/b"));
  EXPECT_EQ(content, "file");

  // The folder goes away with its last key.
  SK_ASSERT_OK(storage->DeleteRecursive("a/b"));
  SK_ASSERT_OK_AND_ASSIGN(names, storage->List("a"));
  EXPECT_EQ(names, (std::vector<std::string>{"b-x", "f"}));
  SK_ASSERT_OK(storage->DeleteFile("a/f"));
  SK_ASSERT_OK(storage->DeleteFile("a/b-x"));
  SK_ASSERT_OK_AND_ASSIGN(exists, storage->Exists("a"));
  EXPECT_FALSE(exists);
}

TEST(MemoryObjectStorageTest, NothingRenames) {
  auto storage = NewMemoryStorage(MemoryStorageMode::kObjectStore);
  SK_ASSERT_OK(storage->WriteAll("a/x", "a", false));
  SK_ASSERT_OK(storage->WriteAll("b/x", "b", false));
  const Status renamed = storage->Rename("a", "c");
  EXPECT_EQ(renamed.code(), StatusCode::kStorage);
  EXPECT_NE(renamed.message().find("cannot rename"), std::string::npos) << renamed.ToString();
  SK_ASSERT_OK_AND_ASSIGN(bool swapped, storage->Exchange("a", "b"));
  EXPECT_FALSE(swapped);
  SK_ASSERT_OK_AND_ASSIGN(std::string content, storage->ReadAll("a/x"));
  EXPECT_EQ(content, "a");
}

TEST(MemoryObjectStorageTest, WriteIfAbsentSeesOnlyTheKey) {
  auto storage = NewMemoryStorage(MemoryStorageMode::kObjectStore);
  SK_ASSERT_OK(storage->WriteAll("p/data", "x", false));
  // "p" is a prefix, not a key: it can be created.
  SK_ASSERT_OK(storage->WriteIfAbsent("p", "record"));
  EXPECT_EQ(storage->WriteIfAbsent("p", "other").code(), StatusCode::kAlreadyExists);
  SK_ASSERT_OK(storage->DeleteFile("p"));
  SK_ASSERT_OK(storage->WriteIfAbsent("p", "again"));
}

TEST(MemoryStorageTest, ExchangeSwapsAndRefusesNesting) {
  auto storage = NewMemoryStorage();
  SK_ASSERT_OK(storage->WriteAll("a/x", "a", false));
  SK_ASSERT_OK(storage->WriteAll("b", "b", false));
  SK_ASSERT_OK_AND_ASSIGN(bool swapped, storage->Exchange("a", "b"));
  EXPECT_TRUE(swapped);
  SK_ASSERT_OK_AND_ASSIGN(std::string content, storage->ReadAll("a"));
  EXPECT_EQ(content, "b");
  SK_ASSERT_OK_AND_ASSIGN(content, storage->ReadAll("b/x"));
  EXPECT_EQ(content, "a");
  EXPECT_EQ(storage->Exchange("b", "b/x").status().code(),
            StatusCode::kInvalidArgument);
}

TEST(MemoryStorageTest, StoresAreIndependent) {
  auto a = NewMemoryStorage();
  auto b = NewMemoryStorage();
  SK_ASSERT_OK(a->WriteAll("x", "1", false));
  SK_ASSERT_OK_AND_ASSIGN(bool exists, b->Exists("x"));
  EXPECT_FALSE(exists);
}

TEST(MemoryStorageTest, WritingAFileCreatesItsParents) {
  auto storage = NewMemoryStorage();
  SK_ASSERT_OK(storage->WriteAll("a/b/c", "x", false));
  SK_ASSERT_OK(storage->DeleteFile("a/b/c"));
  // Like a file system, the parents outlive the file.
  SK_ASSERT_OK_AND_ASSIGN(std::vector<std::string> names, storage->List("a"));
  EXPECT_EQ(names, std::vector<std::string>{"b"});
  SK_ASSERT_OK_AND_ASSIGN(names, storage->List(""));
  EXPECT_EQ(names, std::vector<std::string>{"a"});
}

TEST(MemoryStorageTest, AppendedBytesAreVisibleBeforeClose) {
  auto storage = NewMemoryStorage();
  SK_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file,
                          storage->OpenForAppend("f"));
  SK_ASSERT_OK(file->Append("abc", 3));
  SK_ASSERT_OK_AND_ASSIGN(std::string content, storage->ReadAll("f"));
  EXPECT_EQ(content, "abc");
  // A reader's copy is a snapshot: later appends do not change it.
  SK_ASSERT_OK(file->Append("def", 3));
  EXPECT_EQ(content, "abc");
  SK_ASSERT_OK_AND_ASSIGN(content, storage->ReadAll("f"));
  EXPECT_EQ(content, "abcdef");
  SK_ASSERT_OK(file->Close());
}

TEST(MemoryStorageTest, ReadsWhileAppending) {
  auto storage = NewMemoryStorage();
  SK_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file,
                          storage->OpenForAppend("f"));
  SK_ASSERT_OK(file->Append("0123456789", 10));
  std::atomic<bool> done{false};
  std::atomic<int> failures{0};
  std::thread reader([&] {
    char got[10];
    while (!done) {
      if (!storage->ReadAt("f", 0, 10, got).ok() ||
          std::string(got, 10) != "0123456789") {
        ++failures;
      }
    }
  });
  for (int i = 0; i < 2000; ++i) SK_ASSERT_OK(file->Append("abcdefghij", 10));
  done = true;
  reader.join();
  SK_ASSERT_OK(file->Close());
  EXPECT_EQ(failures.load(), 0);
  SK_ASSERT_OK_AND_ASSIGN(uint64_t size, storage->FileSize("f"));
  EXPECT_EQ(size, 20010u);
}

TEST(MemoryStorageTest, AppendAfterDeleteFails) {
  auto storage = NewMemoryStorage();
  SK_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file,
                          storage->OpenForAppend("f"));
  SK_ASSERT_OK(storage->DeleteFile("f"));
  EXPECT_EQ(file->Append("x", 1).code(), StatusCode::kStorage);
}

TEST(MemoryStorageTest, RenameIntoItselfIsInvalid) {
  auto storage = NewMemoryStorage();
  SK_ASSERT_OK(storage->CreateDir("d"));
  EXPECT_EQ(storage->Rename("d", "d/sub").code(),
            StatusCode::kInvalidArgument);
}

TEST(MemoryStorageTest, WriteOntoADirectoryFails) {
  auto storage = NewMemoryStorage();
  SK_ASSERT_OK(storage->CreateDir("d"));
  EXPECT_EQ(storage->WriteAll("d", "x", false).code(), StatusCode::kStorage);
}

}  // namespace
}  // namespace shardkeep
