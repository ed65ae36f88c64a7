#include "storage/fault_injection.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "testing/status_matchers.h"
#include "testing/storage_conformance.h"

namespace shardkeep {
namespace {

// With no hook the wrapper must behave exactly like what it wraps.
SK_INSTANTIATE_STORAGE_CONFORMANCE(
    FaultInjection, (StorageTestBackend{"fault_injection_over_memory", [] {
                       return StorageLocation{
                           std::make_shared<FaultInjectionStorage>(
                               NewMemoryStorage()),
                           "root"};
                     }}));

class FaultInjectionTest : public ::testing::Test {
 protected:
  std::shared_ptr<Storage> base_ = NewMemoryStorage();
  FaultInjectionStorage storage_{base_};
};

TEST_F(FaultInjectionTest, InjectedFailureSurfacesAndSkipsTheBackend) {
  storage_.FailOn([](std::string_view op, const std::string& path) {
    if (op == "WriteAll" && path == "d/bad") return StorageError("injected");
    return Status::Ok();
  });
  SK_ASSERT_OK(storage_.WriteAll("d/good", "x", false));
  const Status status = storage_.WriteAll("d/bad", "x", false);
  EXPECT_EQ(status.code(), StatusCode::kStorage);
  EXPECT_EQ(status.message(), "injected");
  SK_ASSERT_OK_AND_ASSIGN(bool exists, base_->Exists("d/bad"));
  EXPECT_FALSE(exists);
  SK_ASSERT_OK_AND_ASSIGN(exists, base_->Exists("d/good"));
  EXPECT_TRUE(exists);
}

TEST_F(FaultInjectionTest, FailsWritableFileCalls) {
  int appends = 0;
  storage_.FailOn([&](std::string_view op, const std::string&) {
    if (op == "Append" && ++appends == 2) return StorageError("disk full");
    if (op == "Sync") return StorageError("fsync failed");
    return Status::Ok();
  });
  SK_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file,
                          storage_.OpenForAppend("f"));
  SK_ASSERT_OK(file->Append("a", 1));
  EXPECT_EQ(file->Append("b", 1).code(), StatusCode::kStorage);
  SK_ASSERT_OK(file->Append("c", 1));
  EXPECT_EQ(file->Sync().code(), StatusCode::kStorage);
  SK_ASSERT_OK(file->Close());
  SK_ASSERT_OK_AND_ASSIGN(std::string content, base_->ReadAll("f"));
  EXPECT_EQ(content, "ac");
}

TEST_F(FaultInjectionTest, EveryOperationCanBeFailed) {
  SK_ASSERT_OK(base_->WriteAll("d/f", "x", false));
  storage_.FailOn([](std::string_view op, const std::string&) {
    return StorageError("injected " + std::string(op));
  });
  char byte;
  std::vector<Status> statuses = {
      storage_.ReadAt("d/f", 0, 1, &byte),
      storage_.ReadAll("d/f").status(),
      storage_.FileSize("d/f").status(),
      storage_.WriteAll("d/f", "y", true),
      storage_.OpenForAppend("d/g").status(),
      storage_.Exists("d/f").status(),
      storage_.List("d").status(),
      storage_.CreateDir("e"),
      storage_.DeleteFile("d/f"),
      storage_.DeleteRecursive("d"),
      storage_.Rename("d", "e"),
      storage_.SyncDir("d"),
      storage_.Exchange("d", "e").status(),
      storage_.WriteIfAbsent("d/h", "z"),
  };
  for (const Status& status : statuses) {
    EXPECT_EQ(status.code(), StatusCode::kStorage) << status.ToString();
  }
  SK_ASSERT_OK_AND_ASSIGN(std::string content, base_->ReadAll("d/f"));
  EXPECT_EQ(content, "x");
  for (const char* op :
       {"ReadAt", "ReadAll", "FileSize", "WriteAll", "OpenForAppend", "Exists",
        "List", "CreateDir", "DeleteFile", "DeleteRecursive", "Rename",
        "SyncDir", "Exchange", "WriteIfAbsent"}) {
    EXPECT_EQ(storage_.Count(op), 1) << op;
  }
  SK_ASSERT_OK_AND_ASSIGN(bool exists, base_->Exists("d/h"));
  EXPECT_FALSE(exists);
}

TEST_F(FaultInjectionTest, ForwardsWriteIfAbsent) {
  SK_ASSERT_OK(storage_.WriteIfAbsent("f", "first"));
  EXPECT_EQ(storage_.WriteIfAbsent("f", "second").code(), StatusCode::kAlreadyExists);
  SK_ASSERT_OK_AND_ASSIGN(std::string content, base_->ReadAll("f"));
  EXPECT_EQ(content, "first");
  EXPECT_EQ(storage_.Count("WriteIfAbsent"), 2);
}

TEST_F(FaultInjectionTest, LostAnswerFollowsTheChange) {
  storage_.LoseAnswerOn([](std::string_view op, const std::string& path) {
    if (op == "WriteIfAbsent") return StorageError("connection reset after " + path);
    return Status::Ok();
  });
  const Status status = storage_.WriteIfAbsent("f", "stored");
  EXPECT_EQ(status.code(), StatusCode::kStorage);
  EXPECT_EQ(status.message(), "connection reset after f");
  SK_ASSERT_OK_AND_ASSIGN(std::string content, base_->ReadAll("f"));
  EXPECT_EQ(content, "stored");
  // A call that failed by itself keeps its own answer.
  EXPECT_EQ(storage_.WriteIfAbsent("f", "again").code(), StatusCode::kAlreadyExists);
  SK_ASSERT_OK(storage_.WriteAll("g", "g", false));
}

TEST_F(FaultInjectionTest, OverriddenFeaturesHideExchange) {
  SK_ASSERT_OK(base_->WriteAll("a", "a", false));
  SK_ASSERT_OK(base_->WriteAll("b", "b", false));
  EXPECT_TRUE(storage_.features().atomic_exchange);
  storage_.OverrideFeatures({.atomic_rename = true});
  EXPECT_FALSE(storage_.features().atomic_exchange);
  SK_ASSERT_OK_AND_ASSIGN(bool swapped, storage_.Exchange("a", "b"));
  EXPECT_FALSE(swapped);
  SK_ASSERT_OK_AND_ASSIGN(std::string content, base_->ReadAll("a"));
  EXPECT_EQ(content, "a");
  EXPECT_EQ(storage_.Count("Exchange"), 1);
}

TEST_F(FaultInjectionTest, CountsCallsIncludingFailedOnes) {
  EXPECT_EQ(storage_.Count("Sync"), 0);
  for (int i = 0; i < 3; ++i) {
    SK_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file,
                            storage_.OpenForAppend("f" + std::to_string(i)));
    SK_ASSERT_OK(file->Append("x", 1));
    SK_ASSERT_OK(file->Sync());
    SK_ASSERT_OK(file->Close());
  }
  SK_ASSERT_OK(storage_.SyncDir(""));
  EXPECT_EQ(storage_.Count("OpenForAppend"), 3);
  EXPECT_EQ(storage_.Count("Sync"), 3);
  EXPECT_EQ(storage_.Count("SyncDir"), 1);

  storage_.FailOn([](std::string_view, const std::string&) {
    return StorageError("injected");
  });
  EXPECT_FALSE(storage_.SyncDir("").ok());
  EXPECT_EQ(storage_.Count("SyncDir"), 2);

  storage_.FailOn(nullptr);
  SK_EXPECT_OK(storage_.SyncDir(""));
}

TEST_F(FaultInjectionTest, CountsAreThreadSafe) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) (void)storage_.Exists("x");
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(storage_.Count("Exists"), 8000);
}

TEST_F(FaultInjectionTest, FileOutlivesTheStorage) {
  auto storage = std::make_shared<FaultInjectionStorage>(base_);
  SK_ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> file,
                          storage->OpenForAppend("f"));
  storage.reset();
  SK_ASSERT_OK(file->Append("x", 1));
  SK_ASSERT_OK(file->Close());
}

}  // namespace
}  // namespace shardkeep
