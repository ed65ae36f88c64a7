// Byte planes (codec 2): the transform itself, the layout a save stores
// (docs/FORMAT.md §5), and loads that decode it in place, through a buffer,
// resharded and cast.
#include "engine/byte_planes.h"

#include <gtest/gtest.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "format/index.h"
#include "shardkeep/checkpoint.h"
#include "testing/payloads.h"
#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

using internal::JoinBytePlanes;
using internal::kBytePlaneBlockElements;
using internal::SplitBytePlanes;

// The decompressed contents of the zstd frames `stored` holds, in order.
std::vector<std::vector<uint8_t>> Frames(const uint8_t* stored, uint64_t length) {
  std::vector<std::vector<uint8_t>> frames;
  for (uint64_t at = 0; at < length;) {
    const size_t size = ZSTD_findFrameCompressedSize(stored + at, length - at);
    EXPECT_FALSE(ZSTD_isError(size));
    if (ZSTD_isError(size)) break;
    std::vector<uint8_t>& frame = frames.emplace_back(ZSTD_getFrameContentSize(stored + at, size));
    EXPECT_EQ(ZSTD_decompress(frame.data(), frame.size(), stored + at, size), frame.size());
    at += size;
  }
  return frames;
}

// The byte planes of `count` elements of `width` bytes.
std::vector<uint8_t> Planes(const void* elements, uint64_t count, uint32_t width) {
  std::vector<uint8_t> planes(count * width);
  SplitBytePlanes(static_cast<const uint8_t*>(elements), count, width, planes.data());
  return planes;
}

TEST(BytePlanesTest, PlaneJHoldsByteJOfEveryElement) {
  for (uint32_t width : {1u, 2u, 3u, 4u, 8u, 16u}) {
    const uint64_t count = 1037;
    std::vector<uint8_t> elements(count * width);
    std::iota(elements.begin(), elements.end(), uint8_t{0});
    std::vector<uint8_t> planes(elements.size());
    SplitBytePlanes(elements.data(), count, width, planes.data());
    for (uint64_t i = 0; i < count; ++i) {
      for (uint32_t j = 0; j < width; ++j) {
        ASSERT_EQ(planes[j * count + i], elements[i * width + j]) << width << " " << i << " " << j;
      }
    }
    std::vector<uint8_t> joined(elements.size());
    JoinBytePlanes(planes.data(), count, width, joined.data());
    EXPECT_EQ(joined, elements) << "width " << width;
  }
}

// "w": 256x256 float32 saved compressed in four chunks of 64 rows.
class CompressedLoadTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kRows = 256, kCols = 256;

  void SetUp() override {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.f, 0.02f);
    for (float& v : w_) v = normal(rng);
    SaveRequest request;
    request.path = "ckpt";
    CheckpointablePayload part = testdata::PytreePayload("state", {{"w", "float32", {kRows, kCols}}});
    part.shards.push_back({0, DType::kFloat32, Box{{0, 0}, {kRows, kCols}},
                           reinterpret_cast<const uint8_t*>(w_.data())});
    request.parts.push_back(std::move(part));
    Options options;
    options.compress = true;
    options.chunk_bytes = kRows / 4 * kCols * sizeof(float);
    SK_ASSERT_OK(Save(storage_, nullptr, std::move(request), options));
    SK_ASSERT_OK_AND_ASSIGN(std::string index, storage_->ReadAll("ckpt/state/index/p0.idx"));
    SK_ASSERT_OK_AND_ASSIGN(records_, format::DecodeIndex(index, "p0.idx"));
  }

  std::vector<float> Load(const Box& box, const Options& options = Options()) {
    std::vector<float> out(box.NumElements());
    auto reader = CheckpointReader::Open(storage_, "ckpt");
    EXPECT_TRUE(reader.ok()) << reader.status().ToString();
    ReadRequest request{0, DType::kFloat32, box, reinterpret_cast<uint8_t*>(out.data())};
    SK_EXPECT_OK((*reader)->Read("state", {request}, options));
    return out;
  }

  std::vector<float> Expected(const Box& box) const {
    std::vector<float> out;
    for (uint64_t r = box.origin[0]; r < box.origin[0] + box.shape[0]; ++r) {
      for (uint64_t c = box.origin[1]; c < box.origin[1] + box.shape[1]; ++c) {
        out.push_back(w_[r * kCols + c]);
      }
    }
    return out;
  }

  std::shared_ptr<Storage> storage_ = NewMemoryStorage();
  std::vector<float> w_ = std::vector<float>(kRows * kCols);
  std::vector<format::ChunkRecord> records_;
};

// Each chunk (under one block) is one frame of its byte planes, and normal
// float32 values shrink: their exponent plane compresses, the rest is
// stored in the frame's raw blocks.
TEST_F(CompressedLoadTest, AChunkUnderOneBlockIsOneFrameOfItsBytePlanes) {
  ASSERT_EQ(records_.size(), 4u);
  for (const format::ChunkRecord& record : records_) {
    SK_ASSERT_OK_AND_ASSIGN(std::string data, storage_->ReadAll("ckpt/state/" +
                                                                 format::DataFileName(0, record.data_file)));
    ASSERT_EQ(record.codec, format::Codec::kZstdBytePlanes);
    EXPECT_LT(record.stored_length, record.raw_length * 9 / 10);
    const auto frames = Frames(reinterpret_cast<const uint8_t*>(data.data()) + record.offset,
                               record.stored_length);
    const std::vector<float> chunk = Expected(record.box);
    ASSERT_EQ(frames.size(), 1u);
    EXPECT_TRUE(frames[0] == Planes(chunk.data(), chunk.size(), 4)) << record.box.ToString();
  }
}

// A chunk of 2.3 blocks of bfloat16 is three frames, each the planes of its
// block, the last one shorter; it loads back bit for bit.
TEST(CompressedBlocksTest, AChunkIsOneFramePerBlockOfElements) {
  const uint64_t count = 2 * kBytePlaneBlockElements + 40000;
  std::vector<uint16_t> w(count);
  std::mt19937 rng(3);
  for (uint16_t& v : w) v = static_cast<uint16_t>(0x3c00 + rng() % 0x0200);  // few exponents
  auto storage = NewMemoryStorage();
  SaveRequest request;
  request.path = "ckpt";
  CheckpointablePayload part = testdata::PytreePayload("state", {{"w", "bfloat16", {count}}});
  part.shards.push_back({0, DType::kBFloat16, Box{{0}, {count}},
                         reinterpret_cast<const uint8_t*>(w.data())});
  request.parts.push_back(std::move(part));
  Options options;
  options.compress = true;
  SK_ASSERT_OK(Save(storage, nullptr, std::move(request), options));
  SK_ASSERT_OK_AND_ASSIGN(std::string index, storage->ReadAll("ckpt/state/index/p0.idx"));
  SK_ASSERT_OK_AND_ASSIGN(auto records, format::DecodeIndex(index, "p0.idx"));
  ASSERT_EQ(records.size(), 1u);
  ASSERT_EQ(records[0].codec, format::Codec::kZstdBytePlanes);
  SK_ASSERT_OK_AND_ASSIGN(std::string data, storage->ReadAll("ckpt/state/" + format::DataFileName(0, 0)));
  const auto frames = Frames(reinterpret_cast<const uint8_t*>(data.data()) + records[0].offset,
                             records[0].stored_length);
  ASSERT_EQ(frames.size(), 3u);
  for (uint64_t k = 0; k < 3; ++k) {
    const uint64_t first = k * kBytePlaneBlockElements;
    const uint64_t n = std::min(kBytePlaneBlockElements, count - first);
    EXPECT_TRUE(frames[k] == Planes(w.data() + first, n, 2)) << "block " << k;
  }
  std::vector<uint16_t> out(count);
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage, "ckpt"));
  ReadRequest whole{0, DType::kBFloat16, Box{{0}, {count}}, reinterpret_cast<uint8_t*>(out.data())};
  SK_ASSERT_OK(reader->Read("state", {whole}, Options()));
  EXPECT_TRUE(out == w);
  // A box across the second block boundary, through a buffer.
  const uint64_t from = 2 * kBytePlaneBlockElements - 5;
  std::vector<uint16_t> part_out(10);
  ReadRequest across{0, DType::kBFloat16, Box{{from}, {10}},
                     reinterpret_cast<uint8_t*>(part_out.data())};
  SK_ASSERT_OK(reader->Read("state", {across}, Options()));
  EXPECT_TRUE(std::equal(part_out.begin(), part_out.end(), w.begin() + from));

  // A byte after the last frame, under a checksum that holds, is Corruption.
  data.push_back('\0');
  records[0].stored_length += 1;
  records[0].checksum = ChunkChecksum(data.data() + records[0].offset, records[0].stored_length);
  SK_ASSERT_OK(storage->WriteAll("ckpt/state/" + format::DataFileName(0, 0), data, false));
  SK_ASSERT_OK(storage->WriteAll("ckpt/state/index/p0.idx", format::EncodeIndex(records), false));
  SK_ASSERT_OK_AND_ASSIGN(auto damaged, CheckpointReader::Open(storage, "ckpt"));
  const Status status = damaged->Read("state", {whole}, Options());
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  EXPECT_TRUE(testing::Has(status.message(), "1 bytes after its last zstd frame")) << status.ToString();
}

TEST_F(CompressedLoadTest, LoadsDecodeInPlaceAndThroughBuffers) {
  const Box whole{{0, 0}, {kRows, kCols}};
  EXPECT_EQ(Load(whole), w_);                               // each chunk in place
  const Box inner{{5, 3}, {140, 100}};                      // resharded: parts of chunks
  EXPECT_EQ(Load(inner), Expected(inner));
  const Box rows{{64, 0}, {128, kCols}};                    // two whole chunks in place
  EXPECT_EQ(Load(rows), Expected(rows));
}

TEST_F(CompressedLoadTest, ACastLoadDecodesThenConverts) {
  const Box whole{{0, 0}, {kRows, kCols}};
  std::vector<double> out(whole.NumElements());
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, "ckpt"));
  ReadRequest request{0, DType::kFloat64, whole, reinterpret_cast<uint8_t*>(out.data())};
  SK_ASSERT_OK(reader->Read("state", {request}, Options()));
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], static_cast<double>(w_[i])) << i;
}

TEST(CompressionLevelTest, ALevelOutsideZstdsRangeIsRefused) {
  std::vector<float> w(1024, 1.f);
  SaveRequest request;
  request.path = "ckpt";
  CheckpointablePayload part = testdata::PytreePayload("state", {{"w", "float32", {1024}}});
  part.shards.push_back({0, DType::kFloat32, Box{{0}, {1024}},
                         reinterpret_cast<const uint8_t*>(w.data())});
  request.parts.push_back(std::move(part));
  Options options;
  options.compress = true;
  options.zstd_level = 99;
  const Status status = Save(NewMemoryStorage(), nullptr, std::move(request), options);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  EXPECT_TRUE(testing::Has(status.message(), "zstd level 99 is outside [")) << status.ToString();
}

}  // namespace
}  // namespace shardkeep
