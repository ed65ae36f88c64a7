// StartSave's background thread: exceptions escaping into it become the
// save's error, and SaveHandle::Cancel stops a save from committing.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>

#include "shardkeep/checkpoint.h"
#include "storage/fault_injection.h"
#include "testing/payloads.h"
#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

struct Payload {
  std::vector<int32_t> values = std::vector<int32_t>(1000, 7);
  SaveRequest Request(const std::string& path) const {
    SaveRequest request;
    request.path = path;
    CheckpointablePayload part =
        testdata::PytreePayload("state", {{"x", "int32", {1000}}});
    part.shards.push_back({0, DType::kInt32, Box{{0}, {1000}},
                           reinterpret_cast<const uint8_t*>(values.data())});
    request.parts.push_back(std::move(part));
    return request;
  }
};

Options Small() {
  Options options;
  options.chunk_bytes = 400;  // 10 chunks
  options.io_threads = 2;
  options.timeout_s = 5;
  return options;
}

// A single-process coordinator whose barrier runs `on_barrier` first.
std::shared_ptr<Coordinator> CoordinatorWithBarrier(
    std::function<void(const std::string& key)> on_barrier) {
  auto local = NewSingleProcessCoordinator();
  CoordinatorFunctions functions;
  functions.barrier = [local, on_barrier](const std::string& key, double timeout_s) {
    on_barrier(key);
    return local->Barrier(key, timeout_s);
  };
  functions.set = [local](const std::string& key, const std::string& value) {
    return local->KeyValueSet(key, value);
  };
  functions.get = [local](const std::string& key, double timeout_s) {
    return local->KeyValueGet(key, timeout_s);
  };
  functions.try_get = [local](const std::string& key) { return local->KeyValueTryGet(key); };
  functions.list = [local](const std::string& prefix) { return local->KeyValueList(prefix); };
  functions.remove = [local](const std::string& key) { return local->KeyValueDelete(key); };
  return NewCallbackCoordinator(0, 1, std::move(functions));
}

bool Committed(Storage& storage, const std::string& path) {
  Result<bool> exists = storage.Exists(path + "/_SHARDKEEP");
  return exists.ok() && *exists;
}

TEST(SaveThreadTest, ExceptionFromACoordinatorCallbackFailsTheSave) {
  Payload payload;
  auto storage = NewMemoryStorage();
  auto coordinator = CoordinatorWithBarrier([](const std::string& key) {
    if (key.ends_with("/written")) throw std::runtime_error("bridge raised");
  });
  SK_ASSERT_OK_AND_ASSIGN(auto handle,
                          StartSave(storage, coordinator, payload.Request("ckpt"), Small()));
  Status status = *handle->future().Wait(-1);
  EXPECT_EQ(status.code(), StatusCode::kInternal) << status.ToString();
  EXPECT_NE(status.message().find("background phase of the save of ckpt"),
            std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("bridge raised"), std::string::npos);
  EXPECT_FALSE(Committed(*storage, "ckpt"));
}

TEST(SaveThreadTest, ExceptionInTheBlockingPhaseIsReturned) {
  Payload payload;
  auto coordinator = CoordinatorWithBarrier([](const std::string&) { throw 1; });
  Result<std::unique_ptr<SaveHandle>> handle =
      StartSave(NewMemoryStorage(), coordinator, payload.Request("ckpt"), Small());
  EXPECT_EQ(handle.status().code(), StatusCode::kInternal);
  EXPECT_NE(handle.status().message().find("blocking phase of the save of ckpt"),
            std::string::npos);
}

TEST(SaveThreadTest, BadAllocWhileWritingIsResourceExhausted) {
  Payload payload;
  auto storage = std::make_shared<FaultInjectionStorage>(NewMemoryStorage());
  storage->FailOn([](std::string_view op, const std::string&) -> Status {
    if (op == "Append") throw std::bad_alloc();
    return Status::Ok();
  });
  Status status = Save(storage, NewSingleProcessCoordinator(), payload.Request("ckpt"),
                       Small());
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.ToString();
  EXPECT_FALSE(Committed(*storage, "ckpt"));
}

TEST(SaveThreadTest, CancelBeforeTheCommitMeansItNeverCommits) {
  Payload payload;
  auto storage = NewMemoryStorage();
  std::atomic<bool> release{false};
  auto coordinator = CoordinatorWithBarrier([&](const std::string& key) {
    if (!key.ends_with("/written")) return;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  SK_ASSERT_OK_AND_ASSIGN(auto handle,
                          StartSave(storage, coordinator, payload.Request("ckpt"), Small()));
  SK_EXPECT_OK(handle->Cancel());
  release = true;
  Status status = *handle->future().Wait(-1);
  EXPECT_FALSE(status.ok());
  EXPECT_FALSE(Committed(*storage, "ckpt"));
  SK_EXPECT_OK(handle->Cancel());  // still not committing
}

TEST(SaveThreadTest, CancelWhileWritingStopsTheWriters) {
  Payload payload;
  auto storage = std::make_shared<FaultInjectionStorage>(NewMemoryStorage());
  std::atomic<bool> release{false};
  storage->FailOn([&](std::string_view op, const std::string&) -> Status {
    if (op == "Append") {
      while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return Status::Ok();
  });
  SK_ASSERT_OK_AND_ASSIGN(auto handle,
                          StartSave(storage, NewSingleProcessCoordinator(),
                                    payload.Request("ckpt"), Small()));
  SK_EXPECT_OK(handle->Cancel());
  release = true;
  Status status = *handle->future().Wait(-1);
  EXPECT_EQ(status.code(), StatusCode::kCancelled) << status.ToString();
  EXPECT_LE(storage->Count("Append"), 4);  // of 10 chunks and their padding
  EXPECT_FALSE(Committed(*storage, "ckpt"));
}

TEST(SaveThreadTest, CancelAfterTheCommitReportsItCommitted) {
  Payload payload;
  auto storage = NewMemoryStorage();
  SK_ASSERT_OK_AND_ASSIGN(auto handle,
                          StartSave(storage, NewSingleProcessCoordinator(),
                                    payload.Request("ckpt"), Small()));
  SK_ASSERT_OK(*handle->future().Wait(-1));
  EXPECT_EQ(handle->Cancel().code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(Committed(*storage, "ckpt"));
}

}  // namespace
}  // namespace shardkeep
