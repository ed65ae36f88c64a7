#include <gtest/gtest.h>

#include <filesystem>

#include "shardkeep/storage.h"
#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

TEST(ResolveStorageTest, PlainPathsAndFileUrlsUseTheFileBackend) {
  // The file backend opens the location's key (location_test.cc).
  const std::string cwd = std::filesystem::current_path().string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/x/y", "/x/y"},          {"x/y", cwd + "/x/y"},
      {"/x/y/", "/x/y"},         {"/x/y//", "/x/y"},
      {"/", "/"},                {"file:///x/y", "/x/y"},
      {"file://x/y/", cwd + "/x/y"},    {"file:///", "/"},
      {"dir/a://b", cwd + "/dir/a:/b"},  // not a scheme: contains '/'
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
  const Status gopher = ResolveStorage("gopher://host/x").status();
  EXPECT_EQ(gopher.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(gopher.message().find("'gopher'"), std::string::npos)
      << gopher.ToString();
}

S3Overrides TestS3Overrides() {
  S3Overrides overrides;
  overrides.access_key_id = "AKIDRESOLVE";
  overrides.secret_access_key = "resolve-secret";
  overrides.region = "eu-west-1";
  overrides.endpoint_url = "http://127.0.0.1:9";
  return overrides;
}

TEST(ResolveStorageTest, S3UrlsShareOneStoragePerConfigAndBucket) {
  const S3Overrides overrides = TestS3Overrides();
  SK_ASSERT_OK_AND_ASSIGN(
      StorageLocation a, ResolveStorage("s3://resolve-bucket/runs/a/", overrides));
  EXPECT_EQ(a.path, "runs/a");
  const StorageFeatures features = a.storage->features();
  EXPECT_TRUE(features.conditional_create);
  EXPECT_TRUE(features.durable_sync);
  EXPECT_FALSE(features.atomic_rename);

  SK_ASSERT_OK_AND_ASSIGN(
      StorageLocation b, ResolveStorage("s3://resolve-bucket/runs/b", overrides));
  EXPECT_EQ(b.storage, a.storage);

  SK_ASSERT_OK_AND_ASSIGN(
      StorageLocation other_bucket,
      ResolveStorage("s3://resolve-other/runs/a", overrides));
  EXPECT_NE(other_bucket.storage, a.storage);
  S3Overrides other_secret = overrides;
  other_secret.secret_access_key = "another-secret";
  SK_ASSERT_OK_AND_ASSIGN(StorageLocation c,
                          ResolveStorage("s3://resolve-bucket/runs/a",
                                         other_secret));
  EXPECT_NE(c.storage, a.storage);
  S3Overrides short_timeout = overrides;
  short_timeout.timeout_s = 5;
  SK_ASSERT_OK_AND_ASSIGN(StorageLocation d,
                          ResolveStorage("s3://resolve-bucket/runs/a",
                                         short_timeout));
  EXPECT_NE(d.storage, a.storage);
}

TEST(ResolveStorageTest, S3TimeoutBoundsRetries) {
  // Nothing listens on port 9 of the loopback: every attempt is refused,
  // and the request gives up once timeout_s has passed.
  S3Overrides overrides = TestS3Overrides();
  overrides.timeout_s = 0.5;
  SK_ASSERT_OK_AND_ASSIGN(StorageLocation location,
                          ResolveStorage("s3://resolve-bucket/t", overrides));
  const Status status = location.storage->ReadAll(location.path + "/f").status();
  EXPECT_EQ(status.code(), StatusCode::kStorage) << status.ToString();
  EXPECT_NE(status.message().find("s3://resolve-bucket/t/f"), std::string::npos)
      << status.ToString();
  EXPECT_NE(status.message().find("timeout_s is 0.5"), std::string::npos)
      << status.ToString();
  EXPECT_EQ(status.message().find("resolve-secret"), std::string::npos);
}

TEST(ResolveStorageTest, RejectsMalformedS3Urls) {
  const S3Overrides overrides = TestS3Overrides();
  for (const char* url : {"s3://resolve-bucket", "s3://resolve-bucket/",
                          "s3://ab/x", "s3://bucket/a//b"}) {
    const Status status = ResolveStorage(url, overrides).status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument)
        << url << ": " << status.ToString();
    EXPECT_NE(status.message().find(url), std::string::npos)
        << status.ToString();
  }
  S3Overrides zero = overrides;
  zero.timeout_s = 0;
  EXPECT_EQ(ResolveStorage("s3://resolve-bucket/x", zero).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardkeep
