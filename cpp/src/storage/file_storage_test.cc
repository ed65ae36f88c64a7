#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "shardkeep/storage.h"
#include "testing/status_matchers.h"
#include "testing/storage_conformance.h"

namespace shardkeep {
namespace {

using Names = std::vector<std::string>;

SK_INSTANTIATE_STORAGE_CONFORMANCE(
    File, (StorageTestBackend{"file", [] {
             return StorageLocation{NewFileStorage(), MakeTempDir()};
           }}));

class FileStorageTest : public ::testing::Test {
 protected:
  void TearDown() override {
    ::chmod(root_.c_str(), 0755);
    SK_EXPECT_OK(storage_->DeleteRecursive(root_));
  }

  std::shared_ptr<Storage> storage_ = NewFileStorage();
  const std::string root_ = MakeTempDir();
};

TEST_F(FileStorageTest, Features) {
  EXPECT_TRUE(storage_->features().atomic_rename);
  EXPECT_TRUE(storage_->features().durable_sync);
  EXPECT_TRUE(storage_->features().atomic_exchange);
}

// A file where a directory should be fails for root too (unlike a
// read-only directory, which root may write into anyway).
TEST_F(FileStorageTest, WriteUnderAFileFailsNamingThePath) {
  SK_ASSERT_OK(storage_->WriteAll(root_ + "/plain", "x", false));
  const std::string path = root_ + "/plain/f";
  const Status status = storage_->WriteAll(path, "x", false);
  EXPECT_EQ(status.code(), StatusCode::kStorage);
  EXPECT_NE(status.message().find(path), std::string::npos)
      << status.ToString();
  EXPECT_EQ(storage_->OpenForAppend(path).status().code(),
            StatusCode::kStorage);
}

// /dev/full fails every write with ENOSPC, as a full disk would: the error
// says so and how much space its file system has left.
TEST_F(FileStorageTest, FullDiskIsOutOfSpaceNamingThePathAndFreeBytes) {
  const Status status = storage_->WriteAll("/dev/full", "x", false);
  EXPECT_EQ(status.code(), StatusCode::kOutOfSpace);
  EXPECT_TRUE(status.message().starts_with(
      "write /dev/full: No space left on device ("))
      << status.ToString();
  EXPECT_TRUE(status.message().ends_with(" bytes free on its file system)"))
      << status.ToString();

  // Appends create their file, so they cannot be pointed at /dev/full:
  // python/tests/test_out_of_space.py fills a real small file system
  // through them instead.
  EXPECT_EQ(storage_->OpenForAppend("/dev/full").status().code(),
            StatusCode::kAlreadyExists);
}

TEST_F(FileStorageTest, DeleteRecursiveDoesNotFollowSymlinks) {
  const std::string outside = MakeTempDir();
  SK_ASSERT_OK(storage_->WriteAll(outside + "/precious", "keep", false));
  SK_ASSERT_OK(storage_->CreateDir(root_ + "/tree/sub"));
  ASSERT_EQ(::symlink(outside.c_str(), (root_ + "/tree/sub/dir_link").c_str()),
            0);
  ASSERT_EQ(::symlink((outside + "/precious").c_str(),
                      (root_ + "/tree/file_link").c_str()),
            0);

  SK_ASSERT_OK(storage_->DeleteRecursive(root_ + "/tree"));
  SK_ASSERT_OK_AND_ASSIGN(bool exists, storage_->Exists(root_ + "/tree"));
  EXPECT_FALSE(exists);
  SK_ASSERT_OK_AND_ASSIGN(std::string content,
                          storage_->ReadAll(outside + "/precious"));
  EXPECT_EQ(content, "keep");

  // A symlink given as the root itself is removed, not its target.
  ASSERT_EQ(::symlink(outside.c_str(), (root_ + "/root_link").c_str()), 0);
  SK_ASSERT_OK(storage_->DeleteRecursive(root_ + "/root_link"));
  SK_ASSERT_OK_AND_ASSIGN(exists, storage_->Exists(outside + "/precious"));
  EXPECT_TRUE(exists);
  SK_EXPECT_OK(storage_->DeleteRecursive(outside));
}

TEST_F(FileStorageTest, UnicodeAndSpacesInNames) {
  const std::string dir = root_ + "/Prüfung 日本";
  SK_ASSERT_OK(storage_->CreateDir(dir));
  SK_ASSERT_OK(storage_->WriteAll(dir + "/a file.bin", "x", false));
  SK_ASSERT_OK_AND_ASSIGN(Names names, storage_->List(root_));
  EXPECT_EQ(names, Names{"Prüfung 日本"});
  SK_ASSERT_OK_AND_ASSIGN(names, storage_->List(dir));
  EXPECT_EQ(names, Names{"a file.bin"});
  SK_ASSERT_OK(storage_->Rename(dir, root_ + "/ñ moved"));
  SK_ASSERT_OK_AND_ASSIGN(std::string content,
                          storage_->ReadAll(root_ + "/ñ moved/a file.bin"));
  EXPECT_EQ(content, "x");
}

TEST_F(FileStorageTest, MissingParentIsNotFound) {
  const Status status = storage_->WriteAll(root_ + "/no/such/f", "x", false);
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_NE(status.message().find(root_ + "/no/such/f"), std::string::npos);
}

TEST_F(FileStorageTest, ListOfAFileIsAStorageError) {
  SK_ASSERT_OK(storage_->WriteAll(root_ + "/f", "x", false));
  EXPECT_EQ(storage_->List(root_ + "/f").status().code(),
            StatusCode::kStorage);
}

TEST_F(FileStorageTest, FileForgottenOpenIsClosedWithItsData) {
  {
    SK_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file,
                            storage_->OpenForAppend(root_ + "/f"));
    SK_ASSERT_OK(file->Append("abc", 3));
  }
  SK_ASSERT_OK_AND_ASSIGN(std::string content, storage_->ReadAll(root_ + "/f"));
  EXPECT_EQ(content, "abc");
}

TEST_F(FileStorageTest, WrittenFilesHaveMode0644) {
  SK_ASSERT_OK(storage_->WriteAll(root_ + "/f", "x", false));
  const mode_t old_umask = ::umask(0);
  ::umask(old_umask);
  struct stat st;
  ASSERT_EQ(::stat((root_ + "/f").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u & ~old_umask);
}

}  // namespace
}  // namespace shardkeep
