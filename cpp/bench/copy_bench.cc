// Chunk copies on the restore path: a stored chunk's intersection with a
// destination box, copied with CopyRegion, with and without a dtype cast,
// plus the raw CastElements kernels. Throughput counts destination bytes.
#include <cstdint>
#include <vector>

#include <benchmark/benchmark.h>

#include "engine/copy.h"

namespace {

using shardkeep::Box;
using shardkeep::DType;
using shardkeep::internal::CastElements;
using shardkeep::internal::CopyRegion;

constexpr uint64_t kRows = 4096;
constexpr uint64_t kCols = 4096;

size_t ElementSize(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return 2;
    case DType::kFloat32: return 4;
    default: return 8;
  }
}

// A (kRows, kCols) stored chunk copied into a destination that holds its
// right half (tensor-parallel resharding: strided rows, not one memcpy)
// or all of it (same sharding: one contiguous run).
void RunCopyRegion(benchmark::State& state, DType from, DType to, bool half_columns) {
  const Box src_box{{0, 0}, {kRows, kCols}};
  const uint64_t dst_cols = half_columns ? kCols / 2 : kCols;
  const Box dst_box{{0, kCols - dst_cols}, {kRows, dst_cols}};
  std::vector<uint8_t> src(kRows * kCols * ElementSize(from), 0x3f);
  std::vector<uint8_t> dst(kRows * dst_cols * ElementSize(to));
  for (auto _ : state) {
    CopyRegion(src.data(), src_box, from, dst.data(), dst_box, to, dst_box);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(dst.size()));
}

void BM_CopyRegion_Contiguous_NoCast(benchmark::State& state) {
  RunCopyRegion(state, DType::kFloat32, DType::kFloat32, false);
}
void BM_CopyRegion_Strided_NoCast(benchmark::State& state) {
  RunCopyRegion(state, DType::kFloat32, DType::kFloat32, true);
}
void BM_CopyRegion_Contiguous_F32ToBF16(benchmark::State& state) {
  RunCopyRegion(state, DType::kFloat32, DType::kBFloat16, false);
}
void BM_CopyRegion_Strided_BF16ToF32(benchmark::State& state) {
  RunCopyRegion(state, DType::kBFloat16, DType::kFloat32, true);
}
BENCHMARK(BM_CopyRegion_Contiguous_NoCast)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CopyRegion_Strided_NoCast)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CopyRegion_Contiguous_F32ToBF16)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CopyRegion_Strided_BF16ToF32)->Unit(benchmark::kMillisecond);

void RunCast(benchmark::State& state, DType from, DType to) {
  const uint64_t count = kRows * kCols;
  std::vector<uint8_t> src(count * ElementSize(from), 0x3f);
  std::vector<uint8_t> dst(count * ElementSize(to));
  for (auto _ : state) {
    CastElements(src.data(), from, dst.data(), to, count);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(dst.size()));
}

void BM_Cast_F32ToBF16(benchmark::State& state) {
  RunCast(state, DType::kFloat32, DType::kBFloat16);
}
void BM_Cast_BF16ToF32(benchmark::State& state) {
  RunCast(state, DType::kBFloat16, DType::kFloat32);
}
BENCHMARK(BM_Cast_F32ToBF16)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Cast_BF16ToF32)->Unit(benchmark::kMillisecond);

}  // namespace
