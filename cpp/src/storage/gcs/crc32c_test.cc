#include "storage/gcs/crc32c.h"

#include <gtest/gtest.h>

#include <string>

namespace shardkeep::gcs {
namespace {

TEST(Crc32cTest, MatchesKnownValues) {
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c("123456789"), 0xe3069283u);  // the standard check value
  // 32 bytes of zeros, from RFC 3720's examples.
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8a9136aau);
  // What GCS (and its emulator) report for "hello".
  EXPECT_EQ(Crc32cBase64(Crc32c("hello")), "mnG7TA==");
}

TEST(Crc32cTest, ExtendsAcrossPiecesOfAnyAlignment) {
  std::string data(1000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 3);
  const uint32_t whole = Crc32c(data);
  for (size_t cut : {0, 1, 7, 8, 9, 500, 999, 1000}) {
    EXPECT_EQ(Crc32c(std::string_view(data).substr(cut),
                     Crc32c(std::string_view(data).substr(0, cut))),
              whole)
        << cut;
  }
}

}  // namespace
}  // namespace shardkeep::gcs
