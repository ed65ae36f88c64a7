#include <gtest/gtest.h>

#include "shardkeep/storage.h"
#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

TEST(ResolveStorageTest, PlainPathsAndFileUrlsUseTheFileBackend) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/x/y", "/x/y"},          {"x/y", "x/y"},
      {"/x/y/", "/x/y"},         {"/x/y//", "/x/y"},
      {"/", "/"},                {"file:///x/y", "/x/y"},
      {"file://x/y/", "x/y"},    {"file:///", "/"},
      {"dir/a://b", "dir/a://b"},  // not a scheme: contains '/'
  };
  for (const auto& [url, path] : cases) {
    SK_ASSERT_OK_AND_ASSIGN(StorageLocation location, ResolveStorage(url));
    EXPECT_EQ(location.path, path) << url;
    EXPECT_TRUE(location.storage->features().durable_sync) << url;
  }
}

TEST(ResolveStorageTest, MemoryUrlsShareOneStore) {
  SK_ASSERT_OK_AND_ASSIGN(StorageLocation a,
                          ResolveStorage("memory://resolve_test/a/"));
  EXPECT_EQ(a.path, "resolve_test/a");
  EXPECT_FALSE(a.storage->features().durable_sync);
  SK_ASSERT_OK(a.storage->WriteAll(a.path + "/f", "shared", false));

  SK_ASSERT_OK_AND_ASSIGN(StorageLocation b,
                          ResolveStorage("memory://resolve_test"));
  EXPECT_EQ(b.storage, a.storage);
  SK_ASSERT_OK_AND_ASSIGN(std::string content,
                          b.storage->ReadAll(b.path + "/a/f"));
  EXPECT_EQ(content, "shared");
  SK_ASSERT_OK(b.storage->DeleteRecursive(b.path));
}

TEST(ResolveStorageTest, MemoryObjectUrlsShareOneObjectStore) {
  SK_ASSERT_OK_AND_ASSIGN(StorageLocation a,
                          ResolveStorage("memory-objects://resolve_test/a/"));
  EXPECT_EQ(a.path, "resolve_test/a");
  EXPECT_FALSE(a.storage->features().atomic_rename);
  EXPECT_TRUE(a.storage->features().conditional_create);
  SK_ASSERT_OK(a.storage->WriteAll(a.path + "/f", "objects", false));

  SK_ASSERT_OK_AND_ASSIGN(StorageLocation b,
                          ResolveStorage("memory-objects://resolve_test"));
  EXPECT_EQ(b.storage, a.storage);
  SK_ASSERT_OK_AND_ASSIGN(std::string content,
                          b.storage->ReadAll(b.path + "/a/f"));
  EXPECT_EQ(content, "objects");
  // Not the memory:// store.
  SK_ASSERT_OK_AND_ASSIGN(StorageLocation plain,
                          ResolveStorage("memory://resolve_test"));
  EXPECT_NE(plain.storage, a.storage);
  SK_ASSERT_OK(b.storage->DeleteRecursive(b.path));
}

TEST(ResolveStorageTest, RejectsEmptyPaths) {
  for (const char* url : {"", "memory://", "memory-objects://", "file://"}) {
    EXPECT_EQ(ResolveStorage(url).status().code(),
              StatusCode::kInvalidArgument)
        << url;
  }
}

TEST(ResolveStorageTest, RejectsUnknownSchemes) {
  const Status s3 = ResolveStorage("s3://bucket/prefix").status();
  EXPECT_EQ(s3.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s3.message().find("not supported yet"), std::string::npos)
      << s3.ToString();

  const Status gopher = ResolveStorage("gopher://host/x").status();
  EXPECT_EQ(gopher.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(gopher.message().find("'gopher'"), std::string::npos)
      << gopher.ToString();
}

}  // namespace
}  // namespace shardkeep
