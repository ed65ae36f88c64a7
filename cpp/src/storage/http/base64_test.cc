#include "storage/http/base64.h"

#include <gtest/gtest.h>

namespace shardkeep::http {
namespace {

TEST(Base64Test, MatchesRfc4648Vectors) {
  EXPECT_EQ(Base64Encode(""), "");
  EXPECT_EQ(Base64Encode("f"), "Zg==");
  EXPECT_EQ(Base64Encode("fo"), "Zm8=");
  EXPECT_EQ(Base64Encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(*Base64Decode("Zg=="), "f");
  EXPECT_EQ(*Base64Decode("Zm8="), "fo");
  EXPECT_EQ(*Base64Decode("Zm9vYmFy"), "foobar");
}

TEST(Base64Test, UrlSafeHasNoPaddingAndNoPlusOrSlash) {
  EXPECT_EQ(Base64UrlEncode("\xfb\xff\xbf"), "-_-_");
  EXPECT_EQ(Base64UrlEncode("f"), "Zg");
}

TEST(Base64Test, DecodeRefusesWhatIsNotBase64) {
  EXPECT_FALSE(Base64Decode("Zg=").has_value());
  EXPECT_FALSE(Base64Decode("Z!==").has_value());
}

}  // namespace
}  // namespace shardkeep::http
