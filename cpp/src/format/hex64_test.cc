#include "format/hex64.h"

#include <gtest/gtest.h>

namespace shardkeep::format {
namespace {

TEST(Hex64Test, WritesSixteenLowerCaseDigits) {
  EXPECT_EQ(Hex64(0), "0000000000000000");
  EXPECT_EQ(Hex64(0xabcdef0123456789ull), "abcdef0123456789");
  EXPECT_EQ(Hex64(~uint64_t{0}), "ffffffffffffffff");
}

TEST(Hex64Test, ReadsBackWhatItWrites) {
  for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{0x8000000000000000ull},
                     uint64_t{0x0123456789abcdefull}, ~uint64_t{0}}) {
    EXPECT_EQ(ParseHex64(Hex64(v)), v);
  }
}

// One spelling per value: anything else is refused, so a damaged name or
// checksum is never read as another value.
TEST(Hex64Test, RefusesEveryOtherSpelling) {
  for (std::string_view bad : {"", "0", "000000000000000", "00000000000000000",
                               "ABCDEF0123456789", "+000000000000001", " 000000000000001",
                               "000000000000000g", "0x00000000000001"}) {
    EXPECT_EQ(ParseHex64(bad), std::nullopt) << bad;
  }
}

}  // namespace
}  // namespace shardkeep::format
