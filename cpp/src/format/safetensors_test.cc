// The safetensors header decoder against a file written by the safetensors
// library, and against each kind of hostile header.
#include "shardkeep/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "testing/status_matchers.h"

namespace shardkeep::format {
namespace {

const std::string kFile = "model.safetensors";

// A file whose header is `json` followed by `data_bytes` bytes of data.
struct Made {
  std::string header;
  uint64_t file_size;
};
Made Make(const std::string& json, uint64_t data_bytes) {
  return {json, 8 + json.size() + data_bytes};
}

Status DecodeError(const std::string& json, uint64_t data_bytes) {
  Made m = Make(json, data_bytes);
  return DecodeSafetensorsHeader(m.header, m.file_size, kFile).status();
}

void ExpectCorruption(const std::string& json, uint64_t data_bytes, const std::string& what) {
  Status s = DecodeError(json, data_bytes);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << json;
  EXPECT_NE(s.message().find(kFile), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
}

TEST(Safetensors, DecodesAFileOfTheSafetensorsLibrary) {
  // Written by safetensors.numpy.save_file (see cpp/testdata/safetensors).
  std::ifstream in(std::string(SHARDKEEP_TESTDATA_DIR) + "/safetensors/small.safetensors",
                   std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string bytes = buffer.str();
  SK_ASSERT_OK_AND_ASSIGN(uint64_t length,
                          DecodeSafetensorsHeaderLength(bytes.substr(0, 8), bytes.size(), kFile));
  SK_ASSERT_OK_AND_ASSIGN(
      SafetensorsHeader header,
      DecodeSafetensorsHeader(std::string_view(bytes).substr(8, length), bytes.size(), kFile));
  EXPECT_EQ(header.metadata.at("format"), "np");
  ASSERT_EQ(header.tensors.size(), 3u);
  const SafetensorsTensor& embed = header.tensors[0];
  EXPECT_EQ(embed.name, "embed.weight");
  EXPECT_EQ(embed.dtype, DType::kFloat32);
  EXPECT_EQ(embed.shape, (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(embed.offset, 8 + length);
  EXPECT_EQ(embed.length, 48u);
  float third;
  std::memcpy(&third, bytes.data() + embed.offset + 2 * sizeof(float), sizeof(float));
  EXPECT_EQ(third, 2.0f);
  EXPECT_EQ(header.tensors[1].dtype, DType::kInt16);
  EXPECT_EQ(header.tensors[2].dtype, DType::kBool);
  EXPECT_EQ(header.tensors[2].offset, 8 + length + 54);
}

TEST(Safetensors, EncodedHeadersDecodeToTheSameTensors) {
  std::vector<SafetensorsTensor> tensors = {
      {"w", DType::kBFloat16, {2, 3}, 0, 12},
      {"scale", DType::kFloat8E4M3FN, {}, 0, 1},
      {"empty", DType::kFloat32, {0, 4}, 0, 0},
  };
  const std::string bytes = EncodeSafetensorsHeader(tensors, {{"source", "shardkeep"}});
  EXPECT_EQ(bytes.size() % 8, 0u);  // padded as the library pads
  const uint64_t file_size = bytes.size() + 13;
  SK_ASSERT_OK_AND_ASSIGN(uint64_t length,
                          DecodeSafetensorsHeaderLength(bytes.substr(0, 8), file_size, kFile));
  EXPECT_EQ(length, bytes.size() - 8);
  SK_ASSERT_OK_AND_ASSIGN(SafetensorsHeader header,
                          DecodeSafetensorsHeader(bytes.substr(8), file_size, kFile));
  ASSERT_EQ(header.tensors.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(header.tensors[i].name, tensors[i].name);
    EXPECT_EQ(header.tensors[i].dtype, tensors[i].dtype);
    EXPECT_EQ(header.tensors[i].shape, tensors[i].shape);
    EXPECT_EQ(header.tensors[i].offset, tensors[i].offset);
  }
  EXPECT_EQ(header.metadata.at("source"), "shardkeep");
}

TEST(Safetensors, DTypeNames) {
  EXPECT_EQ(SafetensorsDTypeName(DType::kBFloat16), "BF16");
  EXPECT_EQ(SafetensorsDTypeName(DType::kFloat8E5M2), "F8_E5M2");
  EXPECT_EQ(SafetensorsDTypeName(DType::kInt4), std::nullopt);
  EXPECT_EQ(DTypeFromSafetensorsName("F8_E4M3"), DType::kFloat8E4M3FN);
  EXPECT_EQ(DTypeFromSafetensorsName("F4"), std::nullopt);
}

TEST(SafetensorsErrors, HeaderLength) {
  std::string eight(8, '\0');
  eight[0] = 100;
  EXPECT_EQ(DecodeSafetensorsHeaderLength(eight, 50, kFile).status().code(),
            StatusCode::kCorruption);  // past the end
  EXPECT_EQ(DecodeSafetensorsHeaderLength("abc", 3, kFile).status().code(),
            StatusCode::kCorruption);  // too short
  std::string huge(8, '\xff');
  Status s = DecodeSafetensorsHeaderLength(huge, uint64_t{1} << 40, kFile).status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("limit"), std::string::npos) << s.message();
  SK_EXPECT_OK(DecodeSafetensorsHeaderLength(eight, 108, kFile).status());
}

TEST(SafetensorsErrors, EachHostileHeaderIsNamed) {
  const std::string ok = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
  SK_EXPECT_OK(DecodeError("{\"a\":{" + ok + "}}", 8));
  ExpectCorruption("not json", 8, kFile);
  ExpectCorruption("[1]", 8, kFile);
  ExpectCorruption(R"({"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", 8, "\"a\": dtype");
  ExpectCorruption(R"({"a":{"dtype":"X9","shape":[2],"data_offsets":[0,8]}})", 8, "X9");
  ExpectCorruption(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 16,
                   "does not fill");
  ExpectCorruption(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 8,
                   "inside the 8-byte data area");
  ExpectCorruption(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8,
                   "not a range");
  ExpectCorruption(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12, "overlap");
  ExpectCorruption(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],)"
                   R"("data_offsets":[0,0]}})", 0, "does not fill");
  ExpectCorruption(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "extents");
  ExpectCorruption(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8,
                   "data_offsets");
  ExpectCorruption(R"({"__metadata__":{"k":1}})", 0, "__metadata__");
  ExpectCorruption(R"({"a":[]})", 0, "expected an object");
  std::string rank65;
  for (int i = 0; i < 65; ++i) rank65 += (i ? ",1" : "1");
  ExpectCorruption(R"({"a":{"dtype":"F32","shape":[)" + rank65 + R"(],"data_offsets":[0,4]}})",
                   4, "at most 64");
}

}  // namespace
}  // namespace shardkeep::format
