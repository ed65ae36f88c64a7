// Decoding a chunk index of 10,000 records (what a reader parses per
// process file before planning a restore), and encoding it for reference.
#include <cstdint>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "format/index.h"

namespace {

using shardkeep::format::ChunkRecord;

std::vector<ChunkRecord> MakeRecords(size_t count) {
  std::vector<ChunkRecord> records(count);
  uint64_t offset = 0;
  for (size_t i = 0; i < count; ++i) {
    ChunkRecord& r = records[i];
    r.leaf = static_cast<uint32_t>(i / 4);
    r.data_file = static_cast<uint32_t>(i % 2);
    r.stored_length = r.raw_length = 1 << 20;
    r.offset = offset;
    offset += r.stored_length;
    r.checksum = 0x9e3779b97f4a7c15ULL * (i + 1);
    r.box.origin = {(i % 4) * 1024, 0};
    r.box.shape = {1024, 4096};
  }
  return records;
}

void BM_DecodeIndex_10k(benchmark::State& state) {
  const std::string bytes = shardkeep::format::EncodeIndex(MakeRecords(10000));
  for (auto _ : state) {
    auto records = shardkeep::format::DecodeIndex(bytes, "index/p0.idx");
    if (!records.ok()) state.SkipWithError("DecodeIndex failed");
    benchmark::DoNotOptimize(records);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * 10000);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(bytes.size()));
}
BENCHMARK(BM_DecodeIndex_10k)->Unit(benchmark::kMicrosecond);

void BM_EncodeIndex_10k(benchmark::State& state) {
  const std::vector<ChunkRecord> records = MakeRecords(10000);
  for (auto _ : state) {
    benchmark::DoNotOptimize(shardkeep::format::EncodeIndex(records));
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * 10000);
}
BENCHMARK(BM_EncodeIndex_10k)->Unit(benchmark::kMicrosecond);

}  // namespace
