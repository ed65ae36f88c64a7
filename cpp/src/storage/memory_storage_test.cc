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

TEST(MemoryStorageTest, Features) {
  const StorageFeatures features = NewMemoryStorage()->features();
  EXPECT_TRUE(features.atomic_rename);
  EXPECT_FALSE(features.durable_sync);
  EXPECT_TRUE(features.atomic_exchange);
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
