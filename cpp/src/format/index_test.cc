#include "format/index.h"

#include <xxhash.h>

#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include <gtest/gtest.h>

#include "testing/status_matchers.h"
#include "testing/test_files.h"

namespace shardkeep::format {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kMaxBytes = uint64_t{1} << 63;
const std::string kFile = "ckpt/state/index/p0.idx";

std::string ReadTestFile(const std::string& name) {
  return testdata::Read("format/" + name);
}

// Hex digits to bytes; whitespace is ignored.
std::string FromHex(std::string_view hex) {
  std::string out, digits;
  for (char c : hex) {
    if (!isspace(static_cast<unsigned char>(c))) digits.push_back(c);
  }
  for (size_t i = 0; i + 1 < digits.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(digits.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// The golden index cpp/testdata/format/golden_p0.idx, written out by hand
// from the field tables of docs/FORMAT.md, independently of EncodeIndex.
// The trailer was computed once with XXH3_64bits over the 208 bytes above
// it; the GoldenTrailerIsXxh3OfBody test re-derives it.
constexpr std::string_view kGoldenHex = R"(
  534b494458000001 0300000000000000       magic, record count 3
  00000000 02000000 00000000 00000000     #0: leaf 0, rank 2, file 0, raw
  0000000000000000 6000000000000000       offset 0, stored_length 96
  6000000000000000 8877665544332211       raw_length 96, checksum
  0000000000000000 0000000000000000       origin [0, 0]
  0400000000000000 0600000000000000       shape [4, 6]
  02000000 01000000 01000000 01000000     #1: leaf 2, rank 1, file 1, zstd
  8967452301000000 3412000000000000       offset 0x123456789, stored 0x1234
  0000000002000000 1032547698badcfe       raw_length 0x200000000, checksum
  0000000003000000                        origin [0x300000000]
  0000000001000000                        shape [0x100000000]
  01000000 00000000 00000000 00000000     #2: leaf 1, rank 0, file 0, raw
  6000000000000000 0400000000000000       offset 96, stored_length 4
  0400000000000000 11100f0e0d0c0b0a       raw_length 4, checksum
  c7dcdf593677958f                        trailer 0x8f95773659dfdcc7
)";

// Strips the comments (everything after the hex columns) from kGoldenHex.
std::string GoldenBytes() {
  std::string hex;
  std::istringstream lines{std::string(kGoldenHex)};
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    for (std::string w; words >> w;) {
      if (w.find_first_not_of("0123456789abcdef") != std::string::npos) break;
      hex += w;
    }
  }
  return FromHex(hex);
}

std::vector<ChunkRecord> GoldenRecords() {
  ChunkRecord a;
  a.leaf = 0;
  a.data_file = 0;
  a.codec = Codec::kRaw;
  a.offset = 0;
  a.stored_length = a.raw_length = 96;
  a.checksum = 0x1122334455667788;
  a.box = {{0, 0}, {4, 6}};
  ChunkRecord b;
  b.leaf = 2;
  b.data_file = 1;
  b.codec = Codec::kZstd;
  b.offset = 0x123456789;
  b.stored_length = 0x1234;
  b.raw_length = 0x200000000;
  b.checksum = 0xfedcba9876543210;
  b.box = {{0x300000000}, {0x100000000}};
  ChunkRecord c;
  c.leaf = 1;
  c.data_file = 0;
  c.codec = Codec::kRaw;
  c.offset = 96;
  c.stored_length = c.raw_length = 4;
  c.checksum = 0x0a0b0c0d0e0f1011;
  c.box = {{}, {}};
  return {a, b, c};
}

void PutU32At(std::string* s, size_t pos, uint32_t v) {
  for (int i = 0; i < 4; ++i) (*s)[pos + i] = static_cast<char>(v >> (8 * i));
}
void PutU64At(std::string* s, size_t pos, uint64_t v) {
  for (int i = 0; i < 8; ++i) (*s)[pos + i] = static_cast<char>(v >> (8 * i));
}

// Recomputes the trailer so that a test reaches the structural checks.
std::string Reseal(std::string s) {
  PutU64At(&s, s.size() - 8, XXH3_64bits(s.data(), s.size() - 8));
  return s;
}

// Expects a Corruption naming kFile whose message contains `what`.
void ExpectCorruption(const std::string& bytes, const std::string& what) {
  auto r = DecodeIndex(bytes, kFile);
  ASSERT_FALSE(r.ok()) << "expected an error containing: " << what;
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
  EXPECT_EQ(r.status().message().rfind(kFile + ": ", 0), 0u)
      << r.status().message();
  EXPECT_NE(r.status().message().find(what), std::string::npos)
      << r.status().message();
}

// Offsets of fields of golden record #0 (rank 2) and #1 (rank 1).
constexpr size_t kRec0 = 16, kRec1 = 16 + 48 + 32, kRec2 = kRec1 + 48 + 16;

TEST(IndexGolden, HandWrittenBytesMatchGoldenFile) {
  const std::string golden = ReadTestFile("golden_p0.idx");
  ASSERT_EQ(golden.size(), 216u) << "missing cpp/testdata/format/golden_p0.idx?";
  EXPECT_EQ(GoldenBytes(), golden);
}

TEST(IndexGolden, GoldenTrailerIsXxh3OfBody) {
  const std::string golden = GoldenBytes();
  EXPECT_EQ(XXH3_64bits(golden.data(), golden.size() - 8), 0x8f95773659dfdcc7u);
}

TEST(IndexGolden, EncoderMatchesGoldenByteForByte) {
  EXPECT_EQ(EncodeIndex(GoldenRecords()), ReadTestFile("golden_p0.idx"));
}

TEST(IndexGolden, DecoderReadsGolden) {
  SK_ASSERT_OK_AND_ASSIGN(auto records,
                          DecodeIndex(ReadTestFile("golden_p0.idx"), kFile));
  EXPECT_EQ(records, GoldenRecords());
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[2].box.rank(), 0u);
  EXPECT_EQ(records[2].box.NumElements(), 1u);
}

TEST(Index, EmptyIndexRoundTrips) {
  const std::string bytes = EncodeIndex({});
  EXPECT_EQ(bytes.size(), 24u);
  SK_ASSERT_OK_AND_ASSIGN(auto records, DecodeIndex(bytes, kFile));
  EXPECT_TRUE(records.empty());
}

TEST(Index, RandomRecordsRoundTrip) {
  std::mt19937_64 rng(42);
  std::vector<ChunkRecord> records;
  for (int i = 0; i < 200; ++i) {
    ChunkRecord r;
    r.leaf = static_cast<uint32_t>(rng());
    r.data_file = static_cast<uint32_t>(rng());
    r.codec = (rng() & 1) ? Codec::kZstd : Codec::kRaw;
    r.offset = rng() >> 2;  // keeps offset + stored_length <= 2^63
    r.stored_length = rng() >> 2;
    r.raw_length = r.codec == Codec::kRaw ? r.stored_length : rng() >> 1;
    r.checksum = rng();
    const size_t rank = i < 65 ? i : rng() % 65;
    for (size_t d = 0; d < rank; ++d) {
      r.box.origin.push_back(rng() >> 1);
      r.box.shape.push_back(d == 0 ? 0 : rng() >> 1);  // 0: no overflow
    }
    records.push_back(r);
  }
  const std::string bytes = EncodeIndex(records);
  SK_ASSERT_OK_AND_ASSIGN(auto decoded, DecodeIndex(bytes, kFile));
  EXPECT_EQ(decoded, records);
}

TEST(Index, ValuesBeyond32BitsAreExact) {
  ChunkRecord r;
  r.leaf = 0xffffffff;
  r.data_file = 0xfffffffe;
  r.codec = Codec::kZstd;
  r.offset = (uint64_t{5} << 32) + 7;        // > 4 GiB
  r.stored_length = (uint64_t{3} << 32) + 1;  // > 4 GiB
  r.raw_length = kMaxBytes;
  r.checksum = kMax - 1;
  r.box = {{(uint64_t{1} << 40) + 3, kMax, kMax - 1},
           {(uint64_t{1} << 33) + 1, 0, 1}};
  ChunkRecord big;  // the largest box whose element count fits 64 bits
  big.box = {{0}, {kMax}};
  big.stored_length = big.raw_length = kMaxBytes;
  ChunkRecord last;  // a chunk ending exactly at 2^63
  last.offset = kMaxBytes - 1;
  last.stored_length = last.raw_length = 1;
  const std::vector<ChunkRecord> records = {r, big, last};
  SK_ASSERT_OK_AND_ASSIGN(auto decoded, DecodeIndex(EncodeIndex(records), kFile));
  EXPECT_EQ(decoded, records);
}

TEST(Index, FileNames) {
  EXPECT_EQ(IndexFileName(3), "index/p3.idx");
  EXPECT_EQ(IndexFileName(0), "index/p0.idx");
  EXPECT_EQ(DataFileName(3, 0), "data/p3-0.bin");
  EXPECT_EQ(DataFileName(12, 7), "data/p12-7.bin");
}

TEST(IndexCorruption, EveryTruncationIsRejected) {
  const std::string golden = GoldenBytes();
  for (size_t n = 0; n < golden.size(); ++n) {
    SCOPED_TRACE("truncated to " + std::to_string(n) + " bytes");
    auto r = DecodeIndex(std::string_view(golden).substr(0, n), kFile);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  }
}

TEST(IndexCorruption, EveryTruncationIsRejectedEvenWhenResealed) {
  // A truncated body with a valid trailer must still fail the structure
  // checks: this exercises every bounds check on the record area.
  const std::string golden = GoldenBytes();
  for (size_t n = 24; n < golden.size(); ++n) {
    SCOPED_TRACE("body truncated to " + std::to_string(n - 8) + " bytes");
    std::string s = golden.substr(0, n - 8) + std::string(8, '\0');
    auto r = DecodeIndex(Reseal(s), kFile);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  }
}

TEST(IndexCorruption, EveryBitFlipIsRejected) {
  const std::string golden = GoldenBytes();
  for (size_t i = 0; i < golden.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string s = golden;
      s[i] = static_cast<char>(s[i] ^ (1 << bit));
      auto r = DecodeIndex(s, kFile);
      ASSERT_FALSE(r.ok()) << "byte " << i << " bit " << bit;
      // Byte 7 is the layout version: a larger one reads as "newer".
      const StatusCode want =
          (i == 7 && static_cast<unsigned char>(s[7]) > 1)
              ? StatusCode::kIncompatible : StatusCode::kCorruption;
      EXPECT_EQ(r.status().code(), want) << "byte " << i << " bit " << bit;
    }
  }
}

TEST(IndexCorruption, BadMagic) {
  std::string s = GoldenBytes();
  s[0] = 'X';
  ExpectCorruption(s, "magic");
  ExpectCorruption(Reseal(s), "magic");
  ExpectCorruption(std::string(216, '\0'), "magic");
}

TEST(IndexCorruption, LayoutVersion) {
  std::string s = GoldenBytes();
  s[7] = 2;
  auto r = DecodeIndex(Reseal(s), kFile);
  EXPECT_EQ(r.status().code(), StatusCode::kIncompatible);
  EXPECT_NE(r.status().message().find("newer"), std::string::npos);
  s[7] = 0;
  ExpectCorruption(Reseal(s), "layout version");
}

TEST(IndexCorruption, TooShortForHeaderAndTrailer) {
  ExpectCorruption("", "at least 24 bytes");
  ExpectCorruption(std::string(kIndexMagic, 8), "at least 24 bytes");
}

TEST(IndexCorruption, HugeCountIsRejectedBeforeAllocating) {
  for (uint64_t count : {uint64_t{1} << 60, kMax, uint64_t{1} << 32,
                         uint64_t{4}}) {
    SCOPED_TRACE(count);
    std::string s = GoldenBytes();
    PutU64At(&s, 8, count);
    ExpectCorruption(Reseal(s), count == 4 ? "record 3: truncated"
                                           : "does not fit");
  }
}

TEST(IndexCorruption, TrailingGarbage) {
  std::string s = GoldenBytes();
  PutU64At(&s, 8, 2);  // the third record becomes garbage
  ExpectCorruption(Reseal(s), "extra bytes");
  std::string t = GoldenBytes();
  t.insert(t.size() - 8, "junk");
  ExpectCorruption(Reseal(t), "4 extra bytes");
}

TEST(IndexCorruption, BadRank) {
  std::string s = GoldenBytes();
  PutU32At(&s, kRec0 + 4, 65);
  ExpectCorruption(Reseal(s), "record 0: expected rank <= 64, found 65");
  PutU32At(&s, kRec0 + 4, 0xffffffff);
  ExpectCorruption(Reseal(s), "rank");
  // A valid rank that claims more extents than the file holds.
  s = GoldenBytes();
  PutU32At(&s, kRec2 + 4, 3);
  ExpectCorruption(Reseal(s), "record 2: truncated box");
}

TEST(IndexCorruption, UnknownCodec) {
  std::string s = GoldenBytes();
  PutU32At(&s, kRec1 + 12, 3);
  ExpectCorruption(Reseal(s),
                   "record 1: expected codec 0 (raw), 1 (zstd) or 2 (zstd of byte planes), found 3");
}

TEST(IndexCorruption, RawChunkLengthsDisagree) {
  std::string s = GoldenBytes();
  PutU64At(&s, kRec0 + 24, 95);  // raw_length
  ExpectCorruption(Reseal(s), "stored_length == raw_length");
}

TEST(IndexCorruption, OffsetPlusLengthOverflows) {
  std::string s = GoldenBytes();
  PutU64At(&s, kRec1 + 16, kMax);  // offset
  ExpectCorruption(Reseal(s), "record 1: expected offset + stored_length <= 2^63");
}

// Lengths and offsets past 2^63 bytes describe no real file; refusing them
// while decoding keeps every later sum and product in 64 bits.
TEST(IndexCorruption, OffsetsAndLengthsBeyond2To63) {
  std::string s = GoldenBytes();
  PutU64At(&s, kRec1 + 16, kMaxBytes);  // offset = 2^63, stored_length 0x1234
  ExpectCorruption(Reseal(s), "record 1: expected offset + stored_length <= 2^63");
  s = GoldenBytes();
  PutU64At(&s, kRec1 + 16, kMaxBytes - 0x1000);  // ends past 2^63
  ExpectCorruption(Reseal(s), "expected offset + stored_length <= 2^63");
  s = GoldenBytes();
  PutU64At(&s, kRec1 + 32, kMaxBytes + 1);  // raw_length of the zstd chunk
  ExpectCorruption(Reseal(s), "record 1: expected raw_length <= 2^63");
  s = GoldenBytes();
  PutU64At(&s, kRec0 + 24, kMaxBytes + 96);  // stored and raw length of a raw chunk
  PutU64At(&s, kRec0 + 32, kMaxBytes + 96);
  ExpectCorruption(Reseal(s), "record 0: expected offset + stored_length <= 2^63");
}

TEST(IndexCorruption, OriginPlusShapeOverflows) {
  std::string s = GoldenBytes();
  PutU64At(&s, kRec1 + 48, kMax);  // origin[0] with shape[0] = 2^32
  ExpectCorruption(Reseal(s), "origin + shape overflows 64 bits in dimension 0");
}

TEST(IndexCorruption, ElementCountOverflows) {
  std::string s = GoldenBytes();
  PutU64At(&s, kRec0 + 64, uint64_t{1} << 40);  // shape [2^40, 2^40]
  PutU64At(&s, kRec0 + 72, uint64_t{1} << 40);
  ExpectCorruption(Reseal(s), "element count");
  // With a zero extent the box is empty, whatever the other extents.
  std::vector<ChunkRecord> records(1);
  records[0].box = {{0, 0, 0}, {kMax, kMax, 0}};
  SK_EXPECT_OK(DecodeIndex(EncodeIndex(records), kFile).status());
}

TEST(IndexCorruption, BadTrailer) {
  std::string s = GoldenBytes();
  s.back() ^= 1;
  ExpectCorruption(s, "trailer checksum mismatch");
}

}  // namespace
}  // namespace shardkeep::format
