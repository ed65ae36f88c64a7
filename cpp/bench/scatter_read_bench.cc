// A safetensors tensor read as 2x4 boxes (rows in two blocks, columns in
// four): each box's rows are not contiguous in the file. Compared: rows
// read straight into place (one vectored read per slab of rows) against a
// read of each slab into a buffer and a copy out of it, for several row
// widths, from the page cache. Throughput counts the tensor's bytes.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "shardkeep/checkpoint.h"
#include "shardkeep/safetensors.h"
#include "storage/fault_injection.h"

namespace {

using namespace shardkeep;

constexpr uint64_t kTensorBytes = 64ull << 20;

void ReadTwoByFour(benchmark::State& state) {
  const uint64_t box_row_bytes = state.range(0);
  const bool scatter = state.range(1) != 0;
  const uint64_t cols = box_row_bytes * 4 / 2;  // bfloat16, four column blocks
  const uint64_t rows = kTensorBytes / (cols * 2);
  auto storage = std::make_shared<FaultInjectionStorage>(NewFileStorage());
  StorageFeatures features = storage->features();
  features.scatter_reads = scatter;
  storage->OverrideFeatures(features);
  std::string dir = (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") +
                    std::string("/scatter_bench_XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) state.SkipWithError("mkdtemp");
  const std::string file = dir + "/w.safetensors";
  std::vector<SafetensorsTensor> tensors = {
      {"w", DType::kBFloat16, {rows, cols}, 0, kTensorBytes}};
  std::string bytes = EncodeSafetensorsHeader(tensors, {});
  bytes.resize(bytes.size() + kTensorBytes, '\x3f');
  if (!storage->WriteAll(file, bytes, false).ok()) state.SkipWithError("write");
  auto reader = CheckpointReader::OpenSafetensors(storage, file);
  if (!reader.ok()) state.SkipWithError("open");
  std::vector<std::vector<uint8_t>> boxes(8, std::vector<uint8_t>(kTensorBytes / 8, 1));
  std::vector<ReadRequest> requests;
  for (uint64_t r = 0; r < 2; ++r) {
    for (uint64_t c = 0; c < 4; ++c) {
      requests.push_back({0, DType::kBFloat16,
                          Box{{r * rows / 2, c * cols / 4}, {rows / 2, cols / 4}},
                          boxes[r * 4 + c].data()});
    }
  }
  Options options;
  options.io_threads = 2;
  for (auto _ : state) {
    if (!(*reader)->Read("tensors", requests, options).ok()) state.SkipWithError("read");
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kTensorBytes);
  (void)storage->DeleteRecursive(dir);
}

BENCHMARK(ReadTwoByFour)
    ->ArgNames({"box_row_bytes", "scatter"})
    ->ArgsProduct({{128, 256, 2048, 8192}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
