// A load obeys the CancellationScope of its caller: once cancelled, no new
// read starts, and Read returns Cancelled after the reads under way.
#include <gtest/gtest.h>

#include <vector>

#include "shardkeep/cancellation.h"
#include "shardkeep/checkpoint.h"
#include "storage/fault_injection.h"
#include "testing/payloads.h"
#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

TEST(ReaderCancellationTest, ACancelledReadStartsNoNewRange) {
  constexpr uint64_t kCount = 4096;
  std::vector<uint32_t> values(kCount, 3);
  auto storage = std::make_shared<FaultInjectionStorage>(NewMemoryStorage());
  SaveRequest request;
  request.path = "ckpt";
  request.parts.push_back(testdata::PytreePayload("state", {{"x", "uint32", {kCount}}}));
  request.parts[0].shards.push_back({0, DType::kUInt32, Box{{0}, {kCount}},
                                     reinterpret_cast<const uint8_t*>(values.data())});
  Options options;
  options.chunk_bytes = 256;
  options.data_file_bytes = 256;  // 64 chunks in 64 files: 64 separate reads
  options.io_threads = 2;
  SK_ASSERT_OK(Save(storage, NewSingleProcessCoordinator(), request, options));
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage, "ckpt"));

  CancellationToken token;
  storage->FailOn([&](std::string_view op, const std::string&) -> Status {
    if (op == "ReadAt") token.Cancel();
    return Status::Ok();
  });
  CancellationScope scope(token);
  // A cast (uint32 -> uint64): no chunk is read straight into place.
  std::vector<uint64_t> wide(kCount);
  Status status = reader->Read(
      "state",
      {{0, DType::kUInt64, Box{{0}, {kCount}}, reinterpret_cast<uint8_t*>(wide.data())}},
      options);
  EXPECT_EQ(status.code(), StatusCode::kCancelled) << status.ToString();
  EXPECT_LE(storage->Count("ReadAt"), 2);  // one per thread at most
}

}  // namespace
}  // namespace shardkeep
