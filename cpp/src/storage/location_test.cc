#include "shardkeep/location.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

Location Parsed(const std::string& url) {
  Result<Location> location = ParseLocation(url);
  EXPECT_TRUE(location.ok()) << url << ": " << location.status().ToString();
  return location.ok() ? *location : Location();
}

TEST(LocationTest, SpellingsOfOneLocalFolderShareAKey) {
  // file:///a and /a were two checkpoints to the Python front's key and one
  // store to the binding's; they are one checkpoint now.
  for (const char* url : {"/a", "/a/", "/a//", "file:///a", "file:///a/", "/b/../a",
                          "/./a", "//a", "/a/b/..", "file:///b/../a/."}) {
    const Location location = Parsed(url);
    EXPECT_EQ(location.key, "/a") << url;
    EXPECT_EQ(location.local_path, "/a") << url;
    EXPECT_EQ(location.path, "/a") << url;
    EXPECT_EQ(location.scheme, "file") << url;
    EXPECT_EQ(location.storage, "file") << url;
    EXPECT_FALSE(location.object_store) << url;
  }
  EXPECT_NE(Parsed("/a").key, Parsed("/ab").key);
  EXPECT_EQ(Parsed("/..").key, "/");
  EXPECT_EQ(Parsed("/").key, "/");
}

TEST(LocationTest, RelativePathsAreKeyedByTheWorkingDirectory) {
  const std::string cwd = std::filesystem::current_path().string();
  const std::string parent = std::filesystem::current_path().parent_path().string();
  EXPECT_EQ(Parsed("x/y").key, cwd + "/x/y");
  EXPECT_EQ(Parsed("file://x/y/").key, cwd + "/x/y");
  EXPECT_EQ(Parsed("./x/../y").local_path, cwd + "/y");
  EXPECT_EQ(Parsed("../z").key, parent + "/z");
  // The backend opens the key: the folder the key names.
  EXPECT_EQ(Parsed("x/y/").path, cwd + "/x/y");
  EXPECT_EQ(Parsed("file:///x/../y/").path, "/y");
}

TEST(LocationTest, AStringWithoutASchemeBeforeItsSeparatorIsAPath) {
  const Location location = Parsed("/d/a://b");
  EXPECT_EQ(location.scheme, "file");
  EXPECT_EQ(location.key, "/d/a:/b");  // as the file system reads "//"
  EXPECT_EQ(Parsed("1x://b").scheme, "file");  // a scheme starts with a letter
}

TEST(LocationTest, ObjectStoreKeysKeepTheirPath) {
  const Location s3 = Parsed("s3://bucket-1/runs/a/");
  EXPECT_EQ(s3.scheme, "s3");
  EXPECT_EQ(s3.storage, "s3://bucket-1");
  EXPECT_EQ(s3.key, "s3://bucket-1/runs/a");
  EXPECT_EQ(s3.path, "runs/a");
  EXPECT_EQ(s3.local_path, std::nullopt);
  EXPECT_TRUE(s3.object_store);
  EXPECT_EQ(Parsed("s3://bucket-1/runs/b").storage, s3.storage);
  EXPECT_NE(Parsed("s3://bucket-2/runs/a").storage, s3.storage);

  const Location memory = Parsed("memory://run/a/");
  EXPECT_EQ(memory.storage, "memory");
  EXPECT_EQ(memory.key, "memory://run/a");
  EXPECT_EQ(memory.path, "run/a");
  EXPECT_FALSE(memory.object_store);
  // Not normalised: a memory store's (or an object store's) ".." is a name.
  EXPECT_EQ(Parsed("memory://run/b/../a").key, "memory://run/b/../a");

  const Location objects = Parsed("memory-objects://run");
  EXPECT_EQ(objects.storage, "memory-objects");
  EXPECT_NE(objects.storage, memory.storage);
  EXPECT_TRUE(objects.object_store);
  EXPECT_EQ(objects.local_path, std::nullopt);
}

TEST(LocationTest, GcsBucketsAreStoresOfTheirOwn) {
  const Location gs = Parsed("gs://bucket-1/runs/a/");
  EXPECT_EQ(gs.scheme, "gs");
  EXPECT_EQ(gs.storage, "gs://bucket-1");
  EXPECT_EQ(gs.key, "gs://bucket-1/runs/a");
  EXPECT_EQ(gs.path, "runs/a");
  EXPECT_EQ(gs.local_path, std::nullopt);
  EXPECT_TRUE(gs.object_store);
  // Dotted names may be longer; a bucket of one name on S3 is another store.
  EXPECT_EQ(Parsed("gs://a.b.c/x").storage, "gs://a.b.c");
  EXPECT_NE(Parsed("s3://bucket-1/runs/a").storage, gs.storage);
}

TEST(LocationTest, RefusesWhatNoBackendReads) {
  for (const char* url : {"", "file://", "memory://", "gopher://h/x", "s3://bucket", "s3://ab/x",
                          "s3://bucket/a//b", "s3://bucket/../x", "gs://b/p", "gs://bucket",
                          "gs://Bucket/x", "gs://goog-x/y", "gs://bucket/a/./b"}) {
    const Status status = ParseLocation(url).status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << url;
    EXPECT_NE(status.message().find(url), std::string::npos) << status.ToString();
  }
  EXPECT_NE(ParseLocation("gopher://h/x").status().message().find("unknown scheme 'gopher'"),
            std::string::npos);
}

}  // namespace
}  // namespace shardkeep
