#include <gtest/gtest.h>

#include <string>

#include "shardkeep/checkpoint_root.h"

namespace shardkeep {
namespace {

TEST(RootLayoutTest, StepFoldersAreZeroPaddedDigits) {
  EXPECT_EQ(StepFolderName(100, 9), "000000100");
  EXPECT_EQ(StepFolderName(0, 2), "00");
  EXPECT_EQ(StepFolderName(12345, 2), "12345");  // wider than the padding
  EXPECT_EQ(StepOfFolderName("000000100"), 100);
  EXPECT_EQ(StepOfFolderName("7"), 7);  // written with another width
  EXPECT_EQ(StepOfFolderName("9223372036854775807"), INT64_MAX);
  for (const char* name : {"", "1a", "-1", "+1", " 1", "0x10", "000000100.shardkeep-tmp",
                           "p3", "9223372036854775808", "١"}) {
    EXPECT_EQ(StepOfFolderName(name), std::nullopt) << name;
  }
}

TEST(RootLayoutTest, SliceFoldersNameTheirProcess) {
  EXPECT_EQ(SliceFolderName(3), "p3");
  EXPECT_EQ(SliceOfFolderName("p3"), 3);
  EXPECT_EQ(SliceOfFolderName("p003"), 3);
  for (const char* name : {"p", "3", "q3", "p-1", "p3x", "P3", "p99999999999"}) {
    EXPECT_EQ(SliceOfFolderName(name), std::nullopt) << name;
  }
}

TEST(RootLayoutTest, TheTemporaryFolderIsASuffixedSibling) {
  EXPECT_EQ(TemporaryFolderOf("/r/000000001"), "/r/000000001.shardkeep-tmp");
  EXPECT_EQ(TemporaryFolderOf("s3-prefix/07"), std::string("s3-prefix/07") + kTemporarySuffix);
}

}  // namespace
}  // namespace shardkeep
