// XXH3-64 over a 64 MiB buffer: the checksum every chunk pays on save and
// on load. Throughput is reported in bytes per second.
#include <cstdint>
#include <vector>

#include <benchmark/benchmark.h>
#include <xxhash.h>

namespace {

void BM_Xxh3_64MiB(benchmark::State& state) {
  const size_t size = size_t{64} << 20;
  std::vector<uint8_t> buffer(size);
  for (size_t i = 0; i < size; ++i) buffer[i] = static_cast<uint8_t>(i * 131 + 7);
  for (auto _ : state) {
    benchmark::DoNotOptimize(XXH3_64bits(buffer.data(), buffer.size()));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(size));
}
BENCHMARK(BM_Xxh3_64MiB)->Unit(benchmark::kMillisecond);

}  // namespace
